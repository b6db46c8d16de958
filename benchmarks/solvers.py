"""Which cvxpy solver for program (2) (nuclear-norm minimisation under rank-one measurements).

    python benchmarks/solvers.py

Same measurements for every solver (bias-free rank-r head, m = 3·r·2d, tolerances 1e-9); writes
its subsection of "Low-rank heads (Thm 5.1)" in docs/benchmarks/lowrank.md.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from attnprobe.learners.head.nuclear import nuclear_solve
from attnprobe.reports import Table
from sections import command_line, write_section
from attnprobe.targets import random_head

warnings.simplefilter("ignore")


DOC = "lowrank"  # its results file: docs/benchmarks/lowrank.md


def main():
    t = Table(["d", "r", "m", "solver", "status", "rel. error W", "seconds"])
    for d, r in [(16, 1), (32, 2), (64, 4)]:
        h = random_head(d, rank=r, seed=1, bias=False)
        rng = np.random.default_rng(0)
        m = 3 * 2 * d * r
        A, B = rng.standard_normal((m, d)) / np.sqrt(d), rng.standard_normal((m, d)) / np.sqrt(d)
        y = np.sum((A @ h.W) * B, axis=1)
        for solver in ("SCS", "CLARABEL"):
            t0 = time.perf_counter()
            W, _, info = nuclear_solve(A, B, y, solver, 1e-9)
            t.add(d, r, m, solver, info["status"], f"{np.linalg.norm(W - h.W) / np.linalg.norm(h.W):.1e}",
                  f"{time.perf_counter() - t0:.1f}")
            print(t.rows[-1], flush=True)
    write_section("Solver for program (2)", "(m = 3·r·2d Gaussian rank-one measurements of a bias-free rank-r "
                  "head, solver tolerances 1e-9; seconds are wall time on shared cores, noisy)\n\n" + t.markdown(),
                  command_line(), parent="Low-rank heads (Thm 5.1)", doc=DOC)


if __name__ == "__main__":
    main()
