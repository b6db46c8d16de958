"""Research: the whole generic pipeline (values, isolated, cross) on random heads and MiniLM.

PYTHONPATH=src python benchmarks/research/generic_pipeline.py [--minilm]
"""
from __future__ import annotations

import sys
import time

import numpy as np

from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.models.multihead import match_heads
from attnprobe.oracles.base import Oracle
from attnprobe.targets.multihead import random_multihead


def run(name, m, **kw):
    o = Oracle(m, m.d)
    t = time.perf_counter()
    res = extract_generic(o, **kw)
    mt = match_heads(m, res.model) if res.model.H == m.H else None
    print(f"{name:30s} H={m.H:2d}/{res.model.H:2d} worst={mt.worst if mt else float('nan'):.2e} "
          f"W={np.max(mt.W) if mt else 0:.1e} v={np.max(mt.v) if mt else 0:.1e} u={np.max(mt.u) if mt else 0:.1e} "
          f"c={mt.c if mt else 0:.1e} check={res.check.error:.1e} q={res.queries} "
          f"{res.details['queries_by_phase']} bound={4*m.H*m.d**2-2*m.H+1} t={time.perf_counter()-t:.1f}s", flush=True)
    return res


if __name__ == "__main__":
    if "--minilm" in sys.argv:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from mh_common import fast_minilm_layer
        run("MiniLM L0 row 0", fast_minilm_layer(0, 0), rank=32)
    else:
        for d, H in [(8, 2), (8, 4), (16, 3), (16, 4), (32, 4), (64, 4)]:
            for seed in range(2):
                run(f"random d={d} full-rank seed={seed}", random_multihead(d, H, d, seed=seed))
            run(f"random d={d} d_h={d // H} seed=0", random_multihead(d, H, seed=0))
