"""Scale: `lowrank` at d = 1024, r = 64 — seconds (split into oracle and learner) and peak memory; with
``--sweep``, queries and seconds against d for exact, lowrank (r = 64) and multi-head (heads of 64, rank given),
with the exponent of a log-log least-squares fit.

    python benchmarks/scale.py
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/scale.py --sweep [--dims 128 256 512 768 1024] [--write]

Writes benchmarks/results/scale.json (read by `python benchmarks/lowrank.py --report-only`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from attnprobe.learners.head.lowrank import extract_lowrank
from attnprobe.oracles import Oracle
from attnprobe.targets import random_head

sys.path.insert(0, os.path.dirname(__file__))
from learner_overhead import Timed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


DOC = "overhead"  # its results file: docs/benchmarks/overhead.md


def main(d=1024, r=64):
    h = random_head(d, rank=r, seed=1)
    out = {"d": d, "r": r, "rss_before_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    for rank in (r, None):
        timed = Timed(h)
        o = Oracle(timed, d)
        tracemalloc.start()
        t0 = time.perf_counter()
        res = extract_lowrank(o, rank=rank)
        secs = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[str(rank)] = dict(seconds=secs, oracle_seconds=timed.seconds, learner_seconds=secs - timed.seconds,
                              queries=res.queries, errW=float(np.linalg.norm(res.model.W - h.W) / np.linalg.norm(h.W)),
                              detected=res.details["detected_rank"], traced_peak_mb=peak / 2**20,
                              check=res.check.error)
        print(rank, out[str(rank)], flush=True)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (ROOT / "benchmarks" / "results" / "scale.json").write_text(json.dumps(out, indent=1))
    print(out)


SWEEP = {"exact": (128, 256, 512, 768), "lowrank": (128, 256, 512, 768, 1024), "multihead": (128, 256)}


def _run(method, d):
    from attnprobe.learners.head.exact import extract_exact
    from attnprobe.learners.multihead.generic import extract_generic
    from attnprobe.targets.multihead import random_multihead

    if method == "exact":
        model, learn = random_head(d, seed=1), lambda o: extract_exact(o, seed=1)
    elif method == "lowrank":
        model, learn = random_head(d, rank=64, seed=1), lambda o: extract_lowrank(o, rank=64)
    else:
        model, learn = random_multihead(d, d // 64, seed=0), lambda o: extract_generic(o, rank=64, seed=0)
    timed = Timed(model)
    o = Oracle(timed, d)
    t0 = time.perf_counter()
    res = learn(o)
    return o.queries, time.perf_counter() - t0, timed.seconds, bool(res.check.passed)


def sweep(dims, write):
    from attnprobe.reports import Table
    from sections import command_line, write_section

    table = Table(["method", "d", "queries", "seconds", "model s", "check passed", "load avg"])
    fits = []
    for method, todo in SWEEP.items():
        pts = []
        for d in dims:
            if d not in todo:
                table.add(method, d, "not run", "—", "—", "—", "—")
                continue
            q, sec, model_s, ok = _run(method, d)
            pts.append((d, q, sec))
            table.add(method, d, q, round(sec, 1), round(model_s, 1), ok, round(os.getloadavg()[0], 1))
            print(table.rows[-1], flush=True)
        if len(pts) >= 2:
            logd = np.log([p[0] for p in pts])
            eq, et = (float(np.polyfit(logd, np.log([p[k] for p in pts]), 1)[0]) for k in (1, 2))
            fits.append(f"{method}: queries ∝ d^{eq:.2f}, seconds ∝ d^{et:.2f} "
                        f"(d = {', '.join(str(p[0]) for p in pts)})")
    body = table.markdown() + "\n\nLog-log least-squares exponents: " + "; ".join(fits) + "."
    print(body)
    if write:
        write_section("Scale: queries and seconds against d", body, command_line(), doc=DOC)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--dims", type=int, nargs="+", default=[128, 256, 512, 768, 1024])
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    sweep(a.dims, a.write) if a.sweep else main()
