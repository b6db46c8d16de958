"""How far the ReLU-network learner's query count spreads over seeds on float64 answers, and why.

    PYTHONPATH=src python benchmarks/ffn_count_spread.py [--seeds 20] [--first-seed 0] [--heavy] [--write]

For each float64 ffn target of ``benchmarks/estimate.py`` (the same nets and seeds; ``--heavy`` adds the 784-wide
nets): the queries of every run (check included), their mean and largest ÷ smallest (an estimate from d, m and K
alone can be within 10 % of every seed only while that ratio is at most 1.1/0.9 = 1.22), the kink search's
queries per hidden unit, the kinks bracketed down to the minimal width, the regions re-measured off the line,
the worst functional-check error and the checks passed. Run it with another tree on ``PYTHONPATH`` for a before.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from attnprobe.learners.core.estimate import estimate_queries
from attnprobe.reports import Table
from estimate import against_real, ffn_run, print_and_write

DOC = "ffn"  # its results file: docs/benchmarks/ffn.md
TITLE = "FFN learner on float64 answers: the query count's spread over seeds"


def targets(heavy: bool):
    """(name, d, m, K, bias, net seed or None): the float64 ffn targets of benchmarks/estimate.py."""
    out = [("learner_overhead.py net d=8, m=32 (bias-free)", 8, 32, 1, False, 0)]
    out += [(f"d={d}, m={m}, bias-free net", d, m, 1, False, None)
            for d, m in ((8, 4), (8, 8), (8, 32), (32, 16), (32, 32), (64, 32), (64, 64))]
    out += [(f"d={d}, m={m}, K={K}, biases", d, m, K, True, None)
            for d in ((16, 64, 784) if heavy else (16, 64)) for m in (16, 64) for K in (1, 10)]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--heavy", action="store_true")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    table = Table(["target", "seeds", "queries (check included)", "mean", "largest ÷ smallest", "estimate",
                   "estimate ÷ real − 1", "within 10 %", "kink search per unit", "kinks at min. width",
                   "regions re-measured", "worst check error", "checks passed"])
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for name, d, m, K, bias, net_seed in targets(args.heavy):
        runs = [ffn_run(d, m, K, bias, s, net_seed=net_seed) for s in seeds]
        q = np.array([o.queries for o, _ in runs])
        search = np.array([r.queries_by_phase.get("kink_search", 0) for _, r in runs])
        tight = np.array([r.details["kinks_at_min_width"] for _, r in runs])
        redo = np.array([r.details.get("regions_re_measured", 0) for _, r in runs])
        est = estimate_queries("ffn", d, hidden=m, outputs=None if K == 1 else K).queries
        table.add(name, len(q), f"{q.min()} – {q.max()}", f"{q.mean():.0f}", f"{q.max() / q.min():.2f}", est,
                  *against_real(est, q), f"{np.mean(search) / m:.1f}", f"{tight.sum()} ({tight.max()})",
                  f"{redo.sum()} ({redo.max()})", f"{max(r.check.error for _, r in runs):.1e}",
                  f"{sum(r.check.passed for _, r in runs)}/{len(runs)}")
        print("| " + " | ".join(map(str, table.rows[-1])) + " |", flush=True)
    print_and_write(TITLE, table.markdown() + f"\n\nLoad average at the end: {os.getloadavg()[0]:.1f}.",
                    "ffn_count_spread.py", argv, args.write, doc=DOC)


if __name__ == "__main__":
    main()
