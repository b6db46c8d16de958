"""The learners' own time against the time the numpy model takes to answer their queries.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/learner_overhead.py [--runs exact lowrank multihead vector]
        [--repeat 3] [--write]

The model's callable is wrapped in a timer (time spent inside the model); everything else of the extraction's
wall time (probe construction, the oracle's counting and validation, solves, the functional check's own work) is
the learner's. Goal: learner ÷ model ≤ 0.25. Each setting runs ``--repeat`` times; the summary gives the median
ratio by wall clock and by CPU time (the process's, less sensitive to other processes on the machine), with
``uptime`` printed before and after. The queries and the recovered parameters' error are printed beside the
times so a speed-up that changes results shows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import numpy as np

from attnprobe.learners.core.estimate import estimate_queries
from attnprobe.learners.head.exact import extract_exact
from attnprobe.learners.head.lowrank import extract_lowrank
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.models.compare import relative_error
from attnprobe.models.multihead import match_heads
from attnprobe.oracles.base import Oracle
from attnprobe.reports import Table
from sections import command_line, write_section
from attnprobe.targets import minilm_head, random_head
from attnprobe.targets.minilm import minilm_layer

DOC = "overhead"  # its results file: docs/benchmarks/overhead.md
TITLE = "Learner overhead: the learner's own time ÷ the numpy model's time answering it"


class Timed:
    """A model's callable with the seconds (wall and CPU) spent inside it (the precision it declares is kept)."""

    def __init__(self, model):
        self.model, self.seconds, self.cpu, self.calls = model, 0.0, 0.0, 0
        self.dtype = getattr(model, "dtype", None)

    def __call__(self, X):
        t0, c0 = time.perf_counter(), time.process_time()
        y = self.model(X)
        self.seconds += time.perf_counter() - t0
        self.cpu += time.process_time() - c0
        self.calls += 1
        return y


def _exact():
    h = random_head(384, seed=0)
    return h, lambda o: extract_exact(o, seed=0), lambda res: relative_error(res.model.W, h.W)


def _ffn():
    from attnprobe.learners.ffn import extract_ffn
    from attnprobe.targets import random_relu_net

    net = random_relu_net(8, 32, seed=0)
    return net, lambda o: extract_ffn(o, seed=0), lambda res: float("nan")


def _lowrank():
    h = minilm_head(0, 1)
    return h, lambda o: extract_lowrank(o, rank=32), lambda res: relative_error(res.model.W, h.W)


def _multihead():
    truth = minilm_layer(0, 0)

    def err(res):
        m = match_heads(truth, res.model) if res.model.H == truth.H else None
        return m.worst if m else float("nan")
    return truth, lambda o: extract_generic(o, rank=32, seed=0), err


def _multihead_factor():
    """The same layer evaluated through its rank-32 factors (10x faster than the dense einsum)."""
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from multihead_generic import FactorForm

    truth, learn, err = _multihead()
    fast = FactorForm(truth, 32)
    fast.dtype = None
    return fast, learn, err


def _multihead_vector():
    """The whole 384-number output row of MiniLM layer 0 (vector answers)."""
    from attnprobe.learners.multihead.vector import extract_vector
    from attnprobe.models.multihead import MultiHeadAttention
    from attnprobe.targets.hf import hf_layer_arrays, minilm_dir

    truth = MultiHeadAttention.from_arrays(hf_layer_arrays(minilm_dir(), 0))
    return truth, lambda o: extract_vector(o, seed=0), lambda res: match_heads(truth, res.model).worst


#: what extract --estimate is told for each run
ESTIMATE = {"exact": ("exact", 384, {}), "lowrank": ("lowrank", 384, {"rank": 32}),
            "multihead": ("multihead", 384, {"heads": 12, "rank": 32}),
            "multihead-factor": ("multihead", 384, {"heads": 12, "rank": 32}), "ffn": ("ffn", 8, {"hidden": 32}),
            "vector": ("multihead", 384, {"heads": 12, "outputs": 384})}


RUNS = {"exact": ("exact d=384 random head", _exact), "lowrank": ("lowrank MiniLM L0H1, rank 32", _lowrank),
        "multihead": ("multi-head (generic) MiniLM layer 0 row 0, rank 32 given", _multihead),
        "vector": ("vector-answer multi-head MiniLM layer 0, whole output row (K = 384)", _multihead_vector),
        "ffn": ("ffn d=8 m=32 (ReLU network)", _ffn),
        "multihead-factor": ("the same, the layer evaluated through its rank-32 factors", _multihead_factor)}


def measure(name: str):
    setting, make = RUNS[name]
    model, learn, err = make()
    timed = Timed(model)
    oracle = Oracle(timed, getattr(model, "d", None) or model.A.shape[0])
    load0, t0, c0 = os.getloadavg()[0], time.perf_counter(), time.process_time()
    res = learn(oracle)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    own, own_cpu = wall - timed.seconds, cpu - timed.cpu
    est = estimate_queries(ESTIMATE[name][0], ESTIMATE[name][1], **ESTIMATE[name][2]) if name in ESTIMATE else None
    said = "—" if est is None else f"{est.queries} ({est.queries / oracle.queries - 1:+.1%})"
    return [setting, oracle.queries, said, timed.calls, f"{err(res):.2e}", round(wall, 2), round(timed.seconds, 2),
            round(own, 2), round(own / timed.seconds, 3), round(own_cpu / timed.cpu, 3),
            round((load0 + os.getloadavg()[0]) / 2, 1)]


def uptime() -> str:
    """The machine's ``uptime`` line (its load averages), or the load averages alone where there is none."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", default=["exact", "lowrank", "multihead", "vector"], choices=list(RUNS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    cols = ["setting", "queries asked (checks included)", "--estimate (off by)", "model calls", "error", "wall s",
            "model s", "learner s", "learner ÷ model", "learner ÷ model (CPU)", "load avg"]
    before = uptime()
    print(before, flush=True)
    print("| " + " | ".join(cols) + " |", flush=True)
    runs = {}
    for name in args.runs:
        for _ in range(args.repeat):
            r = measure(name)
            runs.setdefault(name, []).append(r)
            print("| " + " | ".join(map(str, r)) + " |", flush=True)
    after = uptime()
    summary = Table(["setting", "queries", "error", f"learner ÷ model, median of {args.repeat}",
                     "the same by CPU time", "runs (wall)", "load avg"])
    for name, rows in runs.items():
        summary.add(rows[0][0], rows[0][1], rows[0][4], statistics.median(r[8] for r in rows),
                    statistics.median(r[9] for r in rows), " / ".join(f"{r[8]:.2f}" for r in rows),
                    " / ".join(str(r[10]) for r in rows))
    print(after)
    print(summary.markdown(), flush=True)
    if args.write:
        write_section(TITLE, f"Goal learner ÷ model ≤ 0.25.\n\n`uptime` before: {before}; after: {after}\n\n"
                      + summary.markdown(), command_line(), doc=DOC)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
