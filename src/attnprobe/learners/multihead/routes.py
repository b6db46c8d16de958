"""The one route table of the multi-head learner: which learner recovers the layer.

``subspaces`` (known orthogonal head subspaces, Prop. C.2), ``orthogonal`` (unknown orthogonal subspaces, App. C
Hessians), ``generic`` (overlapping heads), ``vector`` (whole output rows: K ≥ 2 outputs per sequence), or
``auto``: ``subspaces`` when they are given, else ``vector`` when the oracle answers K ≥ 2 outputs, else
``generic``, falling back to ``orthogonal`` when it fails at a width where that was measured. When the oracle has
not said how many outputs it answers, one length-1 query asks; it is charged to the extraction (phase ``values``)
through the chosen learner's run (``asked_before``), never added to a finished result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from attnprobe.errors import AttnprobeError, ConfigError, RecoveryError, SaturationError, UnidentifiableError
from attnprobe.learners.core.check import check_queries
from attnprobe.learners.head import RANK
from attnprobe.learners.multihead import generic, vector
from attnprobe.learners.multihead.hessian import extract_multihead_orthogonal
from attnprobe.learners.multihead.options import HEADS, MAX_HEADS
from attnprobe.learners.multihead.subspaces import extract_multihead_subspaces

#: widest layer ``auto`` hands to the orthogonal learner when the generic one fails (docs/multihead.md: measured up
#: to d = 64; at MiniLM's d = 384 its Hessians would cost ~2.4M queries)
FALLBACK_MAX_D = 64


@dataclass(frozen=True)
class Request:
    """What the caller asked of the multi-head learner (validated once, by the declared options)."""

    heads: int | None
    max_heads: int | None
    subspaces: list | None
    bias: bool
    rank: int | None
    seed: int
    check: bool
    progress: Callable | None
    asked_before: dict = field(default_factory=dict)


def _subspaces(oracle, r: Request):
    if r.heads is not None and len(r.subspaces) != r.heads:
        raise ConfigError(f"heads={r.heads} but {len(r.subspaces)} subspaces were given", param="heads")
    return extract_multihead_subspaces(oracle, r.subspaces, bias=r.bias, seed=r.seed, check=r.check,
                                       progress=r.progress)


def _orthogonal(oracle, r: Request, asked_before=None, notes=()):
    return extract_multihead_orthogonal(oracle, heads=r.heads, max_heads=r.max_heads, bias=r.bias, seed=r.seed,
                                        check=r.check, progress=r.progress,
                                        asked_before=r.asked_before if asked_before is None else asked_before,
                                        notes=notes)


def _generic(oracle, r: Request):
    return generic.extract_generic(oracle, heads=r.heads, max_heads=r.max_heads, rank=r.rank, bias=r.bias,
                                   seed=r.seed, check=r.check, progress=r.progress, asked_before=r.asked_before)


def _vector(oracle, r: Request):
    res = vector.extract_vector(oracle, heads=r.heads, seed=r.seed, check=r.check, progress=r.progress,
                                asked_before=r.asked_before)
    if r.max_heads is not None and res.model.H > r.max_heads:
        raise UnidentifiableError(f"found {res.model.H} heads, more than max_heads = {r.max_heads}; raise max_heads")
    return res


def _generic_then_orthogonal(oracle, r: Request):
    """``auto``: the generic learner, and when it fails, heads in orthogonal subspaces (App. C). That result,
    counting the generic learner's queries as phase ``generic``, is kept only when its check passes (and it finds
    at most ``max_heads``); otherwise the generic learner's error stands."""
    before = oracle.queries
    try:
        return _generic(oracle, r)
    except (RecoveryError, SaturationError) as exc:
        if getattr(exc, "cause_named", False):
            raise
        spent = oracle.queries - before
        said = (f"the generic multi-head learner failed after {spent} queries ({type(exc).__name__}: {exc}); the "
                "learner for heads in orthogonal subspaces (App. C) recovered the layer and its check passed")
        try:
            res = _orthogonal(oracle, r, asked_before={"generic": spent, **r.asked_before}, notes=(said,))
        except AttnprobeError:
            raise exc from None
        if (res.check is not None and not res.check.passed) or (r.max_heads is not None and res.model.H > r.max_heads):
            raise exc from None
        return res


#: route name -> the learner that takes it
ROUTES = {"subspaces": _subspaces, "orthogonal": _orthogonal, "generic": _generic, "vector": _vector}
METHODS = ("auto", *ROUTES)


