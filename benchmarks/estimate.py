"""`extract --estimate` against the queries real runs ask, on the benchmark targets of every learner kind.

    PYTHONPATH=src python benchmarks/estimate.py [--kinds exact lowrank multihead vector ffn] [--seeds 10]
        [--first-seed 0] [--answers float64 float32] [--heavy] [--write]

For each target: the estimate from what the command line knows (method, d, rank, heads, hidden units, declared
outputs K, answer precision) and the queries the oracle answered in real runs over several seeds (the functional
check included, as a budget must cover it). ``--heavy`` adds the slow targets: the MiniLM-L6 layers (generic
learner on one output row, vector learner on whole rows in float64 and float32) and the 784-wide ReLU nets.
``--first-seed`` starts the seeds elsewhere (fresh seeds test an estimate whose constants were fitted to seeds
0–9); ``--answers`` keeps the targets of those answer precisions. ``--write`` puts the table in
docs/benchmarks/estimate.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from attnprobe.learners.core.estimate import estimate_queries
from attnprobe.oracles import Oracle
from attnprobe.reports import Table
from sections import write_section

DOC = "estimate"  # its results file: docs/benchmarks/estimate.md
TITLE = "`extract --estimate` against the queries real runs ask"


def _exact(d, seed):
    from attnprobe.learners.head.exact import extract_exact
    from attnprobe.targets import random_head

    o = Oracle(random_head(d, seed=seed), d)
    extract_exact(o, seed=seed)
    return o.queries


def _lowrank_random(d, r, seed):
    from attnprobe.learners.head.lowrank import extract_lowrank
    from attnprobe.targets import random_head

    o = Oracle(random_head(d, rank=r, seed=seed), d)
    extract_lowrank(o, rank=r, seed=seed)
    return o.queries


def _lowrank_minilm(layer, head, seed):
    from attnprobe.learners.head.lowrank import extract_lowrank
    from attnprobe.targets.minilm import minilm_head

    h = minilm_head(layer, head)
    o = Oracle(h, h.d)
    extract_lowrank(o, rank=32, seed=seed)
    return o.queries


def _generic(d, H, r, seed):
    from attnprobe.learners.multihead import extract_multihead
    from attnprobe.targets.multihead import random_multihead

    o = Oracle(random_multihead(d, H, seed=seed), d)
    extract_multihead(o, rank=r, seed=seed)  # the dispatch: one query tells scalar from vector answers
    return o.queries


def _generic_minilm(layer, seed):
    from attnprobe.learners.multihead import extract_multihead
    from attnprobe.targets.minilm import minilm_layer

    truth = minilm_layer(layer, 0)
    o = Oracle(truth, truth.d)
    extract_multihead(o, rank=32, seed=seed)
    return o.queries


def _vector_torch(d, H, seed):
    import torch

    from attnprobe.learners.multihead import extract_multihead
    from attnprobe.oracles.torch_adapter import oracle_from_torch
    from attnprobe.oracles.torch_multihead import TorchMultiheadRow

    torch.manual_seed(seed)
    o = oracle_from_torch(TorchMultiheadRow(d, H, row=None, dtype=torch.float64), d, outputs=d)
    extract_multihead(o, heads=H, seed=seed)
    return o.queries


def _vector_minilm(layer, dtype, seed):
    from attnprobe.learners.multihead import extract_multihead
    from attnprobe.models.multihead import MultiHeadAttention
    from attnprobe.targets.hf import hf_layer_arrays, minilm_dir

    truth = MultiHeadAttention.from_arrays(hf_layer_arrays(minilm_dir(), layer))
    o = Oracle(truth.with_dtype(dtype), truth.d, precision=dtype, outputs=truth.v.shape[1])
    extract_multihead(o, heads=truth.H, seed=seed)
    return o.queries


def ffn_run(d, m, K, bias, seed, precision="float64", net_seed=None):
    """One ffn benchmark run: the net ``random_relu_net(d, m, seed=1000·d + m + seed)`` (the benchmark scripts'
    nets: transformer.py bias-free, ffn_biased.py with biases; ``net_seed`` overrides it) learned with ``seed``.
    Returns (oracle, extraction)."""
    from attnprobe.learners.ffn import extract_ffn
    from attnprobe.targets import random_relu_net

    net_seed = 1000 * d + m + seed if net_seed is None else net_seed
    net = random_relu_net(d, m, seed=net_seed, bias=bias, outputs=None if K == 1 else K)
    o = Oracle(net.with_dtype(precision), d, precision=precision)
    return o, extract_ffn(o, seed=seed)


def _ffn(d, m, K, bias, seed, precision="float64"):
    return ffn_run(d, m, K, bias, seed, precision)[0].queries


def _ffn_overhead(seed):
    """benchmarks/learner_overhead.py's target: random_relu_net(8, 32, seed=0), learned with each seed."""
    return ffn_run(8, 32, 1, False, seed, net_seed=0)[0].queries


def against_real(estimate: int, real: np.ndarray) -> tuple[str, str]:
    """An estimate against the real counts of several runs: ``estimate ÷ real − 1`` (its range) and how many runs it
    is within 10 % of (``near/n``)."""
    off = estimate / real - 1
    near = int(np.sum(np.abs(estimate - real) <= 0.1 * real))
    offs = f"{off.min():+.1%}" if len(real) == 1 else f"{off.min():+.1%} … {off.max():+.1%}"
    return offs, f"{near}/{len(real)}"


