"""Query estimates of the single-head learners (asked before a run): Thm 4.1's ``d² + 2d + 1``
unknowns for the exact learner, the sketch of ``2dr − r²`` numbers for a rank-r head, plus what each plan leaves
adaptive: calibration, re-measured probes and the functional check."""

from __future__ import annotations

from attnprobe.learners.core.estimate import QueryCount, Setting
from attnprobe.learners.head.lowrank import CERTIFICATE_PROBES, FLOAT32_OVERSAMPLE, lowrank_queries
from attnprobe.learners.head.scaling import CALIBRATION_SHARE
from attnprobe.models.attention import AttentionHead

#: calibration probes the orthogonal probes spend on ν_W (measured 16 … 32 at d = 64 … 768)
CALIBRATION = 32
#: re-measured (saturated or noisy) probes allowed for, as a share of the planned queries
RETRY_SHARE = 0.01


def exact_estimate(s: Setting) -> QueryCount:
    """The exact learner (Thm 4.1): its unknowns, calibration ≤ 32, re-measured probes, the check."""
    unknowns = AttentionHead.unknowns(s.d, s.bias)
    calib = min(CALIBRATION, int(CALIBRATION_SHARE * unknowns))
    base = unknowns + s.check_queries
    retry = int(RETRY_SHARE * unknowns) + (s.d if s.coarse else 0)
    return QueryCount(base + calib + retry // 2, base, base + calib + retry,
                      f"d²+2d+1 = {unknowns} unknowns, calibration ≤ {calib}, retries ≤ {retry}, "
                      f"check {s.check_queries}")


def lowrank_estimate(s: Setting) -> QueryCount:
    """The low-rank learner: the sketch of a rank-r head, its certificate, calibration, retries, the check."""
    rank = s.needs("rank", "a low-rank estimate needs the rank bound r (the head dimension)")
    over = FLOAT32_OVERSAMPLE if s.coarse else 0
    base = lowrank_queries(s.d, rank, over, 0, s.bias) + CERTIFICATE_PROBES + s.check_queries
    calib, retry = CALIBRATION, int(RETRY_SHARE * base)
    return QueryCount(base + calib + retry // 2, base, base + calib + retry,
                      f"2d+1 + d(r+P) + (r+P)(d−r−P) with r = {rank}, P = {over}; certificate "
                      f"{CERTIFICATE_PROBES}, calibration ≤ {calib}, retries ≤ {retry}, check {s.check_queries}")
