"""Queries a run will need, before it asks any: the budget to buy for an extraction.

The counts follow each learner's own plan (Thm 4.1's ``d² + 2d + 1`` unknowns for the exact learner, the
sketch of ``2dr − r²`` numbers for a rank-r head, the multi-head learner's stages, App. C) plus what the plan
leaves adaptive: calibration, re-measured probes and the functional check. ``low`` and ``high`` bound the
count when the answers behave (no saturation beyond what the plan allows); ``queries`` is the expected value.
The ReLU-network learner's count depends on where its searches find kinks, so its estimate is a wide range (±35 %).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from attnprobe.errors import ConfigError
from attnprobe.learners.check import check_queries
from attnprobe.learners.lowrank import CERTIFICATE_PROBES, FLOAT32_OVERSAMPLE, lowrank_queries
from attnprobe.learners.multihead.headcheck import head_check_queries
from attnprobe.learners.scaling import CALIBRATION_SHARE
from attnprobe.models.attention import AttentionHead

#: calibration probes the orthogonal probes spend on ν_W (measured 16 … 32 at d = 64 … 768)
CALIBRATION = 32
#: re-measured (saturated or noisy) probes allowed for, as a share of the planned queries
RETRY_SHARE = 0.01
#: the ReLU-network learner: queries ≈ FFN_FIXED + FFN_PER_UNIT·m + FFN_PER_WEIGHT·m·d, within ±FFN_SPREAD (fitted to
#: 12 runs at (d, m) = (4, 4), (8, 8), (8, 32), (16, 16), float64: 406 … 2150 queries, 0.70 … 1.0 of the fit)
FFN_FIXED, FFN_PER_UNIT, FFN_PER_WEIGHT, FFN_SPREAD = 300, 40, 1.5, 0.35


@dataclass(frozen=True)
class Estimate:
    """Expected queries and the range they fall in; ``cost`` at ``price_per_1k`` (None when no price)."""

    method: str
    d: int
    queries: int
    low: int
    high: int
    basis: str
    price_per_1k: float | None = None

    @property
    def cost(self) -> float | None:
        return None if self.price_per_1k is None else self.queries * self.price_per_1k / 1000

    def to_dict(self) -> dict:
        return {**asdict(self), "cost": self.cost}


def _coarse(precision: str) -> bool:
    return precision not in ("float64", "auto")


def estimate_queries(method: str, d: int, *, rank: int | None = None, heads: int | None = None,
                     hidden: int | None = None, precision: str = "float64", bias: bool = True, check: bool = True,
                     price_per_1k: float | None = None) -> Estimate:
    """The queries ``method`` will ask at width ``d`` (``rank``: lowrank and multihead; ``heads``: multihead;
    ``hidden``: ffn); asks nothing. Raises :class:`ConfigError` naming the missing parameter."""
    checks = check_queries() if check else 0
    if method == "exact":
        unknowns = AttentionHead.unknowns(d, bias)
        calib = min(CALIBRATION, int(CALIBRATION_SHARE * unknowns))
        base = unknowns + checks
        retry = int(RETRY_SHARE * unknowns) + (d if _coarse(precision) else 0)
        return Estimate(method, d, base + calib + retry // 2, base, base + calib + retry,
                        f"d²+2d+1 = {unknowns} unknowns, calibration ≤ {calib}, retries ≤ {retry}, check {checks}",
                        price_per_1k)
    if method == "lowrank":
        if rank is None:
            raise ConfigError("a low-rank estimate needs the rank bound r (the head dimension)", param="rank")
        over = FLOAT32_OVERSAMPLE if _coarse(precision) else 0
        base = lowrank_queries(d, rank, over, 0, bias) + CERTIFICATE_PROBES + checks
        calib, retry = CALIBRATION, int(RETRY_SHARE * base)
        return Estimate(method, d, base + calib + retry // 2, base, base + calib + retry,
                        f"2d+1 + d(r+P) + (r+P)(d−r−P) with r = {rank}, P = {over}; certificate "
                        f"{CERTIFICATE_PROBES}, calibration ≤ {calib}, retries ≤ {retry}, check {checks}", price_per_1k)
    if method == "multihead":
        if heads is None or rank is None:
            raise ConfigError("a multi-head estimate needs the number of heads H and the head dimension r",
                              param="heads" if heads is None else "rank")
        from attnprobe.learners.multihead.generic import _planned_rest

        values = 8 * d + 1 + 50 * heads  # [0], [e_i], and the saturated probes that split Σ v_h into heads (measured)
        base = values + _planned_rest(d, heads, rank, bias) + ((head_check_queries(heads) + checks) if check else 0)
        calib, retry = heads * CALIBRATION, int(3 * RETRY_SHARE * base)  # values stage and crossings vary
        return Estimate(method, d, base + calib + retry // 2, base - retry, base + calib + 2 * retry,
                        f"values ≈ 8d + 50H, H = {heads} isolated rank-{rank} heads and their cross terms, per-head "
                        f"calibration ≤ {calib}, retries ≤ {retry}", price_per_1k)
    if method == "ffn":
        if hidden is None:
            raise ConfigError("an FFN estimate needs the number of hidden units m", param="hidden")
        mid = int(FFN_FIXED + FFN_PER_UNIT * hidden + FFN_PER_WEIGHT * hidden * d) + checks
        return Estimate(method, d, mid, int((1 - FFN_SPREAD) * mid), int((1 + FFN_SPREAD) * mid),
                        f"adaptive (where the kink searches land): ≈ {FFN_FIXED} + {FFN_PER_UNIT}m + "
                        f"{FFN_PER_WEIGHT}md with m = {hidden}, ±{FFN_SPREAD:.0%}", price_per_1k)
    raise ConfigError(f"no query estimate for method {method!r}; estimates exist for exact, lowrank, multihead "
                      "and ffn", param="method")
