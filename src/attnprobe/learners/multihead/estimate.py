"""Query estimates of the multi-head learners (asked before a run, App. C): the
generic learner's stages for one number per answer, the vector-answer learner's for K-vector answers."""

from __future__ import annotations

from attnprobe.learners.core.estimate import QueryCount, Setting
from attnprobe.learners.head.estimate import CALIBRATION, RETRY_SHARE
from attnprobe.learners.multihead import vector
from attnprobe.learners.multihead.generic import planned_rest
from attnprobe.learners.multihead.headcheck import head_check_queries

#: the vector-answer multi-head learner: calibration rounds of 4 queries (measured 2–4 on MiniLM layers) and the
#: clipping ladder (``len(ladder) + 1`` length-1 queries, 4 at the probe norms of MiniLM)
VECTOR_CALIBRATION, VECTOR_LADDER = 12, 4
#: differences re-separated from scratch (4H queries each), as a share of d (MiniLM layers: 0 … 30 of 384)
VECTOR_RESTARTS, VECTOR_RESTARTS_HIGH = 0.02, 0.1


def multihead_estimate(s: Setting) -> QueryCount:
    """The multi-head learner ``auto`` picks: the vector-answer learner for K ≥ 2 declared outputs, else the
    generic one (values ≈ 8d + 50H, H isolated rank-r heads and their cross terms, per-head calibration)."""
    heads = s.needs("heads", "a multi-head estimate needs the number of heads H")
    if s.outputs is not None and s.outputs >= 2:
        s.refuse_coarse("the vector-answer multi-head learner")
        return vector_estimate(s, heads, s.outputs)
    rank = s.needs("rank", "a multi-head estimate for one output per sequence needs the head dimension r")
    d, checks = s.d, s.check_queries
    probe = 1 if s.outputs is None else 0  # one query tells scalar from vector answers when K is not declared
    values = 8 * d + 1 + 50 * heads  # [0], [e_i], and the saturated probes that split Σ v_h into heads (measured)
    base = probe + values + planned_rest(d, heads, rank, s.bias) + (
        (head_check_queries(heads) + checks) if s.check else 0)
    calib, retry = heads * CALIBRATION, int(3 * RETRY_SHARE * base)  # values stage and crossings vary
    return QueryCount(base + calib + retry // 2, base - retry, base + calib + 2 * retry,
                      f"values ≈ 8d + 50H, H = {heads} isolated rank-{rank} heads and their cross terms, per-head "
                      f"calibration ≤ {calib}, retries ≤ {retry}" + (
                          ", 1 to tell scalar from vector answers (one number per answer assumed: declare the "
                          "outputs K of whole output rows)" if probe else ""))


def vector_estimate(s: Setting, H: int, K: int) -> QueryCount:
    """The vector-answer multi-head learner (:mod:`attnprobe.learners.multihead.vector`): values ``[±x]`` (2d),
    calibration and the clipping ladder, the rank of δ_0's residuals (n_0 design points), Jennrich's Jacobians (4H),
    d differences × n design points (twice for coarse answers), the logits (Sec. 5's sketch shared by the heads,
    float64; every ``W_h`` whole otherwise), the per-head check and the functional check."""
    d, coarse, checks = s.d, s.coarse, s.check_queries
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
    restart = vector.from_scratch_queries(H)
    base = (vector.planned_values(d) + VECTOR_CALIBRATION + VECTOR_LADDER + n0 + restart + differences + logits
            + vector.HEAD_CHECK_QUERIES + checks)
    expected = base + int(VECTOR_RESTARTS * d) * restart
    # float64: the heads' column spaces may split M after 32k differences, once they exceed the head dimension by 8
    early = min(d, 32 * -(-(-(-d // H) + 8) // 32))
    low = base - VECTOR_CALIBRATION + 4 - (0 if coarse else (d - early) * n)
    high = base + int(VECTOR_RESTARTS_HIGH * d) * restart + 36  # calibration up to 12 rounds
    return QueryCount(expected, max(low, 2 * d), high,
                      f"vector answers (K = {K}): values 2d = {2 * d}, rank of the residuals {n0}, {d} differences × "
                      f"{n}{' × 2' if coarse else ''} = {differences}, logits {logits} ({tokens} tokens per query"
                      f"{', every W_h whole' if logits == whole else ', low-rank sketch'}), restarts of 4H = {restart} "
                      f"each (≈ {int(VECTOR_RESTARTS * d)}), checks {vector.HEAD_CHECK_QUERIES} + {checks}")
