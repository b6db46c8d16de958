"""Scale: `lowrank` at d = 1024, r = 64 — seconds (split into oracle and learner) and peak memory.

    python benchmarks/scale.py

Writes benchmarks/results/scale.json (read by `python benchmarks/lowrank.py --report-only`).
"""

from __future__ import annotations

import json
import resource
import time
import tracemalloc
from pathlib import Path

import numpy as np

from attnprobe.learners.lowrank import extract_lowrank
from attnprobe.oracles import Oracle
from attnprobe.targets import random_head

ROOT = Path(__file__).resolve().parents[1]


def main(d=1024, r=64):
    h = random_head(d, rank=r, seed=1)
    out = {"d": d, "r": r, "rss_before_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    for rank in (r, None):
        spent = [0.0]

        def fn(X):
            t = time.perf_counter()
            y = h(X)
            spent[0] += time.perf_counter() - t
            return y

        o = Oracle(fn, d)
        tracemalloc.start()
        t0 = time.perf_counter()
        res = extract_lowrank(o, rank=rank)
        secs = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[str(rank)] = dict(seconds=secs, oracle_seconds=spent[0], learner_seconds=secs - spent[0],
                              queries=res.queries, errW=float(np.linalg.norm(res.model.W - h.W) / np.linalg.norm(h.W)),
                              detected=res.details["detected_rank"], traced_peak_mb=peak / 2**20,
                              check=res.check.error)
        print(rank, out[str(rank)], flush=True)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (ROOT / "benchmarks" / "results" / "scale.json").write_text(json.dumps(out, indent=1))
    print(out)


if __name__ == "__main__":
    main()
