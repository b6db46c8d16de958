"""The generic multi-head learner on a real MiniLM-L6 layer answered by the dense numpy model (all 12 heads,
d = 384, float64, head dimension 32 given): queries by phase, worst head error, wall and CPU seconds.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_minilm_dense.py --layers 0 5
"""

from __future__ import annotations

import argparse
import os
import time

from attnprobe.learners.multihead import extract_multihead
from attnprobe.models.compare import parameter_errors
from attnprobe.oracles import Oracle
from attnprobe.reports import Table
from attnprobe.targets import minilm_layer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[0])
    args = ap.parse_args()
    table = Table(["layer", "queries", "values", "isolated", "cross", "worst head error", "check error", "passed",
                   "wall s", "CPU s", "load avg (1 min)"])
    for layer in args.layers:
        truth = minilm_layer(layer)
        t0, c0 = time.perf_counter(), time.process_time()
        res = extract_multihead(Oracle(truth, truth.d), rank=32, method="generic")
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        ph = res.queries_by_phase
        table.add(layer, res.queries, ph.get("values"), ph.get("isolated"), ph.get("cross"),
                  parameter_errors(truth, res.model)["worst_head"], res.check.error, res.passed, round(wall, 1),
                  round(cpu, 1), round(os.getloadavg()[0], 1))
        print(table.markdown().splitlines()[-1], flush=True)
    print(table.markdown())


if __name__ == "__main__":
    main()
