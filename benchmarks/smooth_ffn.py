"""The smooth FFN learner (``--method ffn`` on GELU, tanh-GELU and SiLU FFNs) on random FFNs and MiniLM's.

    PYTHONPATH=src python benchmarks/smooth_ffn.py [--cases 16-48-16-gelu 32-96-8-silu-nobias ...]
        [--precision float64|float32] [--minilm LAYER] [--hidden]

A case ``d-m-K-act[-nobias]`` is a seeded :func:`attnprobe.targets.random_smooth_ffn` (weights at 1/√fan-in);
``--minilm L`` adds MiniLM-L6 layer L's real GELU FFN (384 → 1536 → 384). Each is learned through
``--method ffn``'s dispatch (activation detected; ``--hidden`` gives the width instead of searching it).
Reported: queries, unknowns, seconds, the activation found, the largest relative error over 1000 fresh N(0, I)
inputs (max |ŷ − y| / max |y|), the neurons' largest relative errors up to order, and the learner's check.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnprobe.learners.smooth_ffn.dispatch import extract_ffn_any
from attnprobe.models.smooth_ffn import neuron_match
from attnprobe.oracles import Oracle
from attnprobe.targets import random_smooth_ffn


def target(case: str, precision: str):
    if case.startswith("minilm"):
        from attnprobe.targets import minilm_ffn

        return minilm_ffn(int(case[6:]), precision)
    parts = case.split("-")
    d, m, K = map(int, parts[:3])
    return random_smooth_ffn(d, m, K, activation=parts[3], bias="nobias" not in parts, seed=d + m, dtype=precision)


def one(case: str, precision: str, hidden: bool) -> str:
    truth = target(case, precision)
    oracle = Oracle(truth, truth.d, precision=precision)
    t0 = time.perf_counter()
    res = extract_ffn_any(oracle, seed=0, hidden=truth.m if hidden else None,
                          bias=not np.allclose(truth.b1, 0) or not np.allclose(truth.b2, 0))
    secs = time.perf_counter() - t0
    X = np.random.default_rng(1).standard_normal((1000, truth.d))
    y = truth.with_dtype("float64").forward(X)
    err = np.abs(res.model.forward(X) - y).max() / np.abs(y).max()
    match = neuron_match(truth, res.model)
    return (f"| {case} | {precision} | {res.queries:,} | {res.unknowns:,} | {res.queries / res.unknowns:.2f} | "
            f"{res.details['activation']} | {res.details['hidden']} | {err:.1e} | {match['first_layer_error']:.1e} / "
            f"{match['second_layer_error']:.1e} | {'yes' if res.passed else 'NO'} | {secs:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="*", default=["16-48-16-gelu", "32-96-8-silu-nobias", "64-128-64-gelu_tanh"])
    ap.add_argument("--precision", default="float64", choices=["float64", "float32"])
    ap.add_argument("--minilm", type=int, help="add MiniLM-L6 layer L's GELU FFN")
    ap.add_argument("--hidden", action="store_true", help="give the hidden width (no width search)")
    args = ap.parse_args()
    cases = list(args.cases) + ([f"minilm{args.minilm}"] if args.minilm is not None else [])
    print("| case d-m-K | answers | queries | unknowns | queries/unknown | activation found | m found | "
          "fresh max error | neurons W1,b1 / W2 error | check | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        print(one(case, args.precision, args.hidden), flush=True)


if __name__ == "__main__":
    main()