def print_and_write(title: str, text: str, script: str, argv, write: bool, doc: str = DOC) -> None:
    """Print a finished table and, when ``write``, put it under ``title`` in docs/benchmarks/<doc>.md with the command
    that made it (single-threaded BLAS, as these benchmarks are run)."""
    print(text)
    if write:
        write_section(title, text, f"OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/{script} "
                      + " ".join(argv or sys.argv[1:]), doc=doc)


def targets(kinds, seeds, heavy):
    """(kind, target, answers, seeds, run(seed) -> queries, estimate keyword arguments)."""
    few = min(seeds, 3)
    out = []
    if "exact" in kinds:
        for d in (32, 64, 128):
            out.append(("exact", f"random head d={d}", "float64", few, lambda s, d=d: _exact(d, s),
                        dict(method="exact", d=d)))
        out.append(("exact", "random head d=384", "float64", 1, lambda s: _exact(384, s), dict(method="exact", d=384)))
    if "lowrank" in kinds:
        for d, r in ((64, 8), (128, 16)):
            out.append(("lowrank", f"random head d={d}, rank {r}", "float64", few,
                        lambda s, d=d, r=r: _lowrank_random(d, r, s), dict(method="lowrank", d=d, rank=r)))
        out.append(("lowrank", "MiniLM L0H1, rank 32", "float64", few, lambda s: _lowrank_minilm(0, 1, s),
                    dict(method="lowrank", d=384, rank=32)))
    if "multihead" in kinds:
        for d, H, r in ((32, 4, 8), (64, 4, 16)):
            out.append(("multihead (generic)", f"random layer d={d}, H={H}, rank {r}", "float64", few,
                        lambda s, d=d, H=H, r=r: _generic(d, H, r, s), dict(method="multihead", d=d, heads=H, rank=r)))
        if heavy:
            out.append(("multihead (generic)", "MiniLM layer 0, output row 0, rank 32", "float64", 1,
                        lambda s: _generic_minilm(0, s), dict(method="multihead", d=384, heads=12, rank=32)))
    if "vector" in kinds:
        for d, H in ((64, 2), (64, 4), (96, 12)):
            out.append(("multihead (vector)", f"nn.MultiheadAttention d={d}, H={H}, K={d}", "float64", few,
                        lambda s, d=d, H=H: _vector_torch(d, H, s),
                        dict(method="multihead", d=d, heads=H, outputs=d)))
        if heavy:
            for layer in range(6):
                out.append(("multihead (vector)", f"MiniLM layer {layer}, K=384", "float64", 1,
                            lambda s, layer=layer: _vector_minilm(layer, "float64", s),
                            dict(method="multihead", d=384, heads=12, outputs=384)))
            for layer in (0, 5):
                out.append(("multihead (vector)", f"MiniLM layer {layer}, K=384", "float32", 1,
                            lambda s, layer=layer: _vector_minilm(layer, "float32", s),
                            dict(method="multihead", d=384, heads=12, outputs=384, precision="float32")))
    if "ffn" in kinds:
        out.append(("ffn", "learner_overhead.py net d=8, m=32 (bias-free)", "float64", seeds, _ffn_overhead,
                    dict(method="ffn", d=8, hidden=32)))
        for d, m in ((8, 4), (8, 8), (8, 32), (32, 16), (32, 32), (64, 32), (64, 64)):
            out.append(("ffn", f"d={d}, m={m}, bias-free net", "float64", seeds,
                        lambda s, d=d, m=m: _ffn(d, m, 1, False, s), dict(method="ffn", d=d, hidden=m)))
        dims = (16, 64, 784) if heavy else (16, 64)
        for d in dims:
            for m in (16, 64):
                for K in (1, 10):
                    out.append(("ffn", f"d={d}, m={m}, K={K}, biases", "float64", seeds,
                                lambda s, d=d, m=m, K=K: _ffn(d, m, K, True, s),
                                dict(method="ffn", d=d, hidden=m, outputs=K)))
        for d, m in ((8, 8), (16, 16), (8, 32)):
            out.append(("ffn", f"d={d}, m={m}, bias-free net", "float32", seeds,
                        lambda s, d=d, m=m: _ffn(d, m, 1, False, s, "float32"),
                        dict(method="ffn", d=d, hidden=m, precision="float32")))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", nargs="+", default=["exact", "lowrank", "multihead", "vector", "ffn"])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--answers", nargs="+", default=["float64", "float32"])
    ap.add_argument("--heavy", action="store_true")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    cols = ["learner", "target", "answers", "seeds", "real queries (check included)", "estimate [low – high]",
            "estimate ÷ real − 1", "within 10 %", "in [low, high]", "load avg"]
    table = Table(cols)
    print("| " + " | ".join(cols) + " |", flush=True)
    for kind, name, answers, n, run, kw in targets(args.kinds, args.seeds, args.heavy):
        if answers not in args.answers:
            continue
        kw = dict(kw)
        est = estimate_queries(kw.pop("method"), kw.pop("d"), **kw)
        t0 = time.perf_counter()
        real = np.array([run(s) for s in range(args.first_seed, args.first_seed + n)])
        inside = int(np.sum((real >= est.low) & (real <= est.high)))
        span = f"{real.min()}" if n == 1 else f"{real.min()} – {real.max()}"
        table.add(kind, name, answers, n, span, f"{est.queries} [{est.low} – {est.high}]",
                  *against_real(est.queries, real), f"{inside}/{n}", f"{os.getloadavg()[0]:.1f}")
        print("| " + " | ".join(map(str, table.rows[-1])) + f" |  ({time.perf_counter() - t0:.0f} s)", flush=True)
    print_and_write(TITLE, table.markdown(), "estimate.py", argv, args.write)


if __name__ == "__main__":
    main()