def route(oracle, method: str, subspaces, rank) -> str:
    """The route ``method`` takes on ``oracle`` (whose outputs are known, unless the route needs no answer)."""
    if subspaces is not None:
        if method not in ("auto", "subspaces"):
            raise ConfigError(f"subspaces were given, so method {method!r} would ignore them; use 'subspaces'",
                              param="method")
        return "subspaces"
    if method == "subspaces":
        raise ConfigError("method 'subspaces' needs the head subspaces (an (H, d, d_h) array of bases)",
                          param="subspaces")
    vector_answers = method in ("auto", "vector") and oracle.outputs >= 2
    if method == "vector" and not vector_answers:
        raise ConfigError("method 'vector' needs an oracle answering K ≥ 2 outputs per sequence (a whole output "
                          "row); this one answers one number", param="method")
    if vector_answers:
        if rank is not None:
            raise ConfigError("rank is not used by the vector-answer multi-head learner (it needs no head "
                              "dimension)", param="rank")
        return "vector"
    chosen = "generic" if method == "auto" else method
    if rank is not None and chosen != "generic":
        raise ConfigError(f"rank is used by the generic multi-head learner only; got method {method!r}", param="rank")
    return chosen


def extract_multihead(oracle, *, heads: int | None = None, max_heads: int | None = None, subspaces=None,
                      bias: bool = True, method: str = "auto", rank: int | None = None, seed: int = 0,
                      check: bool = True, progress=None):
    """Recover every head of a multi-head layer ``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ(X v_h) + c``.

    ``method``: a route of :data:`ROUTES` or ``auto`` (module docstring). ``heads`` fixes H; ``max_heads`` bounds
    it when H is detected; ``rank`` (the head dimension, generic learner only) lets each isolated head be sketched
    with ``≈ 2d·rank`` queries instead of detecting its rank. Returns an Extraction whose model is a
    :class:`~attnprobe.models.multihead.MultiHeadAttention` (heads are defined up to permutation).
    """
    if method not in METHODS:
        raise ConfigError(f"unknown multi-head method {method!r}; choose one of {', '.join(METHODS)}", param="method")
    heads, max_heads, rank = HEADS.validate(heads), MAX_HEADS.validate(max_heads), RANK.validate(rank)
    if heads is not None and max_heads is not None:
        raise ConfigError("give either heads (H known) or max_heads (an upper bound), not both", param="max_heads")
    asked = {}
    if method in ("auto", "vector") and subspaces is None and oracle.outputs is None:
        _require_least_plan(oracle, method, check)  # the probe is part of the plan: refused before it when short
        asked = {"values": _probe_outputs(oracle)}  # one length-1 query: scalar or vector answers?
    chosen = route(oracle, method, subspaces, rank)
    if chosen == "vector":  # whole rows in float64 bits: is the kernel float64 inside too (a float32 softmax)?
        rounding = oracle.read_kernel_rounding()
        if rounding:
            asked["precision"] = asked.get("precision", 0) + rounding
    r = Request(heads, max_heads, subspaces, bias, rank, seed, check, progress, asked)
    # the orthogonal learner's Hessians cost ~d³/(2H) queries: a fallback only where it was measured (d ≤ 64)
    if method == "auto" and chosen == "generic" and oracle.d <= FALLBACK_MAX_D and rank is None:
        return _generic_then_orthogonal(oracle, r)
    return ROUTES[chosen](oracle, r)


def _require_least_plan(oracle, method: str, check: bool) -> None:
    """Before the one query that tells scalar from vector answers: refuse when the budget cannot hold that query,
    the first stage of the cheaper of the learners it may lead to, and the functional check (every learner's
    plan starts this way, so a budget below it is refused having asked nothing)."""
    d = oracle.d
    first = vector.planned_values(d) if method == "vector" else min(vector.planned_values(d),
                                                                    generic.planned_values(d))
    least = 1 + first + (check_queries() if check else 0)
    oracle.require(least, f"multi-head extraction at d={d} needs at least {least} queries (one to tell scalar from "
                          "vector answers, the values stage and the functional check);")


def _probe_outputs(oracle) -> int:
    """Ask one length-1 query so the oracle knows how many outputs it answers; returns the queries asked."""
    before = oracle.queries
    with oracle.phase("values"):
        oracle(np.zeros((1, 1, oracle.d)))
    return oracle.queries - before
