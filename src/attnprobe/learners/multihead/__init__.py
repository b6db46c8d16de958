"""Multi-head attention learners (paper Sec. 7, App. C).

- :func:`extract_multihead_subspaces` — known mutually orthogonal head subspaces (Prop. C.2);
- :func:`extract_multihead_orthogonal` — unknown orthogonal subspaces from Hessians (App. C conjecture);
- :func:`extract_generic` — overlapping heads (:mod:`attnprobe.learners.multihead.generic`);
- ``vector`` — whole output rows (K-vector answers, :mod:`attnprobe.learners.multihead.vector`);
- :func:`extract_multihead` dispatches between them.
"""

from __future__ import annotations

from attnprobe.errors import AttnprobeError, ConfigError, RecoveryError, SaturationError, UnidentifiableError
from attnprobe.learners.core.registry import NO_BIAS, Capabilities, Option, register
from attnprobe.learners.head import RANK
from attnprobe.learners.multihead import generic
from attnprobe.learners.multihead.estimate import multihead_estimate
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.learners.multihead.hessian import extract_multihead_orthogonal
from attnprobe.learners.multihead.subspaces import extract_multihead_subspaces, load_subspaces

METHODS = ("auto", "subspaces", "orthogonal", "generic", "vector")
#: widest layer ``auto`` hands to the orthogonal learner when the generic one fails (docs/multihead.md: measured up
#: to d = 64; at MiniLM's d = 384 its Hessians would cost ~2.4M queries)
FALLBACK_MAX_D = 64


def extract_multihead(oracle, *, heads: int | None = None, max_heads: int | None = None, subspaces=None,
                      bias: bool = True, method: str = "auto", rank: int | None = None, seed: int = 0,
                      check: bool = True, progress=None):
    """Recover every head of a multi-head layer ``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ(X v_h) + c``.

    ``method``: ``subspaces`` (needs ``subspaces``: known orthogonal head subspaces, Prop. C.2),
    ``orthogonal`` (unknown orthogonal subspaces, App. C), ``generic`` (overlapping heads), ``vector`` (whole
    output rows: K ≥ 2 outputs per sequence) or ``auto`` (``subspaces`` when they are given, else ``vector`` when
    the oracle answers K ≥ 2 outputs, else ``generic``, falling back to ``orthogonal`` when it fails).
    ``heads`` fixes H; ``max_heads`` bounds it when H is detected; ``rank`` (the head dimension, generic learner
    only) lets each isolated head be sketched with ``≈ 2d·rank`` queries instead of detecting its rank. Returns an
    Extraction whose model is a
    :class:`~attnprobe.models.multihead.MultiHeadAttention` (heads are defined up to permutation).
    """
    if method not in METHODS:
        raise ConfigError(f"unknown multi-head method {method!r}; choose one of {', '.join(METHODS)}")
    if heads is not None and heads < 1:
        raise ConfigError(f"heads must be at least 1; got {heads}")
    if heads is not None and max_heads is not None:
        raise ConfigError("give either heads (H known) or max_heads (an upper bound), not both")
    if method in ("auto", "vector") and subspaces is None and getattr(oracle, "outputs", None) is None:
        _require_least_plan(oracle, method, check)  # the probe is part of the plan: refused before it when short
        probe = _probe_outputs(oracle)  # one length-1 query: scalar or vector answers?
        res = extract_multihead(oracle, heads=heads, max_heads=max_heads, bias=bias, method=method, rank=rank,
                                seed=seed, check=check, progress=progress)
        res.queries += probe
        res.queries_by_phase["values"] = res.queries_by_phase.get("values", 0) + probe
        if "planned" in res.details:
            res.details["planned"] += probe
        return res
    if method in ("auto", "vector") and subspaces is None and oracle.outputs >= 2:
        from attnprobe.learners.multihead.vector import extract_vector

        if rank is not None:
            raise ConfigError("rank is not used by the vector-answer multi-head learner (it needs no head "
                              "dimension)", param="rank")
        res = extract_vector(oracle, heads=heads, seed=seed, check=check, progress=progress)
        if max_heads is not None and res.model.H > max_heads:
            raise UnidentifiableError(f"found {res.model.H} heads, more than max_heads = {max_heads}; raise max_heads")
        return res
    if method == "vector":
        raise ConfigError("method 'vector' needs an oracle answering K ≥ 2 outputs per sequence (a whole output "
                          "row); this one answers one number", param="method")
    # the orthogonal learner's Hessians cost ~d³/(2H) queries: a fallback only where it was measured (d ≤ 64)
    fallback = method == "auto" and subspaces is None and oracle.d <= FALLBACK_MAX_D
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
        if not fallback or rank is not None or getattr(exc, "cause_named", False):
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


def _require_least_plan(oracle, method: str, check: bool) -> None:
    """Before the one query that tells scalar from vector answers: refuse when the budget cannot hold that query,
    the first stage of the cheaper of the learners it may lead to, and the functional check (every learner's
    plan starts this way, so a budget below it is refused having asked nothing)."""
    from attnprobe.learners.core.check import check_queries
    from attnprobe.learners.multihead.vector import planned_values

    d = oracle.d
    first = planned_values(d) if method == "vector" else min(planned_values(d), generic.planned_values(d))
    least = 1 + first + (check_queries() if check else 0)
    oracle.require(least, f"multi-head extraction at d={d} needs at least {least} queries (one to tell scalar from "
                          "vector answers, the values stage and the functional check);")


def _probe_outputs(oracle) -> int:
    """Ask one length-1 query so the oracle knows how many outputs it answers; returns the queries asked (the
    caller adds them to the learner's result, whose run starts after them)."""
    import numpy as np

    before = oracle.queries
    with oracle.phase("values"):
        oracle(np.zeros((1, 1, oracle.d)))
    return oracle.queries - before


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
         options=[NO_BIAS, Option("heads", int, "number of heads (detected when omitted)", low=1, metavar="H"),
                  Option("max_heads", int, "upper bound on the number of heads", low=1, metavar="H0"),
                  Option("subspaces", str, "known mutually orthogonal head subspaces: an (H, d, d_h) array "
                         "'subspaces' (Prop. C.2)", metavar="FILE.npz", input_file=True),
                  Option("multihead_learner", str, "orthogonal: heads in unknown orthogonal subspaces (App. C "
                         "Hessians); generic: overlapping heads; auto (default): generic, then orthogonal when generic "
                         "fails; vector: whole output rows (picked by auto when the answers are K-vectors)",
                         default="auto",
                         choices=("auto", "orthogonal", "generic", "vector")),
                  RANK])


__all__ = ["METHODS", "load_subspaces", "extract_generic", "extract_multihead", "extract_multihead_orthogonal",
           "extract_multihead_subspaces"]
