"""Query estimates of the multi-head learners (asked before a run, App. C): the
generic learner's stages for one number per answer, the vector-answer learner's for K-vector answers."""

from __future__ import annotations

from attnprobe.learners.core.estimate import QueryCount, Setting
from attnprobe.learners.head.estimate import CALIBRATION, RETRY_SHARE
from attnprobe.learners.multihead import vector
from attnprobe.learners.multihead.generic import planned_rest
from attnprobe.learners.multihead.headcheck import head_check_queries
from attnprobe.learners.multihead.vector_rows import logits_sequences

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
    """The vector-answer multi-head learner (:mod:`attnprobe.learners.multihead.vector`): values ``[±x]`` (2d;
    ``[x]`` and ``[0]``, d + 1, when the oracle answers every position), calibration and the clipping ladder, the
    rank of δ_0's residuals (n_0 design points), Jennrich's Jacobians (4H), the separation, the logits, the
    per-head check and the functional check. Last position (and positional rows): d differences × n design points
    (twice for coarse answers); the logits by Sec. 5's shared low-rank sketch (float64; every ``W_h`` whole
    otherwise). Every position: the logits from every row (:func:`~.vector_rows.logits_sequences`); bidirectional
    rows also separate on progressions (:func:`_every_row_separation`)."""
    d, coarse, checks = s.d, s.coarse, s.check_queries
    rows = s.positions in ("causal", "bidirectional")
    n0 = vector.first_design_points(H, coarse)
    while H >= min(K, n0) - 4 and n0 < K:  # design points are added until the residuals' rank shows a gap
        n0 = min(K, 2 * n0)
    n = vector.design_points(H, coarse)
    restart = vector.from_scratch_queries(H)
    values = vector.planned_values(d, every_position=s.positions is not None)
    fixed = values + VECTOR_CALIBRATION + VECTOR_LADDER + n0 + restart + vector.HEAD_CHECK_QUERIES + checks
    if rows:
        tokens = vector.rows_tokens(H, K, coarse)
        logits = len(logits_sequences(d, H, tokens, s.positions == "causal", sketch=not coarse)[0])
        how = f"logits {logits} sequences of every row ({tokens} directions each)"
    else:
        tokens = vector.tokens_per_query(H, K, coarse)
        blocks = -(-d // tokens)
        L = min(d, -(-d // H) + 16)
        whole = (d + 1) * blocks
        sketch = (L + 1) * blocks + d * -(-L // tokens)
        logits = whole if coarse or sketch >= whole else sketch
        how = (f"logits {logits} ({tokens} tokens per query"
               f"{', every W_h whole' if logits == whole else ', low-rank sketch'})")
    if s.positions == "bidirectional":
        separation, low_sep, high_sep, sep_how = _every_row_separation(d, H, coarse)
    else:
        separation = d * n * (2 if coarse else 1)
        # float64: the heads' column spaces may split M after 32k differences, once they exceed the head dimension
        # by 8
        early = min(d, 32 * -(-(-(-d // H) + 8) // 32))
        low_sep, high_sep = separation - (0 if coarse else (d - early) * n), separation
        sep_how = f"{d} differences × {n}{' × 2' if coarse else ''} = {separation}"
    base = fixed + logits + separation
    expected = base + int(VECTOR_RESTARTS * d) * restart
    low = fixed + logits + low_sep - VECTOR_CALIBRATION + 4
    high = fixed + logits + high_sep + max(1, int(VECTOR_RESTARTS_HIGH * d)) * restart + 36  # calibration: 12 rounds
    return QueryCount(expected, max(low, d + 1 if s.positions else 2 * d), high,
                      f"vector answers (K = {K}{', every position: ' + s.positions if s.positions else ''}): values "
                      f"{values}, rank of the residuals {n0}, {sep_how}, {how}, restarts of 4H = {restart} each "
                      f"(≈ {int(VECTOR_RESTARTS * d)}), checks {vector.HEAD_CHECK_QUERIES} + {checks}")


def _every_row_separation(d: int, H: int, coarse: bool) -> tuple[int, int, int, str]:
    """Sequences of the separation on progressions of every row (bidirectional): δ_0's progressions, then short
    differences checked every 8 until the heads' column spaces (rank ≈ d/H) are exhausted (≈ rank + 9), then
    float64: the column spaces split M (or, ill-conditioned, d differences: the high end); coarse: a long
    difference along each of the d directions. Returns expected, low, high and the basis in words."""
    P, q = vector.PROGRESSION, vector.ROWS_Q
    rank = -(-d // H)
    short = min(d, 8 * max(2, (rank + 7) // 8 + 1))  # checked every 8 from 16 on: until 1 + short > rank + 8
    if coarse:  # δ_0 and the short differences, then a long one along each direction
        per, far = vector.progression_points(vector.ROWS_DESIGN_COARSE, P, q), vector.far_progressions(q)
        count = (1 + short) * per + d * far
        return count, count, count, (f"1 + {short} short differences × {per} + {d} long × {far} progressions of "
                                     f"{P} = {count}")
    per = vector.progression_points(vector.design_points(H, coarse), P, q)
    count, high = (1 + short) * per, (1 + d) * per
    return count, count, high, (f"{short} differences × {per} progressions of {vector.PROGRESSION} = {count} (column "
                                f"spaces; up to {d} differences = {high})")
