"""Issue 3 benchmark: which cvxpy solver for program (2) (nuclear-norm minimisation under rank-one measurements).

    python benchmarks/issue3_solvers.py

Same measurements for every solver (bias-free rank-r head, m = 3·r·2d, tolerances 1e-9); writes
benchmarks/results/issue3_solvers.md.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np

from attnprobe.learners.nuclear import nuclear_solve
from attnprobe.targets import random_head

ROOT = Path(__file__).resolve().parents[1]
warnings.simplefilter("ignore")


def main():
    lines = ["Command: `python benchmarks/issue3_solvers.py` (m = 3·r·2d Gaussian rank-one measurements of a "
             "bias-free rank-r head, solver tolerances 1e-9; seconds are wall time on shared cores, noisy)", "",
             "| d | r | m | solver | status | rel. error W | seconds |", "|---|---|---|---|---|---|---|"]
    for d, r in [(16, 1), (32, 2), (64, 4)]:
        h = random_head(d, rank=r, seed=1, bias=False)
        rng = np.random.default_rng(0)
        m = 3 * 2 * d * r
        A, B = rng.standard_normal((m, d)) / np.sqrt(d), rng.standard_normal((m, d)) / np.sqrt(d)
        t = np.sum((A @ h.W) * B, axis=1)
        for solver in ("SCS", "CLARABEL"):
            t0 = time.perf_counter()
            W, _, info = nuclear_solve(A, B, t, solver, 1e-9)
            secs = time.perf_counter() - t0
            row = (f"| {d} | {r} | {m} | {solver} | {info['status']} | "
                   f"{np.linalg.norm(W - h.W) / np.linalg.norm(h.W):.1e} | {secs:.1f} |")
            lines.append(row)
            print(row, flush=True)
    text = "\n".join(lines) + "\n"
    (ROOT / "benchmarks" / "results" / "issue3_solvers.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
