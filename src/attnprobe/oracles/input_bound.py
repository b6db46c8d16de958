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

Not every length-1 answer that stops being affine is a clamp (:func:`mismatch_cause`, two more queries): a clamp
answers alike at twice the top rung, while a normalised output (``LayerNorm(X + attn)``, ALBERT's attention
module) keeps moving and its whole output rows all satisfy one linear equation (the norm's zero mean: ``K + 8``
answers span only a hyperplane), and a layer that attends to a learned row besides the input
(``nn.MultiheadAttention(add_bias_kv=True)``) keeps growing with the row.
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
    """The norm at which ``oracle`` clips its input rows (:func:`read_clipping`), or ``None``."""
    return read_clipping(oracle, up_to, seed=seed, start=start, factor=factor)[0]


def read_clipping(oracle, up_to: float, *, seed: int = 0, start: float = 1.0, factor: float = 10.0
                  ) -> tuple[float | None, float | None, float | None]:
    """The norm at which ``oracle`` clips its input rows, estimated from length-1 answers (``None`` when the
    answers stay affine in the norm up to ``up_to``).

    Asks ``len(ladder(up_to, start, factor)) + 1`` length-1 queries in one batch (the zero row gives ``c``),
    all along one random unit direction, charged to the phase ``"input bound"``. For a clamp of the row norm the
    estimate is exact up to rounding; for other clamps (e.g. per entry) it is the norm of the clamped row's
    effect along that direction. Only meaningful for attention targets (the length-1 answer is affine in its
    row; a ReLU network's is not). A clamp below ``start`` is reported as ≈ ``start``.

    Returns ``(R, affine, moved)``: the estimate (None: no clamp seen), the largest rung whose answer was still
    affine (None: not even the first) and the first rung where it was not (None: no clamp seen).
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
        return None, None, None  # this direction carries no signal: nothing to read (a zero layer clips nothing)
    size = (np.linalg.norm(y[1:], axis=1) + np.linalg.norm(c)) / norms  # rounding of each slope, in units of eps
    noise = ROUNDINGS * oracle.eps * (size + size[0]) / ref
    moved = np.linalg.norm(slope - slope[0], axis=1) / ref
    clipped = moved > np.maximum(DEVIATION, noise)
    if not clipped.any():
        return None, None, None
    first = int(np.argmax(clipped))
    affine = float(norms[first - 1]) if first > 0 else None
    return float(np.linalg.norm(rise[-1]) / ref), affine, float(norms[first])


def round_down(x: float, digits: int = 3, slack: float = 1e-6) -> float:
    """``x`` to ``digits`` significant digits, not above ``x`` by more than its relative ``slack`` (an estimate
    read from rounded answers; 2.9999999 is 3): a bound printed for the user to give back."""
    if not (x > 0 and math.isfinite(x)):
        return x
    top = x * (1 + slack)
    scale = 10.0 ** (math.floor(math.log10(top)) - digits + 1)
    steps = math.floor(top / scale)
    while steps > 0 and float(f"{steps * scale:.{digits}g}") > top:
        steps -= 1
    return float(f"{steps * scale:.{digits}g}")


def _bound_to_give(oracle, R: float, affine: float | None, moved: float, seed: int) -> tuple[float, bool]:
    """The bound to suggest and whether the clamp is a clean bound on the row norm: the estimate ``R`` when the
    answers are affine up to it (one more ladder, a few queries, reads that), else the last rung seen affine (a
    clamp of another kind: per entry, smooth), else a tenth of the first rung; rounded down."""
    from attnprobe.errors import AttnprobeError

    if R < moved:
        try:
            clean = read_clipping(oracle, round_down(R), seed=seed)[0] is None
        except AttnprobeError:  # the budget or the oracle gave out: the estimate stands unverified
            clean = True
        if clean:
            return round_down(R), True
    return round_down(affine if affine is not None else moved / 10), False


def _where(bound: float, clean: bool, affine: float | None, moved: float) -> str:
    if clean:
        return f"at norm ≈ {bound:.3g} (its length-1 answers stop growing linearly there"
    return (f"below norm {moved:.3g} (its length-1 answers grow linearly up to norm {affine or 0:.3g} and not "
            "beyond: not a clean bound on the row norm")


#: length-1 probes of the additivity test: pairs of rows of this norm (well inside any sensible input bound)
ADDITIVE_PAIRS, ADDITIVE_NORM = 4, 0.3


def _normalised(oracle, seed: int) -> ModelMismatchError | None:
    """``K + 8`` whole-row answers on one hyperplane (a LayerNorm's zero mean): the error naming it, else None."""
    K = oracle.outputs or 1
    if K < 2 or not (oracle.budget is None or oracle.queries + K + 8 <= oracle.budget):
        return None
    X = np.random.default_rng([seed, 2]).standard_normal((K + 8, 2, oracle.d)) / np.sqrt(oracle.d)
    with oracle.phase("input bound"):
        Y = np.asarray(oracle(X), dtype=np.float64).reshape(K + 8, -1)
    S = np.linalg.svd(Y - Y.mean(axis=0), compute_uv=False)
    if S[0] > 0 and S[-1] < ROUNDINGS * oracle.eps * S[0] * np.sqrt(K):
        return ModelMismatchError(
            "the answers are normalised (every output row satisfies one fixed linear equation, as after a "
            "LayerNorm: the module returns LayerNorm(X + attention), not the attention sublayer); read the "
            "attention output before the norm (a Hugging Face folder's sublayer is read so)")
    return None


#: the cause named when length-1 answers are not affine and nothing else explains it
EXTRA_ROW = ("the length-1 answers are not affine in the row (a softmax over one row is 1, so an attention layer's "
             "are), {how}: the layer attends to something besides the input rows (a learned key/value row, e.g. "
             "nn.MultiheadAttention(add_bias_kv=True), or memory tokens); it is not a sum of softmax heads over the "
             "input")


def not_affine_cause(oracle, *, seed: int = 0) -> ModelMismatchError | None:
    """The error naming why the layer is not a sum of softmax heads over its input, when its length-1 answers are
    not affine even for short rows: ``f([a + b]) − f([a]) − f([b]) + f([0])`` must vanish for an attention layer
    (its length-1 answer is ``V x + c``). Asks ``4·ADDITIVE_PAIRS + 1`` sequences (the sums twice: answers that
change when asked again are noise, not structure) of norm ≤ 2·ADDITIVE_NORM (and
    :func:`_normalised`'s when they are not affine); ``None`` when they are, or the budget does not allow it."""
    n = 4 * ADDITIVE_PAIRS + 1
    noise = oracle.noise
    if noise.membership or (oracle.budget is not None and oracle.queries + n > oracle.budget):
        return None
    rng = np.random.default_rng([seed, 3])
    A, B = rng.standard_normal((2, ADDITIVE_PAIRS, oracle.d))
    A *= ADDITIVE_NORM / np.linalg.norm(A, axis=1, keepdims=True)
    B *= ADDITIVE_NORM / np.linalg.norm(B, axis=1, keepdims=True)
    X = np.concatenate([A + B, A, B, np.zeros((1, oracle.d)), A + B])[:, None, :]  # A + B asked twice
    if oracle.max_input_norm is not None and 2 * ADDITIVE_NORM > oracle.max_input_norm:
        X *= 0.99 * oracle.max_input_norm / (2 * ADDITIVE_NORM)
    with oracle.phase("input bound"):
        Y = np.asarray(oracle(X), dtype=np.float64).reshape(n, -1)
    P = ADDITIVE_PAIRS
    zero = Y[3 * P]
    gap = Y[:P] - Y[P:2 * P] - Y[2 * P:3 * P] + zero
    size = np.abs(Y[:3 * P] - zero).max()
    floor = ROUNDINGS * oracle.eps * np.abs(Y).max() + 4 * (noise.tolerance + 5 * noise.sigma)
    if np.abs(Y[3 * P + 1:] - Y[:P]).max() > floor:
        return None  # the same rows answered differently: noise, not structure
    if size == 0 or np.abs(gap).max() <= max(DEVIATION * 1e-3 * size, floor):
        return None
    return _normalised(oracle, seed) or ModelMismatchError(EXTRA_ROW.format(
        how=f"not even for rows of norm {ADDITIVE_NORM:g} (f([a+b]) − f([a]) − f([b]) + f([0]) is "
            f"{np.abs(gap).max() / size:.1e} of the answers)"))


def mismatch_cause(oracle, up_to: float, *, seed: int = 0) -> ModelMismatchError | None:
    """When length-1 answers stopped being affine below ``up_to``: the error naming a cause that is not a clamp
    (a normalised output, a row attended besides the input), or ``None`` (a clamp, or nothing to tell them apart).

    Asks the top rung of :func:`read_clipping`'s direction and twice it (2 queries), and for whole output rows
    that keep moving ``K + 8`` length-2 sequences (phase ``"input bound"``)."""
    limit = oracle.max_input_norm
    top = min(float(up_to), limit) if limit is not None else float(up_to)
    if limit is not None and 2 * top > limit:
        return None  # no room past the top rung: nothing to tell a clamp from the rest
    rng = np.random.default_rng(seed)  # read_clipping's direction
    x = rng.standard_normal(oracle.d)
    x /= np.linalg.norm(x)
    X = np.stack([np.zeros(oracle.d), top * x, 2 * top * x])[:, None, :]
    with oracle.phase("input bound"):
        c, y1, y2 = np.asarray(oracle(X), dtype=np.float64).reshape(3, -1)
    scale, rounding = np.abs(y1 - c).max(), ROUNDINGS * oracle.eps * (np.abs(y2 - c).max() + np.abs(c).max())
    if np.abs(y2 - y1).max() <= DEVIATION * scale + rounding:
        return None  # flat past the top rung: a clamp
    if np.abs((y2 - c) - 2 * (y1 - c)).max() <= DEVIATION * scale + rounding:
        return None  # affine along this line after all: nothing to name
    normalised = _normalised(oracle, seed)
    if normalised is not None:
        return normalised
    if np.linalg.norm(y2 - c) >= 1.5 * np.linalg.norm(y1 - c):  # still growing with the row: no clamp at all
        return ModelMismatchError(EXTRA_ROW.format(how="yet keep growing with it, so no input clamp explains it"))
    return None


def refuse_clipping(oracle, up_to: float, *, seed: int = 0) -> None:
    """Raise :class:`~attnprobe.errors.InputNormError` ("the oracle clips inputs at norm ≈ R") when the answers
    show that ``oracle`` clips rows shorter than ``up_to`` (the largest probe norm a learner plans)."""
    R, affine, moved = read_clipping(oracle, up_to, seed=seed)
    if R is not None:
        cause = mismatch_cause(oracle, up_to, seed=seed)
        if cause is not None:
            raise cause
        bound, clean = _bound_to_give(oracle, R, affine, moved, seed)
        raise InputNormError(f"the oracle clips inputs {_where(bound, clean, affine, moved)}; probes up to norm "
                             f"{float(up_to):.3g} were "
                             f"planned); give at most {bound:.3g} as the 'max_input_norm' parameter and use a learner "
                             "that keeps its probes within it", limit=bound)


def diagnose_clipping(oracle, *, seed: int = 0) -> InputNormError | ModelMismatchError | None:
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
        R, affine, moved = read_clipping(oracle, used, seed=seed)
        cause = None if R is None or R >= used else mismatch_cause(oracle, used, seed=seed)
    except AttnprobeError:
        return None
    if cause is not None:  # not a clamp: the cause read from the answers
        return cause
    if R is None or R >= used:  # no clamp below the rows sent: the failure is not blamed on clipping
        return None
    bound, clean = _bound_to_give(oracle, R, affine, moved, seed)
    return InputNormError(f"the oracle clips inputs {_where(bound, clean, affine, moved)}) but this run sent rows "
                          f"of norm up to {used:.3g}, so its answers were not those of the assumed model; give at most "
                          f"{bound:.3g} as the 'max_input_norm' parameter and use a learner that keeps its probes "
                          "within it", norm=used, limit=bound)
