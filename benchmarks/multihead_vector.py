"""The vector-answer multi-head learner on whole output rows: real MiniLM-L6 layers (float64 and float32 numpy
models, the transformers module in float32), torch nn.MultiheadAttention, and a victim that clamps input rows.

    PYTHONPATH=src python benchmarks/multihead_vector.py minilm [--dtype float64] [--layers 0 1 2 3 4 5]
    PYTHONPATH=src python benchmarks/multihead_vector.py hf [--dtype float32] [--layers ...]
    PYTHONPATH=src python benchmarks/multihead_vector.py torch
    PYTHONPATH=src python benchmarks/multihead_vector.py clamp [--layers 0]

Prints one markdown table per run (errors are relative, worst head after matching heads up to permutation; the
information limit is the low-rank degrees of freedom divided by the K numbers each query answers).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from attnprobe.learners.multihead import extract_multihead
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.oracles.base import Oracle


def minilm_layer(layer: int) -> MultiHeadAttention:
    """All 12 heads of MiniLM-L6 layer ``layer``, the whole 384-dim output row (before residual and LayerNorm)."""
    from attnprobe.targets.hf import hf_layer_arrays, minilm_dir

    return MultiHeadAttention.from_arrays(hf_layer_arrays(minilm_dir(), layer))


def row(name, true, oracle, seed=0):
    t0 = time.perf_counter()
    res = extract_multihead(oracle, seed=seed)
    sec = time.perf_counter() - t0
    m = match_heads(true, res.model)
    H, K, d = true.v.shape
    r = d // H
    limit = MultiHeadAttention.low_rank_unknowns(d, H, r, K) / K
    return (f"| {name} | {res.model.H}/{H} | {res.queries} | {limit:.0f} | {MultiHeadAttention.query_bound(d, H)} | "
            f"{np.max(m.W):.1e} | {np.max(m.u):.1e} | {np.max(m.v):.1e} | {m.c:.1e} | "
            f"{'passed' if res.check.passed else 'FAILED'} {res.check.error:.1e} ≤ {res.check.tolerance:.0e} | "
            f"{res.details['route']} | {res.details['largest_probe_norm']:.1f} | {sec:.0f} |")


HEADER = ("| target | heads | queries | info. limit | 4Hd²−2H+1 | W_h | u_h | V_h | c | check | V route | "
          "max probe norm | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["minilm", "hf", "torch", "clamp"])
    ap.add_argument("--dtype", default="float64")
    ap.add_argument("--layers", type=int, nargs="*", default=list(range(6)))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"load: {os.getloadavg()[0]:.1f} (2 cores shared)")
    print(HEADER)
    if args.what == "minilm":
        for L in args.layers:
            true = minilm_layer(L)
            oracle = Oracle(true.with_dtype(args.dtype), true.d, precision=args.dtype)
            print(row(f"MiniLM layer {L}, numpy {args.dtype}", true, oracle, args.seed), flush=True)
    elif args.what == "hf":
        from attnprobe.oracles.hf_attention import oracle_from_hf
        from attnprobe.targets.hf import minilm_dir

        for L in args.layers:
            true = minilm_layer(L)
            oracle = oracle_from_hf(minilm_dir(), L, dtype=args.dtype, precision="auto")
            print(row(f"MiniLM layer {L}, transformers {args.dtype} (precision detected)", true, oracle,
                      args.seed), flush=True)
    elif args.what == "torch":
        import torch

        from attnprobe.oracles.torch_adapter import oracle_from_torch
        from attnprobe.oracles.torch_multihead import TorchMultiheadRow, torch_projections

        for d, H in ((64, 2), (64, 4), (96, 12), (384, 12)):
            torch.manual_seed(args.seed)
            mod = TorchMultiheadRow(d, H, row=None, dtype=torch.float64)
            p = torch_projections(mod)
            true = MultiHeadAttention.from_projections(p["Q"], p["K"], p["V"], p["WO"], p["bO"], b_Q=p["bQ"],
                                                       b_V=p["bV"])
            print(row(f"nn.MultiheadAttention d={d} H={H}", true, oracle_from_torch(mod, d), args.seed), flush=True)
    else:
        for L in args.layers:
            true = minilm_layer(L)

            def clamped(X, f=true):
                n = np.linalg.norm(X, axis=-1, keepdims=True)
                return f(X * np.minimum(1.0, 1e4 / np.maximum(n, 1e-300)))

            print(row(f"MiniLM layer {L}, rows clamped to norm 1e4", true, Oracle(clamped, true.d), args.seed),
                  flush=True)


if __name__ == "__main__":
    main()
