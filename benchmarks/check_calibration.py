"""Calibrate the functional check: errors of correct extractions vs. the tolerance, and of wrong models.

For each answer precision and declared noise, extract seeded random heads with the head learners and print the
check error (relative, on f − c), the tolerance and their ratio (a correct model must stay below 1); then the
same for a wrong model: an oracle whose query token is the FIRST row (not the last), which no head of the
paper's form matches (must be above 1 at every precision).

    python benchmarks/check_calibration.py [--seeds 3] [--d 6 12]
"""

from __future__ import annotations

import argparse

import numpy as np

from attnprobe import Oracle
from attnprobe.errors import AttnprobeError
from attnprobe.learners import extract_exact
from attnprobe.learners.head.lowrank import extract_lowrank
from attnprobe.learners.head.robust import extract_robust
from attnprobe.models import AttentionHead
from attnprobe.models.attention import attention_weights
from attnprobe.models.precision import resolve_dtype
from attnprobe.oracles.chain import AnswerChain
from attnprobe.targets import random_head

PRECISIONS = ("float64", "float32", "float16", "bfloat16")
WRAPS = ("none", "avq:1e-3", "gaussian:1e-3", "round:4", "round-digits:5")
LEARNERS = {"exact": lambda o, s: extract_exact(o, seed=s), "lowrank": lambda o, s: extract_lowrank(o, seed=s),
            "robust": lambda o, s: extract_robust(o, seed=s)}


class FirstRowQuery:
    """A head that attends with the FIRST row as its query token: not of the paper's form."""

    def __init__(self, head: AttentionHead, dtype: str):
        self.head, self.dt = head, resolve_dtype(dtype)

    def __call__(self, X):
        X = np.asarray(X, dtype=np.float64)
        Xr = X[:, ::-1, :].astype(self.dt)  # the first row becomes the last: it is the query token
        a = attention_weights(Xr, self.head.W.astype(self.dt), self.head.u.astype(self.dt))
        return ((a * (Xr @ self.head.v.astype(self.dt))).sum(-1) + self.dt.type(self.head.c)).astype(np.float64)


def row(label, res, truth=None):
    chk = res.check
    w = "" if truth is None else f"{np.linalg.norm(res.model.W - truth.W) / np.linalg.norm(truth.W):9.2e}"
    print(f"{label:<46} {chk.error:9.2e} {chk.tolerance:9.2e} {chk.error / chk.tolerance:8.2f} {w}")
    return chk.error / chk.tolerance


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--d", type=int, nargs="+", default=[6, 12])
    ap.add_argument("--learners", nargs="+", default=list(LEARNERS))
    args = ap.parse_args()
    print(f"{'correct models: learner precision noise d seed':<46} {'error':>9} {'tolerance':>9} {'ratio':>8} "
          f"{'W error':>9}")
    worst = {}
    for prec in PRECISIONS:
        for wname in WRAPS:
            for name in args.learners:
                for d in args.d:
                    for seed in range(args.seeds):
                        truth = random_head(d, seed=seed, dtype=prec)
                        oracle = Oracle(truth, d, precision=prec, chain=AnswerChain.parse(wname))
                        try:
                            res = LEARNERS[name](oracle, seed)
                        except AttnprobeError as exc:
                            print(f"{name} {prec} {wname} d={d} s={seed}: refused ({type(exc).__name__})")
                            continue
                        r = row(f"{name} {prec} {wname} d={d} s={seed}", res, truth)
                        worst[(name, prec, wname)] = max(worst.get((name, prec, wname), 0), r)
    print("\nwrong model (query token = first row), exact learner")
    for prec in PRECISIONS:
        for d in args.d:
            for seed in range(args.seeds):
                truth = random_head(d, seed=seed)
                oracle = Oracle(FirstRowQuery(truth, prec), d, precision=prec)
                try:
                    res = extract_exact(oracle, seed=seed)
                except AttnprobeError as exc:
                    print(f"wrong {prec} d={d} s={seed}: refused ({type(exc).__name__})")
                    continue
                row(f"wrong {prec} d={d} s={seed}", res)
    print("\nworst ratio of a correct model per (learner, precision, noise):")
    for k, v in sorted(worst.items(), key=lambda kv: -kv[1]):
        print(f"  {' '.join(k):<40} {v:8.2f}")


if __name__ == "__main__":
    main()
