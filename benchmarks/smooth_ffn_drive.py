"""The smooth FFN learner's drive start measured against the truth: the factors ``w2_i ⊗ U w1_i`` read from the
bends of float32 answers on circles far from the origin (:mod:`attnprobe.learners.smooth_ffn.drive_start`).

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/smooth_ffn_drive.py [--cases 16-48-16 minilm2:192]
        [--directions M] [--factor-directions C] [--samples N] [--radius R]

Per case: M random unit directions (``circles(M)`` circles of N answers each, radius R·√d; then the circles aimed
at units left open), the factors on the first C of them (default: the learner's C), compared with the true ones
(1 − |cos| of each true factor to the nearest found; the m best-supported found factors, as the learner keeps
them). Cases: ``d-m-K`` random GELU nets (``random_smooth_ffn``, seed d + m) or ``minilm2[:k]`` (MiniLM-L6
layer 2's real GELU FFN, its first k units).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnprobe.learners.smooth_ffn import learner as plain
from attnprobe.learners.smooth_ffn.derivatives import Asker
from attnprobe.learners.smooth_ffn.drive_start import circles, drive_factors
from attnprobe.oracles import Oracle
from attnprobe.targets import minilm_ffn, random_smooth_ffn


def target(case: str):
    if case.startswith("minilm"):
        layer, _, k = case[6:].partition(":")
        return minilm_ffn(int(layer), "float32", neurons=int(k) if k else None)
    d, m, K = map(int, case.split("-")[:3])
    return random_smooth_ffn(d, m, K, activation="gelu", seed=d + m, dtype="float32")


def one(case: str, M: int | None, C: int | None, N: int | None, radius: float) -> str:
    truth = target(case)
    t64 = truth.with_dtype("float64")
    d, m, K = truth.d, truth.m, truth.W2.shape[0]
    C = C or plain._directions(K, m)
    M = M or plain._drive_directions(C)
    N = N or plain.drive_samples(m)
    oracle = Oracle(truth, d, precision="float32")
    U = np.random.default_rng(0).standard_normal((M, d))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    t0 = time.perf_counter()
    A, info = drive_factors(Asker(oracle), U, C, radius * np.sqrt(d), N)
    secs = time.perf_counter() - t0
    truth_A = np.einsum("km,cm->kcm", t64.W2, U[:C] @ t64.W1.T).reshape(K * C, m)
    truth_A /= np.linalg.norm(truth_A, axis=0)
    cos = np.abs(truth_A.T @ A[:, :m])
    err = 1 - cos.max(1)
    within = int(np.sum(err < 1e-2))
    wrong = int(np.sum(1 - cos.max(0) > 1e-2))
    return (f"| {case} | {M} / {C} | {circles(M)} × {N:,} | {oracle.queries:,} | {A.shape[1]} of {m} | {within} | "
            f"{np.median(err):.1e} | {wrong} | {info['mixed_bends_read']:,} | {info['groups_by_consensus']} | "
            f"{info['aimed_circles']} ({info['aimed_found']}) | {secs:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="*", default=["16-48-16", "minilm2:192"])
    ap.add_argument("--directions", type=int, help="M: circles on every pair of M directions (default: C + 1)")
    ap.add_argument("--factor-directions", type=int, help="C: the factors' directions (default: the learner's)")
    ap.add_argument("--samples", type=int, help="answers per circle (default: the learner's)")
    ap.add_argument("--radius", type=float, default=plain.DRIVE_RADIUS, help="the circles' radius over √d")
    args = ap.parse_args()
    print("| case | directions M / C | circles × answers | queries | factors found | true units within 1e-2 "
          "(1 − cos) | median 1 − cos | found factors off > 1e-2 | bends read from mixed runs | groups by consensus | "
          "aimed circles (units found) | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case in args.cases:
        print(one(case, args.directions, args.factor_directions, args.samples, args.radius), flush=True)


if __name__ == "__main__":
    main()
