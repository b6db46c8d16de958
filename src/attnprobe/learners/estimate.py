"""Queries a run will need, before it asks any: the budget to buy for an extraction.

The counts follow each learner's own plan (Thm 4.1's ``d² + 2d + 1`` unknowns for the exact learner, the
sketch of ``2dr − r²`` numbers for a rank-r head, the multi-head learners' stages, App. C) plus what the plan
leaves adaptive: calibration, re-measured probes and the functional check. ``low`` and ``high`` bound the
count when the answers behave (no saturation beyond what the plan allows); ``queries`` is the expected value.
The adaptive parts of the ReLU-network learner (kink search, regions re-measured off the search line) are
modelled from measured means, so its range is wider (``FFN_LOW`` … ``FFN_HIGH`` of the estimate).
"""

from __future__ import annotations

import math
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
#: the ReLU-network learner on float64 answers: kink-search queries per hidden unit beyond the 12 end stencils,
#: ``a + b·log₂ m`` (kinks pinned inside their meeting point's stencil; means of 13.2 at m = 4 … 14.6 at m = 64
#: over 40 seeds at every benchmark size, one output or ten)
FFN_SEARCH_PER_UNIT, FFN_SEARCH_PER_UNIT_LOG = 12.9, 0.25
#: float32 answers: the search without the zoom, pieces refitted (measured 13–26 per unit); 18.8 puts the estimate
#: of d = 8, m = 32 at 2,199, inside the one-line runs of seeds 0–39 (2,024–2,217; a neuron found in the polish
#: answers saves its kink and region, so those runs are the cheapest)
FFN_SEARCH_PER_UNIT_COARSE = 18.8
#: gradients beyond one per region (m + 2): regions re-measured off the line (their probes crossed a hyperplane
#: near the line: more of them as m and d grow) and split points taken for kinks and merged away after their
#: gradients were measured. Float64: ``FFN_EXTRA + FFN_EXTRA_QUAD·m²·(1 + d/FFN_EXTRA_D)`` (means of 0.1 … 1 at
#: d ≤ 64, m ≤ 32; 2.2 at d = m = 64; 7 at d = 784, m = 64; 40 seeds, 10 at d = 784); float32 answers
#: ``FFN_EXTRA_COARSE + FFN_EXTRA_PER_UNIT_COARSE·m`` (fitted to 190 runs)
FFN_EXTRA, FFN_EXTRA_QUAD, FFN_EXTRA_D = 0.25, 4.3e-4, 263.0
FFN_EXTRA_COARSE, FFN_EXTRA_PER_UNIT_COARSE = 0.25, 0.08
#: float32 answers search a biased net along the unit line, where the kinks crowd near its far ends as d·m grows
#: and the thin regions there are measured twice: a share ``1 − exp(−FFN_NARROW·m·d)`` of the regions (measured on
#: float64 answers before their line was scaled: 3 of 18 regions at 784-16, 36 of 66 at 784-64)
FFN_NARROW = 1.7e-5
#: the spread of the ReLU-network learner's count around the estimate (float64, 40 seeds at each benchmark size
#: d = 8 … 64 and 10 at d = 784, m = 4 … 64, K = 1 and 10: 0.90 … 1.33 of it; the high end is a run that
#: re-measured regions off the line, 1.33 of the search and gradients); the high end applies to the search and
#: gradients (the check's 64 queries are fixed)
FFN_LOW, FFN_HIGH = 0.85, 1.4
#: the vector-answer multi-head learner: calibration rounds of 4 queries (measured 2–4 on MiniLM layers) and the
#: clipping ladder (``len(ladder) + 1`` length-1 queries, 4 at the probe norms of MiniLM)
VECTOR_CALIBRATION, VECTOR_LADDER = 12, 4
#: differences re-separated from scratch (4H queries each), as a share of d (MiniLM layers: 0 … 30 of 384)
VECTOR_RESTARTS, VECTOR_RESTARTS_HIGH = 0.02, 0.1


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


