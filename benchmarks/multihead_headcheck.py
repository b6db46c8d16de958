"""Does the per-head check bound the heads' error? Recovered layers are simulated by perturbing every head of a
known layer (W_h, v_h, u_h each by a random relative error in [0.1, 1]·level); the check then runs against the
true layer as the oracle. Prints, per configuration, how often the reported bound falls below the true error
(max of the relative W, v, u errors, Hungarian-matched) and the spread of bound / truth.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_headcheck.py [--trials 100] [--write]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from attnprobe.learners.multihead.headcheck import check_heads
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.oracles.base import Oracle
from attnprobe.reports import Table
from sections import command_line, write_section
from attnprobe.targets.multihead import random_multihead

sys.path.insert(0, os.path.dirname(__file__))
from multihead_generic import FactorForm  # noqa: E402

DOC = "multihead"  # its results file: docs/benchmarks/multihead.md
TITLE = "Multi-head: the per-head check against the true head errors"


def _perturbed(t: MultiHeadAttention, level: float, rng) -> MultiHeadAttention:
    def bump(a, axes):
        e = rng.standard_normal(a.shape)
        s = level * rng.uniform(0.1, 1.0, a.shape[0])
        e *= (s * np.linalg.norm(a, axis=axes) / np.linalg.norm(e, axis=axes)).reshape((-1,) + (1,) * len(axes))
        return a + e
    return MultiHeadAttention(bump(t.W, (1, 2)), bump(t.v, (1,)), bump(t.u, (1,)), t.c)


def rows(trials: int, minilm: bool):
    rng = np.random.default_rng(0)
    configs = [(16, 2, None, "float64"), (32, 4, None, "float64"), (64, 4, 64, "float64"), (32, 4, None, "float32")]
    out = []
    for d, H, dh, dtype in configs + ([("minilm", 12, 32, "float64")] if minilm else []):
        ratios, under = [], 0
        for k in range(trials if d != "minilm" else max(1, trials // 10)):
            if d == "minilm":
                from attnprobe.targets.minilm import minilm_layer

                t = minilm_layer(k % 6, 0)
                oracle = Oracle(FactorForm(t, 32), t.d)
            else:
                t = random_multihead(d, H, dh, seed=k)
                oracle = Oracle(t.with_dtype(dtype), d, precision=dtype)
            level = 10.0 ** rng.uniform(-9 if dtype == "float64" else -4, -2)
            m = _perturbed(t, level, rng)
            hc = check_heads(oracle, m, rng)
            truth = match_heads(t, m)
            true = np.maximum(np.maximum(truth.W, truth.v), truth.u)  # per true head, matched to m's order
            got = hc.bound[truth.perm]
            r = got / true
            ratios.extend(r.tolist())
            under += int(np.sum(r < 1))
        ratios = np.array(ratios)
        out.append([d if d != "minilm" else "MiniLM L0-5", H, dh or d // H, dtype, ratios.size, under,
                    float(np.min(ratios)), float(np.median(ratios)), float(np.max(ratios))])
        print(out[-1], flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--minilm", action="store_true", help="also MiniLM layers (trials/10)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    table = Table(["d", "H", "d_h", "answers", "heads checked", "bound < true error", "min bound/true",
                   "median bound/true", "max bound/true"], rows(args.trials, args.minilm))
    body = ("Each trial perturbs every head of a random layer by a random relative error (level log-uniform in "
            "[1e-9, 1e-2], 1e-4 for float32) and runs `check_heads` against the true layer.\n\n" + table.markdown())
    print(body)
    if args.write:
        write_section(TITLE, body, command_line(), doc=DOC)


if __name__ == "__main__":
    main()
