"""attnprobe: recover the weights of attention models from black-box queries.

Implements *Provably Learning Attention with Queries* (Bhattamishra, Shah, Hahn, Kanade).

The public names are imported on first use (PEP 562 ``__getattr__``): ``import attnprobe`` itself loads
nothing heavy, so the command line installs its Ctrl-C handling before numpy, scipy, torch or cvxpy load.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: each public name and the module it lives in
_PUBLIC = {"AttentionHead": "attnprobe.models", "AttnprobeError": "attnprobe.errors",
           "Extraction": "attnprobe.learners", "Oracle": "attnprobe.oracles", "extract_exact": "attnprobe.learners",
           "load_model": "attnprobe.models", "save_model": "attnprobe.models"}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attnprobe' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
