"""Queries spent beyond the unknowns on small, steep (saturating) and low-rank heads, against the goal
``≤ 1.02 × unknowns`` for d ≥ 16 and ``≤ unknowns + 2`` below.

    PYTHONPATH=src python benchmarks/query_overhead.py [--seeds 10]

Prints one markdown table: setting, unknowns, queries (min / max over the seeds), the worst ratio, the goal and
whether every seed met it. ``scale`` is ``random_head``'s RMS attention logit on unit inputs (large = steep).
"""

from __future__ import annotations

import argparse

from attnprobe.learners.head.exact import extract_exact
from attnprobe.learners.head.lowrank import extract_lowrank
from attnprobe.oracles import Oracle
from attnprobe.targets import random_head


def goal(d: int, unknowns: int) -> int:
    return unknowns + 2 if d < 16 else int(1.02 * unknowns)


def row(setting: str, d: int, results) -> None:
    unknowns = results[0].unknowns
    qs = [r.queries for r in results]
    ok = all(r.check.passed for r in results)
    met = max(qs) <= goal(d, unknowns)
    print(f"| {setting} | {unknowns} | {min(qs)} / {max(qs)} | {max(qs) / unknowns:.3f} | ≤ {goal(d, unknowns)} | "
          f"{'yes' if met else 'no'} | {'all' if ok else 'NOT all'} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    print("| setting | unknowns | queries min / max | worst ratio | goal | met | check passed |")
    print("|---|---|---|---|---|---|---|")
    for d, seeds in ((1, args.seeds), (4, args.seeds), (16, max(1, args.seeds // 3)), (32, max(1, args.seeds // 3))):
        for scale in (None, 10.0, 300.0, 3000.0):
            heads = [random_head(d, seed=s) if scale is None else random_head(d, seed=s, scale=scale)
                     for s in range(seeds)]
            res = [extract_exact(Oracle(h, d), seed=0) for h in heads]
            row(f"exact d={d} scale {'default' if scale is None else f'{scale:g}'}", d, res)
    for rank in (6, None):
        res = [extract_lowrank(Oracle(random_head(96, rank=6, seed=s), 96), rank=rank, seed=0)
               for s in range(max(1, args.seeds // 3))]
        row(f"lowrank d=96 r=6 rank {'given' if rank else 'detected'}", 96, res)


if __name__ == "__main__":
    main()
