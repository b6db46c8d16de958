"""Benchmark: the generic multi-head learner (values / isolated / cross) on random generic heads and on the
real MiniLM-L6 layer (all 12 heads, d = 384). Writes the section "Multi-head: generic overlapping heads" of
docs/benchmarks/multihead.md.

    PYTHONPATH=src python benchmarks/multihead_generic.py [--seeds 5] [--layers 0] [--float32] [--no-write]

The MiniLM oracle evaluates the same function as ``targets.minilm_layer`` through the heads' rank-32 factors
(``FactorForm``: scores ``(X K_hᵀ)(Q_h x_N + …)``, like the real layer; 10x faster than dense ``W_h`` at d = 384);
answers agree with the dense model to ~1e-14 relative (printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from attnprobe.reports import Table  # noqa: E402
from sections import command_line, write_section  # noqa: E402
from attnprobe.errors import AttnprobeError  # noqa: E402
from attnprobe.learners.multihead.generic import extract_generic  # noqa: E402
from attnprobe.models.multihead import MultiHeadAttention, match_heads  # noqa: E402
from attnprobe.oracles.base import Oracle  # noqa: E402
from attnprobe.targets.multihead import random_multihead  # noqa: E402

DOC = "multihead"  # its results file: docs/benchmarks/multihead.md
TITLE = "Multi-head: generic overlapping heads (saturated values, isolated heads, switched-off cross terms)"


class FactorForm:
    """A :class:`MultiHeadAttention` evaluated through rank-r factors of its ``W_h`` (the same function)."""

    def __init__(self, model: MultiHeadAttention, rank: int, dtype=np.float64):
        self.model, self.r, self.dt = model, rank, dtype
        self.H, self.d = model.H, model.d
        U, s, Vt = np.linalg.svd(model.W)
        Ur, sr = U[:, :, :rank], s[:, :rank]
        self.K = (Ur * sr[:, None, :]).transpose(0, 2, 1).reshape(self.H * rank, self.d).astype(dtype)
        self.Q = Vt[:, :rank, :].reshape(self.H * rank, self.d).astype(dtype)
        self.uK = (np.einsum("hdk,hd->hk", Ur, model.u) / sr).astype(dtype)  # u_h = U_h S_h (S_h⁻¹U_hᵀu_h) + rest
        self.u_rest = (model.u - np.einsum("hdk,hk->hd", Ur, np.einsum("hdk,hd->hk", Ur, model.u))).astype(dtype)
        self.v, self.c = model.v.astype(dtype), dtype(model.c)

    def __call__(self, X):
        X = np.asarray(X, dtype=self.dt)
        B, N, d = X.shape
        q = (X[:, -1, :] @ self.Q.T).reshape(B, self.H, self.r) + self.uK
        k = (X.reshape(B * N, d) @ self.K.T).reshape(B, N, self.H, self.r)
        s = np.einsum("bnhk,bhk->bhn", k, q) + np.einsum("bnd,hd->bhn", X, self.u_rest)
        s -= s.max(-1, keepdims=True)
        a = np.exp(s)
        a /= a.sum(-1, keepdims=True)
        return (np.einsum("bhn,bnh->b", a, X @ self.v.T) + self.c).astype(np.float64)


def _table(headers, rows):
    return Table(headers, rows).markdown()


def _load():
    return os.getloadavg()[0]


def random_rows(seeds):
    rows = []
    for d, H, d_h in [(16, 2, None), (16, 4, None), (16, 4, 16), (32, 4, None), (32, 4, 32), (64, 2, None),
                      (64, 4, None), (64, 4, 64)]:
        errs, qs, secs, fails = [], [], [], 0
        for seed in range(seeds):
            target = random_multihead(d, H, d_h, seed=seed)
            oracle = Oracle(target, d)
            t0 = time.perf_counter()
            try:
                res = extract_generic(oracle, seed=seed)
            except AttnprobeError as exc:
                fails += 1
                print(f"  d={d} H={H} seed={seed}: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            secs.append(time.perf_counter() - t0)
            errs.append(match_heads(target, res.model).worst if res.model.H == H else np.inf)
            qs.append(res.queries)
        errs = np.array(errs)
        ok = int(np.sum(errs <= 1e-6))
        rows.append([d, H, d_h or d // H, f"{ok}/{seeds}", float(np.max(errs)) if errs.size else float("nan"),
                     int(np.median(qs)) if qs else 0, MultiHeadAttention.query_bound(d, H),
                     MultiHeadAttention.unknowns(d, H), float(np.median(secs)) if secs else 0.0])
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def minilm_row(layer, dtype, seed=0, rank=32):
    from attnprobe.targets.minilm import minilm_layer

    target = minilm_layer(layer, 0)
    fast = FactorForm(target, 32, np.float32 if dtype == "float32" else np.float64)
    X = np.random.default_rng(0).standard_normal((64, 3, target.d))
    agree = float(np.max(np.abs(fast(X) - target.with_dtype(dtype)(X))) / np.max(np.abs(target(X))))
    oracle = Oracle(fast, target.d, precision=dtype, name=f"MiniLM L{layer} {dtype}")
    load0 = _load()
    t0 = time.perf_counter()
    try:
        res = extract_generic(oracle, rank=rank, seed=seed)
    except AttnprobeError as exc:
        return {"layer": layer, "dtype": dtype, "rank": rank or "detected", "error": f"{type(exc).__name__}: {exc}",
                "queries": oracle.queries, "seconds": time.perf_counter() - t0, "agree": agree}
    secs = time.perf_counter() - t0
    out = {"layer": layer, "dtype": dtype, "rank": rank or "detected", "heads": res.model.H, "queries": res.queries,
           "by_phase": res.queries_by_phase, "seconds": secs, "load": (load0 + _load()) / 2,
           "check": res.check.error, "passed": res.check.passed, "agree": agree}
    if res.model.H == target.H:
        m = match_heads(target, res.model)
        out.update(worst=m.worst, W=m.W, v=m.v, u=m.u, c=m.c)
    return out


TORCH_TITLE = "Multi-head: generic learner on the real MiniLM-L6 layer as a torch module"


def torch_rows(layers, dtypes):
    """``targets.minilm_torch_layer`` (BERT self-attention + output dense, torch) as the oracle."""
    import torch

    from attnprobe.oracles.torch_adapter import oracle_from_torch
    from attnprobe.targets.minilm import minilm_layer, minilm_torch_layer

    rows = []
    for layer in layers:
        for dtype in dtypes:
            module = minilm_torch_layer(layer, 0, dtype=getattr(torch, dtype))
            oracle = oracle_from_torch(module, 384)
            truth = minilm_layer(layer, 0)
            load0, t0 = _load(), time.perf_counter()
            try:
                res = extract_generic(oracle, rank=32, seed=0)
            except AttnprobeError as exc:
                rows.append([layer, dtype, "—", oracle.queries, "—", f"{type(exc).__name__}: {exc}"[:160],
                             f"{time.perf_counter() - t0:.0f}", f"{(load0 + _load()) / 2:.1f}"])
                continue
            secs = time.perf_counter() - t0
            m = match_heads(truth, res.model) if res.model.H == truth.H else None
            rows.append([layer, dtype, res.model.H, res.queries,
                         ", ".join(f"{k} {v}" for k, v in res.queries_by_phase.items()),
                         f"{m.worst if m else float('nan'):.2e} (W {np.max(m.W) if m else 0:.1e}, v "
                         f"{np.max(m.v) if m else 0:.1e}, u {np.max(m.u) if m else 0:.1e}; check "
                         f"{res.check.error:.1e}, passed {res.check.passed})",
                         f"{secs:.0f}", f"{(load0 + _load()) / 2:.1f}"])
            print(rows[-1], file=sys.stderr, flush=True)
    return _table(["layer", "answers", "heads found", "queries", "by phase", "worst head error", "seconds",
                  "load avg (2 cores)"], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--layers", type=int, nargs="*", default=[0])
    ap.add_argument("--float32", action="store_true", help="also run the MiniLM layers with float32 answers")
    ap.add_argument("--skip-random", action="store_true")
    ap.add_argument("--detect-rank", action="store_true", help="also run MiniLM float64 without rank=32")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--torch", nargs="*", metavar="DTYPE", default=None,
                    help="only run the real torch MiniLM layer(s) with these answer dtypes (float64 float32)")
    args = ap.parse_args(argv)
    if args.torch is not None:
        body = ("The real layer itself as the oracle: `targets.minilm_torch_layer(layer, output_row=0, dtype)` "
                "(torch `BertSelfAttentionRow`: query/key/value Linear layers, softmax, output dense; no "
                "residual/LayerNorm), `rank=32`; errors against `targets.minilm_layer` (float64 sum form).\n\n"
                + torch_rows(args.layers, args.torch or ["float64"]))
        print(body)
        if not args.no_write:
            write_section(TORCH_TITLE, body, command_line(), doc=DOC)
        return
    parts = []
    if not args.skip_random:
        rows = random_rows(args.seeds)
        parts.append("Random generic heads with biases (`targets.random_multihead`, Gaussian `v_h`, `u_h`, `c`; "
                     "head dimension d_h = rank of W_h), float64 answers. Success: every head ≤ 1e-6 relative "
                     "error (W, v, u; Hungarian matching).\n\n" + _table(
                         ["d", "H", "d_h", "≤1e-6", "worst head error", "queries (median)", "4Hd²−2H+1",
                          "unknowns H(d²+2d)+1", "seconds (median)"], rows))
    mrows, per_head = [], []
    runs = [(layer, dtype, 32) for layer in args.layers
            for dtype in ["float64"] + (["float32"] if args.float32 else [])]
    runs += [(layer, "float64", None) for layer in args.layers] if args.detect_rank else []
    for layer, dtype, rank in runs:
        r = minilm_row(layer, dtype, rank=rank)
        print(r, file=sys.stderr, flush=True)
        if "error" in r:
            mrows.append([layer, dtype, r["rank"], "—", r["queries"], "—", r["error"][:160],
                          f"{r['seconds']:.0f}", "—"])
            continue
        mrows.append([layer, dtype, r["rank"], r["heads"], r["queries"],
                      ", ".join(f"{k} {v}" for k, v in r["by_phase"].items()),
                      f"{r.get('worst', float('nan')):.2e} (check {r['check']:.1e}, passed {r['passed']})",
                      f"{r['seconds']:.0f}", f"{r['load']:.1f}"])
        if "W" in r:
            per_head.append([layer, dtype, r["rank"]]
                            + [f"{max(a, b, c):.1e}" for a, b, c in zip(r["W"], r["v"], r["u"])])
    if mrows:
        parts.append("The real MiniLM-L6 layer (`targets.minilm_layer(layer, output_row=0)`, all 12 heads, d = 384, "
                     "biases), `rank=32` given (or detected); the bound 4Hd²−2H+1 = 7,077,865 queries.\n\n" + _table(
                         ["layer", "answers", "rank", "heads found", "queries", "by phase", "worst head error",
                          "seconds", "load avg (2 cores)"], mrows))
    if per_head:
        parts.append("Per-head worst relative error (max of W, v, u; true head order):\n\n" + _table(
            ["layer", "answers", "rank"] + [f"h{h}" for h in range(12)], per_head))
    body = "\n\n".join(parts)
    print(body)
    if not args.no_write:
        write_section(TITLE, body, command_line(), doc=DOC)


if __name__ == "__main__":
    main()
