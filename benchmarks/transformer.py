"""One-layer transformers (Sec. 4.1): the FFN learner, the transformer learner and a float32 torch victim.

    python benchmarks/transformer.py [--seeds 3] [--tables ffn,ffn32,transformer,torch]

Prints markdown tables and writes each as a subsection of "One-layer transformers and ReLU networks (Sec 4.1)"
in docs/benchmarks/transformer.md. Timings are wall-clock seconds on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.transformer import extract_transformer
from attnprobe.models import neuron_errors
from attnprobe.oracles import Oracle
from attnprobe.reports import Table
from sections import command_line, write_section
from attnprobe.targets import random_relu_net, random_transformer

DOC = "transformer"  # its results file: docs/benchmarks/transformer.md
SECTION = "One-layer transformers and ReLU networks (Sec 4.1)"


def fresh_error(truth, model, rng, lengths=(1,), n=256):
    num = den = 0.0
    for N in lengths:
        X = rng.standard_normal((n, N, truth.d))
        y, yh = truth(X), model(X)
        num += float(np.sum((yh - y) ** 2))
        den += float(np.sum(y**2))
    return np.sqrt(num / den)


def ffn_table(seeds):
    t = Table(
        [
            "d",
            "m",
            "seeds",
            "queries (mean)",
            "queries / (d·m)",
            "kink search / gradients (mean)",
            "neurons found",
            "orientation exact",
            "max neuron dir. error",
            "max rel. error (fresh inputs)",
            "s (mean)",
        ]
    )
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
                qb = res.queries_by_phase
                ks.append(qb.get("kink_search", 0))
                gr.append(sum(n for phase, n in qb.items() if phase != "kink_search"))
                found.append(res.details["neurons_found"])
                exact.append(res.details["orientation_exact"])
                err = neuron_errors(net.A, net.w_o, res.model.A, res.model.w_o)
                derr.append(err["direction_error"] if res.details["orientation_exact"] else np.nan)
                ferr.append(fresh_error(net, res.model, np.random.default_rng(seed)))
            de = f"{np.nanmax(derr):.1e}" if not np.all(np.isnan(derr)) else "n/a (equivalent net)"
            t.add(
                f"{d}",
                f"{m}",
                f"{seeds}",
                f"{np.mean(q):.0f}",
                f"{np.mean(q) / (d * m):.2f}",
                f"{np.mean(ks):.0f} / {np.mean(gr):.0f}",
                f"{min(found)}–{max(found)} of {m}",
                f"{sum(exact)}/{seeds}",
                f"{de}",
                f"{max(ferr):.1e}",
                f"{np.mean(secs):.1f}",
            )
            print(t.rows[-1], flush=True)
    return t


def ffn32_table(seeds):
    """The FFN learner on float32 answers (a float32 forward pass): the sizes where m ≥ 2d used to lose weak
    neurons."""
    t = Table(
        [
            "d",
            "m",
            "seeds",
            "queries (mean)",
            "neurons found",
            "all found",
            "max rel. error (fresh inputs)",
            "median rel. error",
            "s (mean)",
        ]
    )
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
        t.add(
            f"{d}",
            f"{m}",
            f"{seeds}",
            f"{np.mean(q):.0f}",
            f"{min(found)}–{max(found)} of {m}",
            f"{sum(f == m for f in found)}/{seeds}",
            f"{max(ferr):.1e}",
            f"{np.median(ferr):.1e}",
            f"{np.mean(secs):.1f}",
        )
        print(t.rows[-1], flush=True)
    return t


def transformer_table(seeds):
    t = Table(
        [
            "d",
            "m",
            "seeds",
            "queries (mean)",
            "attention part (= 2 × antisym.)",
            "FFN part",
            "W rel. error (max)",
            "max rel. error, lengths 1..8 (fresh)",
            "s (mean)",
        ]
    )
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
            t.add(
                f"{d}",
                f"{m}",
                f"{seeds}",
                f"{np.mean(q):.0f}",
                f"{np.mean(qa):.0f}",
                f"{np.mean(qf):.0f}",
                f"{max(werr):.1e}",
                f"{max(ferr):.1e}",
                f"{np.mean(secs):.1f}",
            )
            print(t.rows[-1], flush=True)
    return t


def torch_table():
    import torch

    from attnprobe.oracles.torch_adapter import (
        TorchOneLayerTransformer,
        oracle_from_torch,
        transformer_from_torch,
        transformer_to_torch,
    )

    t = Table(
        [
            "victim (torch, float32)",
            "queries",
            "W rel. error",
            "recovered module vs victim, rel. error (256 fresh sequences, N = 5)",
            "neurons found",
            "s",
        ]
    )
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
        t.add(
            f"MHA(d={d}, 1 head, no bias) + Linear({d},{m})/ReLU/Linear({m},1)",
            f"{res.queries}",
            f"{werr:.1e}",
            f"{rel:.1e}",
            f"{res.details['ffn']['neurons_found']} of {m}",
            f"{secs:.1f}",
        )
        print(t.rows[-1], flush=True)
    return t


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument(
        "--tables",
        default="ffn,transformer,torch",
        help="comma-separated: ffn, ffn32 (float32 answers), transformer, torch",
    )
    p.add_argument("--seeds32", type=int, default=10, help="seeds per row of the float32 FFN table")
    args = p.parse_args()
    tables = {
        "ffn": ("FFN learner (float64 answers)", lambda: ffn_table(args.seeds)),
        "ffn32": ("FFN learner (float32 answers)", lambda: ffn32_table(args.seeds32)),
        "transformer": ("One-layer transformer (float64 answers)", lambda: transformer_table(args.seeds)),
        "torch": ("Torch victim in float32", torch_table),
    }
    for name in args.tables.split(","):
        title, make = tables[name]
        write_section(title, make().markdown(), command_line(), parent=SECTION, doc=DOC)


if __name__ == "__main__":
    main()
