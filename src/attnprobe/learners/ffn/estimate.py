"""The query estimate of the ReLU-network learner (asked before a run).

The adaptive parts (kink search, regions re-measured off the search line) are modelled from measured means, so its
range is wider (``FFN_LOW`` … ``FFN_HIGH`` of the estimate).
"""

from __future__ import annotations

import math

from attnprobe.learners.core.estimate import QueryCount, Setting
from attnprobe.learners.ffn.fit import polish_answers
from attnprobe.learners.ffn.learner import odd_part_queries
from attnprobe.learners.ffn.more_lines import MAX_LINES

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


def ffn_estimate(s: Setting) -> QueryCount:
    """The ReLU-network learner (:mod:`attnprobe.learners.ffn`): 12 end stencils and the kink search along the line,
    one gradient of D + 1 queries (D = d + 1 in the lifted space of a biased net, d without biases) per linear
    region between the m kinks, the regions re-measured off the line, the odd part (2d, bias-free), the
    least-squares polish on (3 + bias)·D·m answers and up to two more lines (float32), the 64-query check."""
    m = s.needs("hidden", "an FFN estimate needs the number of hidden units m")
    s.refuse_coarse("the ReLU-network learner")
    d, bias, coarse = s.d, s.bias, s.coarse
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
    fixed = (0 if bias else odd_part_queries(d)) + polish + 64
    mid = int(round(line + fixed))
    high = int(round(FFN_HIGH * (MAX_LINES * line if coarse else line) + fixed))
    more = f"; float32: polish {polish}, up to {MAX_LINES - 1} more lines" if coarse else ""
    return QueryCount(mid, int(FFN_LOW * mid), high,
                      f"kink search ≈ {search:.0f} ({per_unit:.3g} per unit), ≈ {regions:.1f} gradients of {D + 1} "
                      f"queries (m + 2 = {m + 2} regions, some re-measured off the line){more}, check 64; measured "
                      f"{FFN_LOW:.2f}–{FFN_HIGH:.2f} of this")