def _refuse_coarse(precision: str, learner: str) -> None:
    """Answers coarser than float32 are refused by ``learner`` before it asks: no estimate for them either."""
    if precision not in ("float64", "float32", "auto"):
        raise ConfigError(f"{learner} needs answers in float32 or finer; {precision} answers would be refused, so "
                          "there is nothing to estimate", param="precision")


def estimate_queries(method: str, d: int, *, rank: int | None = None, heads: int | None = None,
                     hidden: int | None = None, outputs: int | None = None, precision: str = "float64",
                     bias: bool = True, check: bool = True, price_per_1k: float | None = None,
                     activation: str | None = None) -> Estimate:
    """The queries ``method`` will ask at width ``d`` (``rank``: lowrank and scalar multihead; ``heads``: multihead;
    ``hidden``: ffn; ``outputs``: the K numbers each answer holds, declared: K ≥ 2 makes ``multihead`` the
    vector-answer learner, None means undeclared, i.e. one number, and a multi-head run then spends one query
    telling scalars from vectors; ``activation``: ffn with a smooth activation is the smooth learner's plan); asks
    nothing. Raises :class:`ConfigError` naming the missing parameter."""
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
        if heads is None:
            raise ConfigError("a multi-head estimate needs the number of heads H", param="heads")
        if outputs is not None and outputs >= 2:
            _refuse_coarse(precision, "the vector-answer multi-head learner")
            return _vector(d, heads, outputs, precision, checks, price_per_1k)
        if rank is None:
            raise ConfigError("a multi-head estimate for one output per sequence needs the head dimension r",
                              param="rank")
        from attnprobe.learners.multihead.generic import _planned_rest

        probe = 1 if outputs is None else 0  # one query tells scalar from vector answers when K is not declared
        values = 8 * d + 1 + 50 * heads  # [0], [e_i], and the saturated probes that split Σ v_h into heads (measured)
        base = probe + values + _planned_rest(d, heads, rank, bias) + (
            (head_check_queries(heads) + checks) if check else 0)
        calib, retry = heads * CALIBRATION, int(3 * RETRY_SHARE * base)  # values stage and crossings vary
        return Estimate(method, d, base + calib + retry // 2, base - retry, base + calib + 2 * retry,
                        f"values ≈ 8d + 50H, H = {heads} isolated rank-{rank} heads and their cross terms, per-head "
                        f"calibration ≤ {calib}, retries ≤ {retry}" + (
                            ", 1 to tell scalar from vector answers (one number per answer assumed: declare the "
                            "outputs K of whole output rows)" if probe else ""), price_per_1k)
    if method == "ffn":
        if hidden is None:
            raise ConfigError("an FFN estimate needs the number of hidden units m", param="hidden")
        if activation not in (None, "relu"):
            from attnprobe.learners.smooth_ffn.learner import smooth_estimate

            return smooth_estimate(d, hidden, outputs or 1, activation, price_per_1k)
        _refuse_coarse(precision, "the ReLU-network learner")
        return _ffn(d, hidden, outputs or 1, precision, bias, price_per_1k)
    raise ConfigError(f"no query estimate for method {method!r}; estimates exist for exact, lowrank, multihead "
                      "and ffn", param="method")


