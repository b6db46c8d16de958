"""Bounded inputs: read from the answers whether an attention target clips long input rows.

A length-1 query ``[s·x]`` of an attention layer answers ``s·xᵀv + c`` (``s·V x + c`` for a whole output row):
the softmax over one row is 1, so the answer is affine in ``s`` (DESIGN "The math in one screen"). A target that
clamps every row to norm ``R`` answers ``R·xᵀv + c`` for every ``s ≥ R``: the slope ``(f(s x) − c)/s`` falls like
``R/s``. :func:`clipping_norm` measures that slope on a geometric ladder of norms in one batch and estimates ``R``
from the largest rung; :func:`refuse_clipping` turns a detected clamp into one typed refusal.

How a learner respects bounded inputs: read ``oracle.max_input_norm`` (``None``: unbounded; the oracle refuses a
batch with a longer row with :class:`~attnprobe.errors.InputNormError` before asking), plan probes within it,
and before spending queries on probes of norm up to ``S`` call ``refuse_clipping(oracle, S)`` (a few queries)
so that a target that clips silently is refused in one line instead of yielding wrong parameters.

Not every length-1 answer that stops being affine is a clamp: a clamp answers the same past ``R`` (one more
rung at twice the norm says so), while a normalised output (``LayerNorm(X + attn)``, ALBERT's attention module)
or a layer that attends to a learned row besides the input (``nn.MultiheadAttention(add_bias_kv=True)``) keeps
changing. :func:`mismatch_cause` names which: a LayerNorm's rows all satisfy one linear equation (its zero mean
over the normalised outputs), so ``K + 8`` answers of a whole output row span only a hyperplane.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe._validation import check_float
from attnprobe.errors import InputNormError, ModelMismatchError

#: a slope that moved by more than this fraction (or by many roundings, whichever is larger) is a clamp; a clamp at
#: R moves the slope at norm s by 1 − R/s, so one rung of a ×10 ladder past R moves it by at least 0.9
DEVIATION = 1e-2
#: roundings of the answers a slope may move by before it counts (the answers' unit roundoff is ``oracle.eps``)
ROUNDINGS = 1e3


def ladder(up_to: float, start: float = 1.0, factor: float = 10.0) -> np.ndarray:
    """Norms ``start·factor^k`` below ``up_to``, then ``up_to`` itself (at least two rungs)."""
    up_to, start = float(up_to), min(float(start), float(up_to) / factor)
    steps = max(1, math.ceil(math.log(up_to / start) / math.log(factor) - 1e-9)) if up_to > start else 1
    rungs = start * factor ** np.arange(steps, dtype=float)
    return np.append(rungs[rungs < up_to], up_to)


def clipping_norm(oracle, up_to: float, *, seed: int = 0, start: float = 1.0, factor: float = 10.0
                  ) -> float | None:
    """The norm at which ``oracle`` clips its input rows, estimated from length-1 answers (``None`` when the
    answers stay affine in the norm up to ``up_to``).

    Asks ``len(ladder(up_to, start, factor)) + 1`` length-1 queries in one batch (the zero row gives ``c``),
    all along one random unit direction, charged to the phase ``"input bound"``. For a clamp of the row norm the
    estimate is exact up to rounding; for other clamps (e.g. per entry) it is the norm of the clamped row's
    effect along that direction. Only meaningful for attention targets (the length-1 answer is affine in its
    row; a ReLU network's is not). A clamp below ``start`` is reported as ≈ ``start``.
    """
    up_to = check_float(up_to, "up_to", min_value=0.0, strict_min=True)
    limit = oracle.max_input_norm
    if limit is not None:
        up_to = min(up_to, limit)
    norms = ladder(up_to, start, factor)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(oracle.d)
    x /= np.linalg.norm(x)
    X = np.concatenate([np.zeros((1, 1, oracle.d)), norms[:, None, None] * x[None, None, :]])
    with oracle.phase("input bound"):
        y = np.asarray(oracle(X), dtype=np.float64).reshape(len(X), -1)
    c, rise = y[0], y[1:] - y[0]
    slope = rise / norms[:, None]
    ref = np.linalg.norm(slope[0])
    if ref == 0:
        return None  # this direction carries no signal: nothing to read (a zero layer clips nothing visible)
    size = (np.linalg.norm(y[1:], axis=1) + np.linalg.norm(c)) / norms  # rounding of each slope, in units of eps
    noise = ROUNDINGS * oracle.eps * (size + size[0]) / ref
    moved = np.linalg.norm(slope - slope[0], axis=1) / ref
    clipped = moved > np.maximum(DEVIATION, noise)
    if not clipped.any():
        return None
    if limit is None or 2 * norms[-1] <= limit:  # a clamp answers the same past R: one more rung says whether
        with oracle.phase("input bound"):
            past = np.asarray(oracle(2 * norms[-1] * x[None, None, :]), dtype=np.float64).reshape(-1)
        if np.abs(past - y[-1]).max() > max(DEVIATION * np.linalg.norm(rise[-1]), noise[-1] * ref * norms[-1]):
            raise mismatch_cause(oracle, seed=seed)
    return float(np.linalg.norm(rise[-1]) / ref)


def mismatch_cause(oracle, *, seed: int = 0) -> ModelMismatchError:
    """The error naming why length-1 answers are not affine in their row although no clamp explains it: a
    normalised output when ``K + 8`` whole-row answers span a hyperplane (asked here, phase ``"input bound"``),
    else a row attended besides the input rows."""
    K = oracle.outputs or 1
    affordable = oracle.budget is None or oracle.queries + K + 8 <= oracle.budget
    if K > 1 and affordable:
        rng = np.random.default_rng([seed, 2])
        X = rng.standard_normal((K + 8, 2, oracle.d)) / np.sqrt(oracle.d)
        with oracle.phase("input bound"):
            Y = np.asarray(oracle(X), dtype=np.float64).reshape(K + 8, -1)
        S = np.linalg.svd(Y - Y.mean(axis=0), compute_uv=False)
        if S[0] > 0 and S[-1] < ROUNDINGS * oracle.eps * S[0] * np.sqrt(K):
            return ModelMismatchError(
                "the answers are normalised (every output row satisfies one fixed linear equation, as after a "
                "LayerNorm: the module returns LayerNorm(X + attention), not the attention sublayer); read the "
                "attention output before the norm (a Hugging Face folder's sublayer is read so)")
    return ModelMismatchError(
        "the length-1 answers are not affine in the row (a softmax over one row is 1, so an attention layer's are) "
        "and no input clamp explains it: the layer attends to something besides the input rows (a learned "
        "key/value row, e.g. nn.MultiheadAttention(add_bias_kv=True), or memory tokens), or its output is "
        "normalised; it is not a sum of softmax heads over the input")


def refuse_clipping(oracle, up_to: float, *, seed: int = 0) -> None:
    """Raise :class:`~attnprobe.errors.InputNormError` ("the oracle clips inputs at norm ≈ R") when the answers
    show that ``oracle`` clips rows shorter than ``up_to`` (the largest probe norm a learner plans)."""
    R = clipping_norm(oracle, up_to, seed=seed)
    if R is not None:
        raise InputNormError(f"the oracle clips inputs at norm ≈ {R:.3g} (its length-1 answers stop growing "
                             f"linearly there; probes up to norm {float(up_to):.3g} were planned); give that bound "
                             "as the 'max_input_norm' parameter and use a learner that keeps its probes within it",
                             limit=R)


def diagnose_clipping(oracle, *, seed: int = 0) -> InputNormError | None:
    """After a run failed (a refusal or a failed check): the error naming input clipping as the cause when the
    oracle clips rows shorter than the longest row this run sent (``oracle.max_input_norm_used``), else ``None``.

    Costs the few length-1 queries of :func:`clipping_norm` (none when no row was longer than 1); when they do not
    fit in the budget, or the oracle fails on them, nothing can be said and ``None`` is returned.
    """
    from attnprobe.errors import AttnprobeError

    used = float(getattr(oracle, "max_input_norm_used", 0.0))
    if used <= 1.0:
        return None
    try:
        oracle.require(len(ladder(used)) + 1, "reading whether the oracle clips its inputs")
        R = clipping_norm(oracle, used, seed=seed)
    except ModelMismatchError as exc:  # not a clamp: the cause read from the answers
        return exc
    except AttnprobeError:
        return None
    if R is None or R >= used:
        return None
    return InputNormError(f"the oracle clips inputs at norm ≈ {R:.3g} (its length-1 answers stop growing "
                          f"linearly there) but this run sent rows of norm up to {used:.3g}, so its answers were "
                          "not those of the assumed model; give that bound as the 'max_input_norm' parameter and "
                          "use a learner that keeps its probes within it", norm=used, limit=R)
