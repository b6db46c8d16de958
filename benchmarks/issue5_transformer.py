"""Issue 5 benchmark: the FFN learner, the one-layer transformer learner (Sec. 4.1) and a float32 torch victim.

    python benchmarks/issue5_transformer.py [--seeds 3] [--out docs/issue5_tables.md]
        [--tables ffn,ffn32,transformer,torch]

Prints markdown tables and writes them to --out. Timings are wall-clock seconds on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.transformer import extract_transformer
from attnprobe.models import neuron_errors
from attnprobe.oracles import Oracle
from attnprobe.targets import random_relu_net, random_transformer


def fresh_error(truth, model, rng, lengths=(1,), n=256):
    num = den = 0.0
    for N in lengths:
        X = rng.standard_normal((n, N, truth.d))
        y, yh = truth(X), model(X)
        num += float(np.sum((yh - y) ** 2))
        den += float(np.sum(y ** 2))
    return np.sqrt(num / den)


def ffn_table(seeds):
    rows = ["| d | m | seeds | queries (mean) | queries / (d·m) | kink search / gradients (mean) | neurons found | "
            "orientation exact | max neuron dir. error | max rel. error (fresh inputs) | s (mean) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in (8, 32, 64):
        for m in (d // 2, d, 4 * d):
            q, ks, gr, found, exact, derr, ferr, secs = [], [], [], [], [], [], [], []
            for seed in range(seeds):
                net = random_relu_net(d, m, seed=1000 * d + m + seed)
                o = Oracle(net, d)
                t0 = time.perf_counter()
                res = extract_ffn(o, seed=seed)
                secs.append(time.perf_counter() - t0)
                q.append(res.queries)
                qb = res.details["query_breakdown"]
                ks.append(qb["kink_search"])
                gr.append(qb["gradients"] + qb["re_measured"])
                found.append(res.details["neurons_found"])
                exact.append(res.details["orientation_exact"])
                err = neuron_errors(net.A, net.w_o, res.model.A, res.model.w_o)
                derr.append(err["direction_error"] if res.details["orientation_exact"] else np.nan)
                ferr.append(fresh_error(net, res.model, np.random.default_rng(seed)))
            de = f"{np.nanmax(derr):.1e}" if not np.all(np.isnan(derr)) else "n/a (equivalent net)"
            rows.append(f"| {d} | {m} | {seeds} | {np.mean(q):.0f} | {np.mean(q) / (d * m):.2f} | "
                        f"{np.mean(ks):.0f} / {np.mean(gr):.0f} | {min(found)}–{max(found)} of {m} | "
                        f"{sum(exact)}/{seeds} | {de} | {max(ferr):.1e} | {np.mean(secs):.1f} |")
            print(rows[-1], flush=True)
    return rows


def ffn32_table(seeds):
    """The FFN learner on float32 answers (a float32 forward pass): the sizes where m ≥ 2d used to lose weak
    neurons."""
    rows = ["| d | m | seeds | queries (mean) | neurons found | all found | max rel. error (fresh inputs) | "
            "median rel. error | s (mean) |", "|---|---|---|---|---|---|---|---|---|"]
    for d, m in ((8, 8), (8, 16), (16, 16), (8, 32), (16, 32)):
        q, found, ferr, secs = [], [], [], []
        for seed in range(seeds):
            net = random_relu_net(d, m, seed=seed, dtype="float32")
            o = Oracle(net, d, precision="float32")
            t0 = time.perf_counter()
            res = extract_ffn(o, seed=seed)
            secs.append(time.perf_counter() - t0)
            q.append(res.queries)
            found.append(res.details["neurons_found"])
            ferr.append(fresh_error(net, res.model, np.random.default_rng(seed)))
        rows.append(f"| {d} | {m} | {seeds} | {np.mean(q):.0f} | {min(found)}–{max(found)} of {m} | "
                    f"{sum(f == m for f in found)}/{seeds} | {max(ferr):.1e} | {np.median(ferr):.1e} | "
                    f"{np.mean(secs):.1f} |")
        print(rows[-1], flush=True)
    return rows


def transformer_table(seeds):
    rows = ["| d | m | seeds | queries (mean) | attention part (= 2 × antisym.) | FFN part | W rel. error (max) | "
            "max rel. error, lengths 1..8 (fresh) | s (mean) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for d in (8, 32):
        for m in (d, 4 * d):
            q, qa, qf, werr, ferr, secs = [], [], [], [], [], []
            for seed in range(seeds):
                tf = random_transformer(d, m, seed=1000 * d + m + seed)
                o = Oracle(tf, d)
                t0 = time.perf_counter()
                res = extract_transformer(o, seed=seed)
                secs.append(time.perf_counter() - t0)
                qb = res.details["query_breakdown"]
                assert qb["attention"] == 2 * qb["antisymmetric_queries"]
                q.append(res.queries)
                qa.append(qb["attention"])
                qf.append(qb["ffn"])
                werr.append(np.linalg.norm(res.model.W - tf.W) / np.linalg.norm(tf.W))
                ferr.append(fresh_error(tf, res.model, np.random.default_rng(seed), lengths=range(1, 9), n=64))
            rows.append(f"| {d} | {m} | {seeds} | {np.mean(q):.0f} | {np.mean(qa):.0f} | {np.mean(qf):.0f} | "
                        f"{max(werr):.1e} | {max(ferr):.1e} | {np.mean(secs):.1f} |")
            print(rows[-1], flush=True)
    return rows


def torch_table():
    import torch

    from attnprobe.oracles.torch_adapter import (TorchOneLayerTransformer, oracle_from_torch,
                                                 transformer_from_torch, transformer_to_torch)

    rows = ["| victim (torch, float32) | queries | W rel. error | recovered module vs victim, rel. error "
            "(256 fresh sequences, N = 5) | neurons found | s |", "|---|---|---|---|---|---|"]
    for d, m in ((8, 8), (8, 16), (16, 16)):
        torch.manual_seed(0)
        vic = TorchOneLayerTransformer(d, m).eval()
        truth = transformer_from_torch(vic)
        o = oracle_from_torch(vic)
        t0 = time.perf_counter()
        res = extract_transformer(o, seed=0)
        secs = time.perf_counter() - t0
        rec = transformer_to_torch(res.model)
        X = torch.randn(256, 5, d, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            a, b = vic(X).double(), rec(X).double()
        rel = float(torch.linalg.norm(a - b) / torch.linalg.norm(a))
        werr = np.linalg.norm(res.model.W - truth.W) / np.linalg.norm(truth.W)
        rows.append(f"| MHA(d={d}, 1 head, no bias) + Linear({d},{m})/ReLU/Linear({m},1) | {res.queries} | "
                    f"{werr:.1e} | {rel:.1e} | {res.details['ffn']['neurons_found']} of {m} | {secs:.1f} |")
        print(rows[-1], flush=True)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out", default="docs/issue5_tables.md")
    p.add_argument("--tables", default="ffn,transformer,torch",
                   help="comma-separated: ffn, ffn32 (float32 answers), transformer, torch")
    p.add_argument("--seeds32", type=int, default=10, help="seeds per row of the float32 FFN table")
    args = p.parse_args()
    which = args.tables.split(",")
    parts = []
    if "ffn" in which:
        parts += ["### FFN learner (float64 answers)", *ffn_table(args.seeds), ""]
    if "ffn32" in which:
        parts += ["### FFN learner (float32 answers)", *ffn32_table(args.seeds32), ""]
    if "transformer" in which:
        parts += ["### One-layer transformer (float64 answers)", *transformer_table(args.seeds), ""]
    if "torch" in which:
        parts += ["### Torch victim in float32", *torch_table(), ""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(parts) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
