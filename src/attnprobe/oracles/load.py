"""Build oracles from what a user points at: a ``MODULE:ATTR`` callable or a saved model file."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import weakref
from pathlib import Path

from attnprobe.errors import ConfigError, OracleError
from attnprobe.models.io import load_model
from attnprobe.oracles.base import Oracle


#: the oracle modules this process loaded from a working directory (only those are ever replaced)
_FROM_CWD: weakref.WeakSet = weakref.WeakSet()


def import_from_cwd(module_name: str):
    """Import ``module_name``, taking its top-level module from the current directory when it is there, without
    letting the current directory shadow anything else: it is appended to ``sys.path`` (so the module's own
    sibling imports still work), never put first, so a stray ``tqdm.py`` or ``numpy.py`` there is not run."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    top = module_name.split(".")[0]
    found = importlib.machinery.PathFinder.find_spec(top, [cwd])
    if found is not None and found.loader is not None:
        loaded = sys.modules.get(top)
        stale = loaded is not None and loaded in _FROM_CWD and getattr(loaded, "__file__", None) != found.origin
        if loaded is None or stale:  # not imported yet, or an oracle module of the same name from another folder
            for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
                del sys.modules[name]
            module = importlib.util.module_from_spec(found)
            sys.modules[top] = module
            _FROM_CWD.add(module)
            try:
                found.loader.exec_module(module)
            except BaseException:
                del sys.modules[top]
                raise
    return importlib.import_module(module_name)


def load_callable(spec: str):
    """Import ``MODULE:ATTR`` (the current directory is importable); ATTR may be dotted."""
    if ":" not in spec:
        raise ConfigError(f"--oracle must look like MODULE:ATTR (e.g. victims:head); got {spec!r}", param="oracle")
    module_name, attr = spec.split(":", 1)
    try:
        obj = import_from_cwd(module_name)
    except Exception as exc:
        raise OracleError(f"cannot import module {module_name!r} for --oracle {spec}: "
                          f"{type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise OracleError(f"module {module_name!r} has no attribute {attr!r} (from --oracle {spec})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise OracleError(f"{spec} is a {type(obj).__name__}, not a callable; it must map (B, N, d) -> (B,)")
    return obj


def oracle_from_spec(spec: str, d: int | None, **kwargs) -> Oracle:
    fn = load_callable(spec)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(fn, torch.nn.Module):  # a bare module: answer through the adapter
        from attnprobe.oracles.torch_adapter import oracle_from_torch

        return oracle_from_torch(fn, d, name=spec, **kwargs)
    d = d if d is not None else getattr(fn, "d", None)
    if d is None:
        raise ConfigError(f"give the width with --d: {spec} does not say its d", param="d")
    return Oracle(fn, int(d), name=spec, **kwargs)


def oracle_from_file(path: str | Path, dtype: str = "float64", **kwargs) -> Oracle:
    """An oracle answering with a saved model computed in ``dtype`` (the model declares it as its answers'
    precision: :func:`~attnprobe.oracles.base.answer_precision`)."""
    model = load_model(path, dtype=dtype)
    return Oracle(model, model.d, name=Path(path).name, **kwargs)
