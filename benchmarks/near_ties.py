"""Nearly tied heads under the whole-row (vector) multi-head learner: two heads (d = 8, K = 8) whose ``(W_h, u_h)``
differ by ``gap`` per entry. Per run: their relative distance, the heads returned (a near tie closer than
``eps^(1/4)`` is merged into one head holding the sum of the V_h), the check's verdict and error, and, where two
heads come back, the worst V_h error against the truth (heads matched up to permutation).

    PYTHONPATH=src python benchmarks/near_ties.py [--seeds 3] [--write]
"""

from __future__ import annotations

import argparse

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners.multihead import extract_multihead
from attnprobe.learners.multihead.vector import tie_distance
from attnprobe.models.multihead import MultiHeadAttention
from attnprobe.oracles.base import Oracle
from attnprobe.reports import Table
from attnprobe.targets.multihead import random_multihead
from sections import command_line, write_section

DOC = "verdicts"  # its results file: docs/benchmarks/verdicts.md
TITLE = "Nearly tied heads: value maps against the heads' distance, and the merge"
GAPS = {"float64": (1e-3, 1e-4, 1e-5, 1e-6, 1e-8), "float32": (1e-1, 1e-2, 1e-3)}


def near_tie(gap, seed, precision, K=8):
    m = random_multihead(8, 2, seed=seed)
    rng = np.random.default_rng(100 + seed)
    W, u = m.W.copy(), m.u.copy()
    W[1] = W[0] + gap * rng.standard_normal((8, 8))
    u[1] = u[0] + gap * rng.standard_normal(8)
    return MultiHeadAttention(W, rng.standard_normal((2, K, 8)) / np.sqrt(8), u, rng.standard_normal(K),
                              dtype=precision)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    table = Table(["answers", "gap per entry", "seed", "(W, u) distance", "tie below", "heads returned",
                   "verdict", "check error", "worst V_h error"])
    for precision, gaps in GAPS.items():
        for gap in gaps:
            for seed in range(a.seeds):
                t = near_tie(gap, seed, precision)
                dist = float(np.linalg.norm(np.concatenate([(t.W[0] - t.W[1]).ravel(), t.u[0] - t.u[1]]))
                             / np.linalg.norm(np.concatenate([t.W[0].ravel(), t.u[0]])))
                limit = tie_distance(np.finfo(precision).eps)
                try:
                    res = extract_multihead(Oracle(t, 8, precision=precision), seed=0)
                except AttnprobeError as exc:
                    table.add(precision, gap, seed, dist, limit, "refused", type(exc).__name__, None, None)
                    continue
                got = res.model
                verr = None
                if got.H == 2:
                    verr = min(max(np.linalg.norm(got.v[h] - t.v[p[h]]) / np.linalg.norm(t.v[p[h]]) for h in (0, 1))
                               for p in ((0, 1), (1, 0)))
                table.add(precision, gap, seed, dist, limit, got.H, res.check.verdict, res.check.error, verr)
    print(table.markdown())
    if a.write:
        write_section(TITLE, table.markdown(), command_line(), doc=DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
