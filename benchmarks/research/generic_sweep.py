"""Research: robustness sweep of extract_generic over seeds, shapes, logit scales, biases.

PYTHONPATH=src python benchmarks/research/generic_sweep.py [--seeds 20]
Prints per configuration: successes (every head ≤ 1e-6), worst error, failures by exception type.
"""
from __future__ import annotations

import sys
from collections import Counter

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.models.multihead import match_heads
from attnprobe.oracles.base import Oracle
from attnprobe.targets.multihead import random_multihead

CONFIGS = [  # d, H, d_h, scale, bias
    (8, 4, 8, 1.0, True), (8, 4, 2, 1.0, True), (12, 6, 12, 1.0, True),
    (16, 4, 4, 3.0, True), (16, 4, 4, 0.2, True), (16, 3, 16, 1.0, False), (24, 8, 3, 1.0, True),
    (32, 8, 4, 1.0, True),
]

if __name__ == "__main__":
    seeds = int(sys.argv[sys.argv.index("--seeds") + 1]) if "--seeds" in sys.argv else 20
    for d, H, d_h, scale, bias in CONFIGS:
        ok, worst, fails, qs = 0, 0.0, Counter(), []
        for seed in range(seeds):
            target = random_multihead(d, H, d_h, seed=seed, scale=scale, bias=bias)
            try:
                res = extract_generic(Oracle(target, d), bias=bias, seed=seed)
            except AttnprobeError as exc:
                fails[type(exc).__name__] += 1
                continue
            e = match_heads(target, res.model).worst if res.model.H == H else np.inf
            if res.model.H != H:
                fails[f"found {res.model.H} heads"] += 1
            ok += e <= 1e-6
            worst = max(worst, e)
            qs.append(res.queries)
        print(f"d={d:2d} H={H} d_h={d_h:2d} scale={scale:3.1f} bias={bias!s:5}: {ok}/{seeds} ≤1e-6, worst {worst:.1e}, "
              f"median queries {int(np.median(qs)) if qs else 0} (bound {4 * H * d * d - 2 * H + 1}), failures "
              f"{dict(fails)}", flush=True)