def _ffn(d: int, m: int, K: int, precision: str, bias: bool, price_per_1k: float | None) -> Estimate:
    """The ReLU-network learner (:mod:`attnprobe.learners.ffn`): 12 end stencils and the kink search along the line,
    one gradient of D + 1 queries (D = d + 1 in the lifted space of a biased net, d without biases) per linear
    region between the m kinks, the regions re-measured off the line, the odd part (2d, bias-free), the
    least-squares polish on (3 + bias)·D·m answers and up to two more lines (float32), the 64-query check."""
    from attnprobe.learners.ffn.fit import polish_answers
    from attnprobe.learners.ffn.more_lines import MAX_LINES

    coarse = _coarse(precision)
    D = d + int(bias)
    per_unit = FFN_SEARCH_PER_UNIT_COARSE if coarse else FFN_SEARCH_PER_UNIT + FFN_SEARCH_PER_UNIT_LOG * math.log2(m)
    search = 12 + per_unit * m
    if coarse:
        regions = m + 2 + FFN_EXTRA_COARSE + FFN_EXTRA_PER_UNIT_COARSE * m
    else:
        regions = m + 2 + FFN_EXTRA + FFN_EXTRA_QUAD * m * m * (1 + d / FFN_EXTRA_D)
    if coarse and bias:
        regions += (m + 2) * (1 - math.exp(-FFN_NARROW * m * d))
    line = search + regions * (D + 1)
    polish = polish_answers(D, m, bias) if coarse else 0
    fixed = (0 if bias else 2 * d) + polish + 64
    mid = int(round(line + fixed))
    high = int(round(FFN_HIGH * (MAX_LINES * line if coarse else line) + fixed))
    more = f"; float32: polish {polish}, up to {MAX_LINES - 1} more lines" if coarse else ""
    return Estimate("ffn", d, mid, int(FFN_LOW * mid), high,
                    f"kink search ≈ {search:.0f} ({per_unit:.3g} per unit), ≈ {regions:.1f} gradients of {D + 1} "
                    f"queries (m + 2 = {m + 2} regions, some re-measured off the line){more}, check 64; measured "
                    f"{FFN_LOW:.2f}–{FFN_HIGH:.2f} of this", price_per_1k)


def _vector(d: int, H: int, K: int, precision: str, checks: int, price_per_1k: float | None) -> Estimate:
    """The vector-answer multi-head learner (:mod:`attnprobe.learners.multihead.vector`): values ``[±x]`` (2d),
    calibration and the clipping ladder, the rank of δ_0's residuals (n_0 design points), Jennrich's Jacobians (4H),
    d differences × n design points (twice for coarse answers), the logits (Sec. 5's sketch shared by the heads,
    float64; every ``W_h`` whole otherwise), the per-head check and the functional check."""
    from attnprobe.learners.multihead import vector

    coarse = _coarse(precision)
    n0 = vector.first_design_points(H, coarse)
    while H >= min(K, n0) - 4 and n0 < K:  # design points are added until the residuals' rank shows a gap
        n0 = min(K, 2 * n0)
    n = vector.design_points(H, coarse)
    differences = d * n * (2 if coarse else 1)
    tokens = vector.tokens_per_query(H, K, coarse)
    blocks = -(-d // tokens)
    L = min(d, -(-d // H) + 16)
    whole = (d + 1) * blocks
    sketch = (L + 1) * blocks + d * -(-L // tokens)
    logits = whole if coarse or sketch >= whole else sketch
    restart = 4 * H
    base = (vector.planned_values(d) + VECTOR_CALIBRATION + VECTOR_LADDER + n0 + restart + differences + logits
            + vector.HEAD_CHECK_QUERIES + checks)
    expected = base + int(VECTOR_RESTARTS * d) * restart
    # float64: the heads' column spaces may split M after 32k differences, once they exceed the head dimension by 8
    early = min(d, 32 * -(-(-(-d // H) + 8) // 32))
    low = base - VECTOR_CALIBRATION + 4 - (0 if coarse else (d - early) * n)
    high = base + int(VECTOR_RESTARTS_HIGH * d) * restart + 36  # calibration up to 12 rounds
    return Estimate("multihead", d, expected, max(low, 2 * d), high,
                    f"vector answers (K = {K}): values 2d = {2 * d}, rank of the residuals {n0}, {d} differences × "
                    f"{n}{' × 2' if coarse else ''} = {differences}, logits {logits} ({tokens} tokens per query"
                    f"{', every W_h whole' if logits == whole else ', low-rank sketch'}), restarts of 4H = {restart} "
                    f"each (≈ {int(VECTOR_RESTARTS * d)}), checks {vector.HEAD_CHECK_QUERIES} + {checks}",
                    price_per_1k)
