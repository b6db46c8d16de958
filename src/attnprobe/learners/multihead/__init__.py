"""Multi-head attention learners (paper Sec. 7, App. C), one route table (:mod:`.routes`):

- ``subspaces`` — known mutually orthogonal head subspaces (Prop. C.2, :mod:`.subspaces`);
- ``orthogonal`` — unknown orthogonal subspaces from Hessians (App. C conjecture, :mod:`.hessian`);
- ``generic`` — overlapping heads (:mod:`.generic`);
- ``vector`` — whole output rows (K-vector answers, :mod:`.vector`);
- :func:`extract_multihead` takes one of them, or picks (``auto``).

Registers the learner ``multihead`` with its options (:mod:`.options`) and estimate (:mod:`.estimate`).
"""

from __future__ import annotations

from attnprobe.errors import ConfigError
from attnprobe.learners.core.registry import NO_BIAS, Capabilities, register
from attnprobe.learners.head import RANK
from attnprobe.learners.multihead.estimate import multihead_estimate
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.learners.multihead.hessian import extract_multihead_orthogonal
from attnprobe.learners.multihead.options import HEADS, MAX_HEADS, ROUTE, SUBSPACES
from attnprobe.learners.multihead.routes import FALLBACK_MAX_D, METHODS, ROUTES, extract_multihead
from attnprobe.learners.multihead.subspaces import extract_multihead_subspaces, load_subspaces


def _multihead(oracle, *, seed, progress, no_bias, heads, max_heads, subspaces, multihead_learner, rank):
    if subspaces is not None and multihead_learner != "auto":
        raise ConfigError(f"known subspaces are learned by the subspaces learner (Prop. C.2), "
                          f"not {multihead_learner!r}; "
                          "drop the 'multihead_learner' option", param="multihead_learner")
    bases = load_subspaces(subspaces, oracle.d) if subspaces is not None else None
    method = "subspaces" if bases is not None else multihead_learner
    return extract_multihead(oracle, heads=heads, max_heads=max_heads, subspaces=bases, bias=not no_bias,
                             method=method, rank=rank, seed=seed, progress=progress)


register("multihead", _multihead, recovers="multi_head", capabilities=Capabilities(vector_answers=True),
         help="Sec. 7, App. C: every head of a multi-head layer, up to permutation", estimate=multihead_estimate,
         options=[NO_BIAS, HEADS, MAX_HEADS, SUBSPACES, ROUTE, RANK])

__all__ = ["FALLBACK_MAX_D", "METHODS", "ROUTES", "extract_generic", "extract_multihead",
           "extract_multihead_orthogonal", "extract_multihead_subspaces", "load_subspaces"]
