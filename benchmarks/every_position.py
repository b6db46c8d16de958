"""The vector multi-head learner on every-position answers: real MiniLM-L6 layers answering the output row at every
position (bidirectional, no position terms), against the same layer read at the last position; and a GQA layer.

    PYTHONPATH=src python benchmarks/every_position.py minilm [--layers 2] [--answers last every causal]
    PYTHONPATH=src python benchmarks/every_position.py hf [--layers 2]      # transformers' module, float32
    PYTHONPATH=src python benchmarks/every_position.py gqa [--answers last every]  # 8 query / 2 KV heads vs 8/8
    PYTHONPATH=src python benchmarks/every_position.py llama  # transformers' LlamaAttention, rotation off

Prints one markdown table per run: sequences (queries), rows answered, errors (relative, worst head after
matching heads up to permutation), the information limit (low-rank degrees of freedom / K numbers per row / N rows
per sequence, N the longest sequence the learner sends) and the phases.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from attnprobe.learners.multihead.vector import extract_vector
from attnprobe.models.every_position import EveryPositionLayer
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.oracles.base import Oracle

HEADER = ("| target | answers | sequences | rows | info. limit (rows) | info. limit (sequences of N) | W_h | u_h | V_h "
          "| check | phases | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def minilm_layer(layer: int) -> MultiHeadAttention:
    from attnprobe.targets.hf import hf_layer_arrays, minilm_dir

    return MultiHeadAttention.from_arrays(hf_layer_arrays(minilm_dir(), layer))


class LongestSequence:
    """An every-position callable that remembers the longest sequence it answered (for the information limit)."""

    def __init__(self, fn):
        self.fn, self.longest = fn, 1
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, X):
        self.longest = max(self.longest, X.shape[1])
        return self.fn(X)


def row(name, answers, true, fn, precision=None, seed=0, head_dim=None):
    watch = LongestSequence(fn)
    oracle = Oracle(watch, true.d, precision=precision)
    t0 = time.perf_counter()
    res = extract_vector(oracle, seed=seed)
    sec = time.perf_counter() - t0
    m = match_heads(true, res.model)
    H, K, d = true.v.shape
    r = head_dim or d // H
    unknowns = MultiHeadAttention.low_rank_unknowns(d, H, r, K)
    phases = ", ".join(f"{k} {v}" for k, v in res.queries_by_phase.items())
    rows = res.details["rows"]
    N = watch.longest if answers != "last" else 1
    return (f"| {name} | {answers} | {res.queries} | {rows} | {unknowns / K:.0f} | {unknowns / (K * N):.0f} "
            f"(N = {N}) | {np.max(m.W):.1e} | {np.max(m.u):.1e} | {np.max(m.v):.1e} | "
            f"{'passed' if res.check.passed else 'FAILED'} {res.check.error:.1e} | {phases} | {sec:.0f} |"), res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["minilm", "hf", "gqa", "llama"])
    ap.add_argument("--layers", type=int, nargs="*", default=[2])
    ap.add_argument("--answers", nargs="*", default=["last", "every"], choices=["last", "every", "causal"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"load: {os.getloadavg()[0]:.1f} (2 cores shared)")
    print(HEADER)
    if args.what == "minilm":
        for L in args.layers:
            true = minilm_layer(L)
            for answers in args.answers:
                fn = true if answers == "last" else EveryPositionLayer(true, causal=answers == "causal")
                print(row(f"MiniLM layer {L}, numpy float64", answers, true, fn, seed=args.seed)[0], flush=True)
    elif args.what == "hf":
        from attnprobe.targets.every_position import minilm_transformers_rows

        for L in args.layers:
            true = minilm_layer(L)
            for answers in args.answers:
                fn = minilm_transformers_rows(L, "float32", every=answers != "last")
                print(row(f"MiniLM layer {L}, transformers float32", answers, true, fn, precision="auto",
                          seed=args.seed)[0], flush=True)
    elif args.what == "llama":  # transformers' LlamaAttention, rotation off; its softmax is float32
        from attnprobe.targets.every_position import LlamaRows

        for kv in (8, 2):
            fn = LlamaRows(64, 8, kv, seed=args.seed)
            line, res = row(f"LlamaAttention d=64, 8 query heads / {kv} KV heads, no rotation", "every", fn.truth(),
                            fn, precision="float32", seed=args.seed, head_dim=8)
            print(line, f"groups {res.details['groups']}, value rank {res.details['value_rank']}, "
                  f"differences {res.details['differences']}, result numbers {res.details['result_numbers']}",
                  flush=True)
    else:
        from attnprobe.targets.every_position import gqa_layer

        for answers in args.answers:
            for kv in (8, 2):
                true = gqa_layer(64, 8, kv, seed=args.seed)
                fn = true if answers == "last" else EveryPositionLayer(true, causal=answers == "causal")
                line, res = row(f"LLaMA-style d=64, 8 query heads / {kv} KV heads, no rotation", answers, true, fn,
                                seed=args.seed, head_dim=8)
                print(line, f"groups {res.details['groups']}, value rank {res.details['value_rank']}, "
                      f"differences {res.details['differences']}, result numbers {res.details['result_numbers']}",
                      flush=True)


if __name__ == "__main__":
    main()
