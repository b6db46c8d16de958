"""Probe scaling for the length-2 queries of Thm 4.1: calibration from the oracle's own answers, per-block
steering to a target logit, and block measurement with per-probe retries.

The logit of ``[(s·a + b); b]`` is ``s·aᵀ(W b + u)``: linear in the probe scale ``s``. Each equation may carry
its own scale, so a probe whose weight saturates (or whose logit drowns in rounding) can be asked again alone.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import numpy as np

from attnprobe.errors import NonFiniteAnswerError, RecoveryError, SaturationError
from attnprobe.models.precision import finfo
from attnprobe.learners.head.sigmoid import (SHARED_QUERY_MEMORY, QueryMemory, answer_logits, grid_queries,
                                             measure_logits)

#: RMS attention logit the orthogonal probes aim for: near ±1.5 the sigmoid loses least precision.
TARGET_LOGIT = 1.5
#: share of the unknowns that calibration may spend on queries that are not also equations
CALIBRATION_SHARE = 0.02
#: how often a saturated or noisy probe is asked again, each time at a quarter of its scale
MAX_RETRIES = 6
#: a probe whose logit noise exceeds this multiple of its block's median is re-measured at a smaller scale
NOISY_FACTOR = 30.0
#: ...unless its noise is below this fraction of the RMS logit anyway (float64 answers)
NEGLIGIBLE_NOISE = 1e-9
#: a block whose every logit is resolved to this fraction of the block's RMS logit is kept even when its scale
#: was off by more than 8x: measuring it again at the target gains nothing a float64 result can show
STEER_PRECISE = 1e-12


def max_probe_scale(oracle) -> float:
    """Largest probe scale worth trying: 1e8, or less where the answers' precision would overflow (the
    forward pass squares the input scale in its logits: float16 stops near 2.5)."""
    return float(min(1e8, 0.01 * np.sqrt(float(finfo(oracle.precision).max))))


def saturated_shrink(beyond, target: float):
    """How far to shrink a saturated probe: by 4, or by ``beyond / target`` when its saturation shows a logit
    larger than that (``Logits.beyond``), which lands it at the target at least instead of four times closer."""
    return np.maximum(4.0, np.asarray(beyond, dtype=np.float64) / target)


def lead_probes(d: int) -> int:
    """Probes measured first in a pass to steer the scale of the rest: at least 4, at most 16 or d/3."""
    return max(4, min(16, d // 3))


@dataclass(frozen=True)
class ScaleSearch:
    """What a calibration scale search found: ``size``, the RMS of the part it measures at unit scale (or, when the
    budget ended first, an upper bound from a part lost in rounding or the size saturated logits show; None when
    nothing was asked); ``values``, that part at unit scale (None unless found); whether they are ``reusable`` as
    equations of the main passes; and whether the search ended with its part lost in rounding
    (``rounding_only``: an upper bound, not saturation)."""

    size: float | None
    values: np.ndarray | None
    reusable: bool
    rounding_only: bool = False


def calibrate(oracle, Q, P, v, c, bias, allowance, *, probes_per_step: int | None = None):
    """Estimate ``ν_u ≈ RMS qᵀu`` and ``ν_W ≈ RMS qᵀW p`` (unit q, p) from a few probes, shrinking the probes
    when they saturate and growing them when the logit drowns in rounding. Uses at most ``allowance``
    queries, ``probes_per_step`` (default: half the allowance, at most 16) at each step of a search; an
    estimate it could not afford is None.

    The probes are the first k rows of Q against b = 0 (u) and against the first k rows of P (W), so the last,
    successful measurement of each search is also a valid equation of the main passes: ``q_iᵀu`` and
    ``q_iᵀW p_i`` are returned and reused, and only the failed search steps cost extra queries.
    Returns ``(ν_u, ν_W, queries used, q_iᵀu or None, q_iᵀW p_i or None)``."""
    used = 0
    k = probes_per_step or max(1, min(16, allowance // 2))
    s_max = max_probe_scale(oracle)
    d = Q.shape[1]

    def search(measure, power) -> ScaleSearch:
        """Scale search; ``measure(s)`` returns (logits, the part that scales as s**power)."""
        nonlocal used
        s, bound, rounding_only = 1.0, None, False
        while used + k <= allowance:
            try:
                lg, part = measure(s)
            except NonFiniteAnswerError:  # the target overflowed its own precision: stop growing
                used += k
                break
            used += k
            if lg.saturated.any():  # shrink at least as far as the least saturated probe's logit allows
                least = float(np.min(lg.beyond[lg.saturated]))
                bound = least / s**power  # if the budget ends here: the size its saturation shows, a first guess
                rounding_only = False
                s /= max(16.0, saturated_shrink(least, TARGET_LOGIT)) ** (1.0 / power)
            elif np.all(np.abs(part) < 100 * lg.noise):  # below rounding: only an upper bound
                bound = float(np.max(np.abs(part) + 100 * lg.noise)) / s**power
                rounding_only = True
                s *= 64.0 ** (1.0 / power)
            else:
                # reusable as equations only if taken where the sigmoid inverts well
                rms_all = float(np.sqrt(np.mean(lg.values**2)))
                reusable = rms_all >= TARGET_LOGIT / 8 and float(np.max(np.abs(lg.values))) <= 8.0
                return ScaleSearch(float(np.sqrt(np.mean(part**2))) / s**power, part / s**power, reusable)
            if not 1e-8 < s < s_max:
                break
        return ScaleSearch(bound, None, False, rounding_only)

    nu_u, qu, known_u = None, np.zeros(k), None
    if bias:
        def u_part(s):
            lg = measure_logits(oracle, s * Q[:k], np.zeros(d), v, c)
            return lg, lg.values

        found = search(u_part, 1)
        nu_u = found.size
        if found.values is None and not found.rounding_only:  # the u part of the W probes cannot be removed
            return nu_u, None, used, None, None
        # u lost in rounding at every scale (a layer without query bias): its part of the W probes is at rounding
        # too, so W's scale is still found, but its values are not reused as equations
        exact_u = found.values is not None
        qu = found.values if exact_u else np.zeros(k)
        known_u = found.values if exact_u and found.reusable else None

    def w_part(s):  # [(a+b); b] at a = s q, b = s p has logit s² qᵀW p + s qᵀu
        lg = measure_logits(oracle, s * Q[:k], s * P[:k], v, c)
        return lg, lg.values - s * qu

    found = search(w_part, 2)
    return nu_u, found.size, used, known_u, (found.values if found.reusable and (not bias or exact_u) else None)


def probe_scales(nu_u, nu_w, target, s_max: float = 1e8):
    """Probe scales ``s_u`` (u pass), ``s_a``, ``s_b`` (W pass) that put the RMS logit at ``target``.

    Balanced ``s_a = s_b`` when the query bias is small; a large bias would swamp ``aᵀW b``, so b is lifted
    (at most 8x) until both parts weigh the same. Unknown estimates (no calibration budget) give unit scales,
    except that a known steep query bias (more than 8x the target at unit scale) scales ``a`` down for it.
    """
    if nu_w is None:
        s_a = s_b = 1.0
        if nu_u and nu_u > 8 * target:  # a steep query bias alone would saturate unit probes: scale a for it
            s_a = target / nu_u
    else:
        nu_w = max(nu_w, 1e-300)
        nu_b = nu_u or 0.0
        s_b = math.sqrt(target / nu_w)
        if nu_b > s_b * nu_w:
            s_b = min(nu_b / nu_w, 8.0 * s_b)
        s_a = target / math.sqrt((s_b * nu_w) ** 2 + nu_b**2)
    s_u = target / nu_u if nu_u else s_a
    clip = lambda x: float(np.clip(x, 1e-8, s_max))  # noqa: E731
    return clip(s_u), clip(s_a), clip(s_b)


@dataclass(frozen=True)
class BlockLogits:
    """Normalised logits of a probe block: ``Z[ℓ, j] = a_ℓᵀ(W b_j + u)`` (NaN where a pair was skipped) with the
    first-order rounding error of each entry (``noise``, same normalisation, inf where not measured), the RMS
    logit and median logit noise of the first pass, and the probe scale :meth:`LogitProbe.steer` proposes for
    the next block (``next_scale``; the block's own scale when not steered)."""

    Z: np.ndarray
    noise: np.ndarray
    rms: float
    median_noise: float
    next_scale: float
    saturated_first: bool = False  # some probe of the first pass saturated (and was resolved by a retry)


@dataclass(frozen=True)
class LogitProbe:
    """What every length-2 measurement of Thm 4.1 shares: the oracle, the learner's estimates ``v, c``, the
    probe design (``orthogonal`` probes are re-scaled per probe; the paper's fixed ``basis``/``gaussian``
    probes raise on saturation instead) and the target RMS logit. Re-measured probes are charged to the
    oracle phase ``"retries"``."""

    oracle: object
    v: np.ndarray
    c: float
    probes: str = "orthogonal"
    target: float = TARGET_LOGIT
    memory: QueryMemory = field(default=SHARED_QUERY_MEMORY, compare=False, repr=False)

    @property
    def adaptive(self) -> bool:
        return self.probes == "orthogonal"

    def measure_steered(self, A, Bs, scale, what, *, lead: int = 0, skip=None) -> BlockLogits:
        """:meth:`steer` over all probes; with ``lead > 0`` the first ``lead`` probes go first and steer the
        scale of the rest (each equation may have its own scale), so a poor calibration costs at most ``lead``
        re-measured probes per column instead of a whole block. ``skip`` marks (probe, column) pairs known
        already."""
        skip = np.zeros((A.shape[0], Bs.shape[0]), bool) if skip is None else skip
        if lead > 0:  # the lead is `lead` probes actually asked, not counting the known ones
            asked = np.cumsum(~skip.all(axis=1))
            lead = int(np.searchsorted(asked, lead) + 1)
        if not (self.adaptive and 0 < lead < A.shape[0]):
            return self.steer(A, Bs, scale, what, skip)
        first = self.steer(A[:lead], Bs, scale, what, skip[:lead])
        rest = self.steer(A[lead:], Bs, first.next_scale, what, skip[lead:])
        return BlockLogits(np.vstack([first.Z, rest.Z]), np.vstack([first.noise, rest.noise]), rest.rms,
                           rest.median_noise, rest.next_scale, rest.saturated_first)

    def steer(self, A, Bs, scale, what, skip=None, max_steps: int = 3) -> BlockLogits:
        """:meth:`measure`, then steer the probe scale to the target RMS logit. A block whose logits came out
        more than 8x too small or too large lost precision (too little signal, or weights pressed against 0
        and 1) and is measured again at the corrected scale (this is where a tiny or missing calibration is
        paid for), unless every probe of it was resolved to ``STEER_PRECISE`` anyway; otherwise the correction
        applies to the next block (``next_scale``). Saturated probes, once their retries resolved them, tell the
        corrected scale by their own logits."""
        skip = np.zeros((A.shape[0], Bs.shape[0]), bool) if skip is None else skip
        for step in range(max_steps + 1):
            with self.oracle.phase("retries") if step else nullcontext():
                block = self.measure(A, Bs, scale, what, skip)
            if not self.adaptive or skip.all():
                return block
            factor = self.target / block.rms if block.rms > 0 else np.inf
            if block.rms < 100 * block.median_noise:  # the logits drown in rounding: grow cautiously
                factor = min(factor, 64.0)
            if 0.125 <= factor <= 8.0 or step == max_steps:
                return replace(block, next_scale=scale * float(np.clip(factor, 0.05, 2.0)))
            resolved = self._resolved(block, scale, skip)
            if resolved is not None:
                rms, precise = resolved
                if precise:  # off target, but every probe resolved (retries included) to full precision
                    return replace(block, next_scale=scale * float(np.clip(self.target / rms, 1e-3, 8.0)))
                if block.saturated_first:  # the first pass counted them as logit 40; their retries tell more
                    factor = self.target / rms
            self.oracle.require(int((~skip).sum()), f"re-measuring {what} at a better probe scale")
            scale = min(scale * float(np.clip(factor, 1e-3, 1e6)), max_probe_scale(self.oracle))
        raise AssertionError("unreachable")

    def _resolved(self, block: BlockLogits, scale: float, skip) -> tuple[float, bool] | None:
        """``(RMS logit, precise)`` of ``block`` at ``scale`` when every probe was resolved (None otherwise):
        saturated probes count at the logit their retries measured, scaled back to ``scale``, so they tell how
        far off ``scale`` was; ``precise`` when the median logit noise is below ``STEER_PRECISE`` of the RMS."""
        asked = ~skip
        Z, N = block.Z[asked] * scale, block.noise[asked] * scale  # logits and their noise at the block's scale
        if not (Z.size and np.all(np.isfinite(Z)) and np.all(np.isfinite(N))):
            return None
        rms = float(np.sqrt(np.mean(Z**2)))
        return (rms, float(np.median(N)) <= STEER_PRECISE * rms) if rms > 0 else None

    def measure(self, A, Bs, scale, what, skip=None) -> BlockLogits:
        """Logits for probes ``scale·a_ℓ`` (rows of ``A``) against each row ``b_j`` of ``Bs``. With orthogonal
        probes every saturated or unusually noisy probe is asked again alone at a quarter of its scale (one
        query each: each equation may have its own scale); the paper's fixed probes raise instead. Pairs
        marked in ``skip`` are not asked (left NaN)."""
        d, k = A.shape[0], Bs.shape[0]
        Z, N = np.full((d, k), np.nan), np.full((d, k), np.inf)
        S = np.full((d, k), float(scale))
        ell, j = np.divmod(np.arange(d * k), k)  # ℓ-major, matching Z's C order
        whole = skip is None or not skip.any()  # the first pass asks the whole grid at one scale
        if not whole:
            ell, j = ell[~skip.ravel()], j[~skip.ravel()]
            if len(ell) == 0:
                return BlockLogits(Z, N, np.nan, 0.0, float(scale))
        rms = median_noise = None
        for attempt in range(MAX_RETRIES + 1):
            with self.oracle.phase("retries") if attempt else nullcontext():
                if whole and attempt == 0:
                    queries = grid_queries(A, float(scale), Bs, None, None, self.v, self.c, memory=self.memory)
                else:
                    queries = grid_queries(A, S[ell, j], Bs, ell, j, self.v, self.c, memory=self.memory)
                lg = answer_logits(self.oracle, *queries)
                del queries  # the next attempt's queries may reuse their memory
            self._refuse_outside(lg, len(ell), what)
            ok = ~lg.saturated
            noise = np.where(ok, lg.noise, np.inf) / S[ell, j]
            ok &= noise < N[ell, j]  # a re-measurement replaces a value only when it is more precise
            Z[ell[ok], j[ok]] = lg.values[ok] / S[ell[ok], j[ok]]
            N[ell[ok], j[ok]] = noise[ok]
            if rms is None:  # saturated probes count as logit 40, beyond any precision's reach
                rms = float(np.sqrt(np.mean(np.where(ok, lg.values, 40.0) ** 2)))
                median_noise = float(np.median(lg.noise[ok])) if ok.any() else 0.0
                saturated_first = bool(lg.saturated.any())
            if not self.adaptive and lg.saturated.any():
                raise SaturationError(
                    f"{int(lg.saturated.sum())} attention weights of {what} are numerically 0 or 1 with the "
                    f"paper's {self.probes} probes, so the sigmoid cannot be inverted; use probes='orthogonal', "
                    "which scales the probes to the target")
            noisy = lg.noise > max(NOISY_FACTOR * median_noise, NEGLIGIBLE_NOISE * rms)
            redo = lg.saturated | noisy if self.adaptive and attempt < MAX_RETRIES else lg.saturated
            if not redo.any():
                return BlockLogits(Z, N, rms, median_noise, float(scale), saturated_first)
            if attempt == MAX_RETRIES:
                break
            shrink = np.where(lg.saturated[redo], saturated_shrink(lg.beyond[redo], self.target), 4.0)
            ell, j = ell[redo], j[redo]
            self.oracle.require(len(ell), f"re-measuring {len(ell)} saturated probes of {what}")
            S[ell, j] /= shrink
        raise SaturationError(
            f"{int(lg.saturated.sum())} attention weights of {what} stay saturated after shrinking their probes "
            f"up to {float(scale) / float(np.min(S[ell, j])):,.0f}x: either the target's logits are too steep, or "
            f"{self.oracle.precision} answers cannot resolve weights this close to 0 or 1; the robust learner spends "
            "more queries to average such answers")

    @staticmethod
    def _refuse_outside(lg, asked: int, what: str) -> None:
        if lg.outside.any():
            raise RecoveryError(
                f"{int(lg.outside.sum())} of {asked} answers for {what} lie outside the two values the attention "
                "mixes, so they are no softmax average: the oracle is not a single attention head of the assumed "
                "form (a biased head learned with bias=False?) or its answers are noisy (see the robust learner)")
