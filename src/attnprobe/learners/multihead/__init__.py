"""Multi-head attention learners (paper Sec. 7, App. C).

- :func:`extract_multihead_subspaces` — known mutually orthogonal head subspaces (Prop. C.2);
- :func:`extract_multihead_orthogonal` — unknown orthogonal subspaces from Hessians (App. C conjecture);
- :func:`extract_generic` — overlapping heads (:mod:`attnprobe.learners.multihead.generic`);
- :func:`extract_multihead` dispatches between them.
"""

from __future__ import annotations

from attnprobe.errors import AttnprobeError, ConfigError, RecoveryError, SaturationError
from attnprobe.learners.multihead import generic
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.learners.multihead.hessian import extract_multihead_orthogonal
from attnprobe.learners.multihead.subspaces import extract_multihead_subspaces

METHODS = ("auto", "subspaces", "orthogonal", "generic")


def extract_multihead(oracle, *, heads: int | None = None, max_heads: int | None = None, subspaces=None,
                      bias: bool = True, method: str = "auto", rank: int | None = None, seed: int = 0,
                      check: bool = True, progress=None):
    """Recover every head of a multi-head layer ``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ(X v_h) + c``.

    ``method``: ``subspaces`` (needs ``subspaces``: known orthogonal head subspaces, Prop. C.2),
    ``orthogonal`` (unknown orthogonal subspaces, App. C), ``generic`` (overlapping heads) or ``auto``
    (``subspaces`` when they are given, else ``generic``).
    ``heads`` fixes H; ``max_heads`` bounds it when H is detected; ``rank`` (the head dimension, generic learner
    only) lets each isolated head be sketched with ``≈ 2d·rank`` queries instead of detecting its rank. Returns an Extraction whose model is a
    :class:`~attnprobe.models.multihead.MultiHeadAttention` (heads are defined up to permutation).
    """
    if method not in METHODS:
        raise ConfigError(f"unknown multi-head method {method!r}; choose one of {', '.join(METHODS)}")
    if heads is not None and heads < 1:
        raise ConfigError(f"heads must be at least 1; got {heads}")
    if heads is not None and max_heads is not None:
        raise ConfigError("give either heads (H known) or max_heads (an upper bound), not both")
    fallback = method == "auto" and subspaces is None
    if method == "auto":
        method = "subspaces" if subspaces is not None else "generic"
    if method == "subspaces" or subspaces is not None:
        if subspaces is None:
            raise ConfigError("method 'subspaces' needs the head subspaces (an (H, d, d_h) array of bases)")
        if method != "subspaces":
            raise ConfigError(f"subspaces were given, so method {method!r} would ignore them; use 'subspaces'")
        if heads is not None and len(subspaces) != heads:
            raise ConfigError(f"heads={heads} but {len(subspaces)} subspaces were given")
        return extract_multihead_subspaces(oracle, subspaces, bias=bias, seed=seed, check=check,
                                           progress=progress)
    if rank is not None and method != "generic":
        raise ConfigError(f"rank is used by the generic multi-head learner only; got method {method!r}", param="rank")
    if method == "orthogonal":
        res = extract_multihead_orthogonal(oracle, heads=heads, bias=bias, seed=seed, check=check,
                                           progress=progress)
        if max_heads is not None and res.model.H > max_heads:
            res.notes.append(f"found {res.model.H} heads, more than max_heads={max_heads}")
        return res
    before = oracle.queries
    try:
        return generic.extract_generic(oracle, heads=heads, max_heads=max_heads, rank=rank, bias=bias, seed=seed,
                                       check=check, progress=progress)
    except (RecoveryError, SaturationError) as exc:
        if not fallback or rank is not None or getattr(exc, "precision_named", False):
            raise
        return _orthogonal_after(exc, oracle, oracle.queries - before, heads=heads, max_heads=max_heads, bias=bias,
                                 seed=seed, check=check, progress=progress)


def _orthogonal_after(exc, oracle, spent, *, max_heads, **kw):
    """``auto``: the generic learner failed after ``spent`` queries, so try heads in orthogonal subspaces (App. C);
    its result (counting those queries as phase ``generic``) is kept only when its check passes, otherwise the
    generic learner's error stands."""
    try:
        res = extract_multihead_orthogonal(oracle, **kw)
    except AttnprobeError:
        raise exc from None
    if (res.check is not None and not res.check.passed) or (max_heads is not None and res.model.H > max_heads):
        raise exc
    res.queries += spent
    res.queries_by_phase = {"generic": spent, **res.queries_by_phase}
    res.notes.append(f"the generic multi-head learner failed after {spent} queries ({type(exc).__name__}: {exc}); "
                     "the learner for heads in orthogonal subspaces (App. C) recovered the layer and its check passed")
    return res


__all__ = ["METHODS", "extract_generic", "extract_multihead", "extract_multihead_orthogonal", "extract_multihead_subspaces"]
