"""The generic multi-head learner on every real MiniLM-L6 layer with scalar answers (output row 0, all 12 heads,
d = 384): float64 with the head dimension given and detected, float32 answers, and answers with relative noise.
Each row says what a user gets: the heads' true error against what the check reports, or the refusal.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_minilm_scalar.py --runs float32 [--write]
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_minilm_scalar.py --runs given detected
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_minilm_scalar.py --runs noise --layers 0
    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_minilm_scalar.py --random32 [--write]

float64/float32 rows query the layer through its rank-32 factors (``FactorForm``, the same function, 10x
faster than the dense einsum); ``--torch`` rows query transformers-free torch ``BertSelfAttentionRow`` (real
MiniLM weights) in float32, the precision the checkpoint ships in.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.models.multihead import match_heads
from attnprobe.oracles.base import Oracle
from attnprobe.reports import Table
from sections import command_line, write_section
from attnprobe.targets.minilm import minilm_layer

sys.path.insert(0, os.path.dirname(__file__))
from multihead_generic import FactorForm  # noqa: E402

DOC = "multihead"  # its results file: docs/benchmarks/multihead.md
TITLE = "Multi-head: generic learner on all six MiniLM-L6 layers, scalar answers (float64, float32, noise)"


def _oracle(layer, run):
    truth = minilm_layer(layer, 0)
    if run == "torch32":
        import torch

        from attnprobe.oracles.torch_adapter import oracle_from_torch
        from attnprobe.targets.minilm import minilm_torch_layer

        return truth, oracle_from_torch(minilm_torch_layer(layer, 0, dtype=torch.float32), truth.d)
    dt = np.float32 if run == "float32" else np.float64
    fast = FactorForm(truth, 32, dt)
    if run == "noise":
        rng = np.random.default_rng(layer)
        return truth, Oracle(lambda X: (lambda y: y * (1 + 1e-12 * rng.standard_normal(y.shape)))(fast(X)), truth.d)
    return truth, Oracle(fast, truth.d, precision="float32" if run == "float32" else "float64")


def row(layer, run):
    truth, oracle = _oracle(layer, run)
    rank = None if run == "detected" else 32
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    try:
        res = extract_generic(oracle, rank=rank, seed=0)
    except AttnprobeError as exc:
        return [layer, run, rank or "detected", "refused", oracle.queries, "—", "—", f"{type(exc).__name__}: {exc}",
                round(time.perf_counter() - t0), round((load0 + os.getloadavg()[0]) / 2, 1)]
    m = match_heads(truth, res.model) if res.model.H == truth.H else None
    worst = m.worst if m else float("nan")
    honest = "yes" if (m is not None and max(np.max(m.W), np.max(m.v)) <= res.check.error) else "NO"
    ranks = sorted(set(res.details["head_rank"]))
    return [layer, run, rank or "detected", f"H={res.model.H}, ranks {ranks}", res.queries,
            f"{worst:.1e} (W {np.max(m.W):.1e}, v {np.max(m.v):.1e}, u {np.max(m.u):.1e})" if m else "heads differ",
            f"{res.check.error:.1e} / {res.check.tolerance:.1e}, passed {res.check.passed}",
            f"bound covers W, v: {honest}; by phase {res.queries_by_phase}",
            round(time.perf_counter() - t0), round((load0 + os.getloadavg()[0]) / 2, 1)]


def random32_rows(seeds=3):
    """Random layers computing in float32 (precision declared): passed, failed the check, or refused."""
    from attnprobe.targets.multihead import random_multihead

    rows = []
    for d, H in [(16, 2), (32, 4), (64, 4)]:
        for seed in range(seeds):
            t = random_multihead(d, H, seed=seed)
            oracle = Oracle(t.with_dtype("float32"), d, precision="float32")
            try:
                res = extract_generic(oracle, seed=seed)
            except AttnprobeError as exc:
                rows.append([d, H, seed, oracle.queries, "—", "—", f"refused: {str(exc)[:110]}…"])
                continue
            m = match_heads(t, res.model)
            worst = max(np.max(m.W), np.max(m.v))
            rows.append([d, H, seed, res.queries, f"{worst:.1e} (u {np.max(m.u):.1e})",
                         f"{res.check.error:.1e} / {res.check.tolerance:.1e}",
                         f"passed {res.check.passed}; bound covers W, v: "
                         f"{'yes' if worst <= res.check.error else 'NO'}"])
            print(rows[-1], flush=True)
    return Table(["d", "H", "seed", "queries", "worst head W/v error (true)", "check error / tolerance", "outcome"],
                 rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", default=["float32"],
                    choices=["given", "detected", "float32", "torch32", "noise"])
    ap.add_argument("--layers", type=int, nargs="+", default=list(range(6)))
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--random32", action="store_true", help="only random layers with float32 answers")
    args = ap.parse_args(argv)
    if args.random32:
        body = random32_rows().markdown()
        print(body)
        if args.write:
            write_section(TITLE + " — random float32 layers", body, command_line(), doc=DOC)
        return
    table = Table(["layer", "answers", "rank", "found", "queries", "worst head error (true)",
                   "check error / tolerance", "notes", "seconds", "load avg"])
    for layer in args.layers:
        for run in args.runs:
            table.add(*row(layer, run))
            print(table.markdown().splitlines()[-1], flush=True)
    body = ("`given`/`detected`: float64 answers, head dimension 32 given or detected; `float32`: the layer "
            "computing in float32 (precision declared); `torch32`: the real torch module in float32 (precision "
            "read from the answers); `noise`: float64 answers times (1 + 1e-12·N(0,1)), undeclared. The check error "
            "includes the per-head bounds (each head alone, others switched off).\n\n" + table.markdown())
    print(body)
    if args.write:
        write_section(TITLE + " — " + ", ".join(args.runs), body, command_line(), doc=DOC)


if __name__ == "__main__":
    main()
