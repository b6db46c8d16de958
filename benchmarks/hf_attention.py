"""The live Hugging Face module as the victim: MiniLM-L6's BertSelfAttention + output dense (last position).

Three tables: the vector-layout converter against the real module (float64 and the checkpoint's float32) with the
module's answer rate; input clamps read from the answers (:mod:`attnprobe.oracles.input_bound`); and with
``--extract`` the multi-head learner on one output row of the module, float64 and float32 (nothing declared).

    PYTHONPATH=src python benchmarks/hf_attention.py --write
    PYTHONPATH=src python benchmarks/hf_attention.py --extract --layers 0,3 --row 5 --write
    PYTHONPATH=src python benchmarks/hf_attention.py --vector --write         # needs learners.multihead.vector
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from attnprobe.oracles import Oracle
from attnprobe.oracles.hf_attention import oracle_from_hf
from attnprobe.oracles.input_bound import clipping_norm
from attnprobe.reports import Table
from sections import command_line, write_section
from attnprobe.targets.hf import hf_layer_arrays, hf_layer_row, layer_answers, minilm_dir

DOC = "hf-attention"  # its results file: docs/benchmarks/hf-attention.md
PARENT = "Hugging Face attention layers (the live module as the victim)"


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def converter_table(folder, layers) -> Table:
    table = Table(["layer", "float64 module vs converter", "float32 module vs converter",
                   "float64 answers/s", "float32 answers/s"])
    rng = np.random.default_rng(0)
    for layer in layers:
        arrays = hf_layer_arrays(folder, layer)
        cells, rates = [], []
        for dtype in ("float64", "float32"):
            oracle = oracle_from_hf(folder, layer, dtype=dtype)
            errs = [rel(oracle(Xn), layer_answers(arrays, Xn)) for Xn in
                    (4 * rng.standard_normal((128, N, 384)) for N in (1, 2, 8))]
            cells.append(max(errs))
            big = 4 * rng.standard_normal((2048, 2, 384))
            t0 = time.perf_counter()
            oracle(big)
            rates.append(len(big) / (time.perf_counter() - t0))
        table.add(layer, cells[0], cells[1], f"{rates[0]:.0f}", f"{rates[1]:.0f}")
        print(table.markdown().splitlines()[-1], flush=True)
    return table


def clamped(oracle: Oracle, R: float | None) -> Oracle:
    """``oracle`` behind a server that scales each input row down to norm ``R``."""
    if R is None:
        return oracle

    def answer(X):
        n = np.linalg.norm(X, axis=-1, keepdims=True)
        return oracle(X * np.minimum(1.0, R / np.where(n > 0, n, 1.0)))

    return Oracle(answer, oracle.d, precision=oracle.precision)


def clipping_table(folder) -> Table:
    table = Table(["answers", "dtype", "clamp R", "estimated R", "relative error", "queries"])
    for row, what in ((None, "whole row (K = 384)"), (17, "row 17")):
        for dtype in ("float64", "float32"):
            for R in (None, 20.0, 1e4, 1e6):
                oracle = clamped(oracle_from_hf(folder, 0, dtype=dtype, row=row), R)
                got = clipping_norm(oracle, 1e13)
                err = "" if R is None or got is None else abs(got - R) / R
                table.add(what, dtype, "none" if R is None else R, "none" if got is None else got, err,
                          oracle.queries)
    return table


def extraction_table(folder, layers, row) -> Table:
    from attnprobe.learners.multihead import extract_multihead
    from attnprobe.models.multihead import match_heads

    table = Table(["layer", "row", "module dtype", "queries", "seconds", "worst head error", "check passed",
                   "check error", "largest probe norm"])
    for layer in layers:
        truth = hf_layer_row(folder, layer, row)
        for dtype in ("float64", "float32"):
            oracle = oracle_from_hf(folder, layer, dtype=dtype, row=row, precision="auto")
            t0 = time.perf_counter()
            try:
                res = extract_multihead(oracle, heads=12, rank=32, seed=0)
            except Exception as exc:  # a refusal is a result too: record its first words
                table.add(layer, row, dtype, oracle.queries, time.perf_counter() - t0,
                          f"refused: {type(exc).__name__}: {str(exc)[:90]}", "", "", oracle.max_input_norm_used)
            else:
                worst = match_heads(truth, res.model).worst if res.model.H == 12 else float("inf")
                table.add(layer, row, dtype, res.queries, time.perf_counter() - t0, worst, res.passed,
                          res.check.error, oracle.max_input_norm_used)
            print(table.markdown().splitlines()[-1], flush=True)
    return table


def vector_table(folder, layers) -> Table:
    """The whole-row learner (``learners.multihead.vector``) on the live module, nothing declared."""
    from attnprobe.learners.multihead.vector import extract_vector
    from attnprobe.models.multihead import MultiHeadAttention, match_heads

    table = Table(["layer", "module dtype", "queries", "seconds", "worst head error", "check passed",
                   "check error", "largest probe norm"])
    for layer in layers:
        a = hf_layer_arrays(folder, layer)
        truth = MultiHeadAttention(a["W"], a["v"], a["u"], a["c"])
        for dtype in ("float64", "float32"):
            oracle = oracle_from_hf(folder, layer, dtype=dtype, precision="auto")
            t0 = time.perf_counter()
            try:
                res = extract_vector(oracle, seed=0)
            except Exception as exc:  # a refusal is a result too
                table.add(layer, dtype, oracle.queries, time.perf_counter() - t0,
                          f"refused: {type(exc).__name__}: {str(exc)[:90]}", "", "", oracle.max_input_norm_used)
            else:
                table.add(layer, dtype, res.queries, time.perf_counter() - t0, match_heads(truth, res.model).worst,
                          res.passed, res.check.error, oracle.max_input_norm_used)
            print(table.markdown().splitlines()[-1], flush=True)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="0,1,2,3,4,5")
    ap.add_argument("--row", type=int, default=5)
    ap.add_argument("--extract", action="store_true", help="run the multi-head learner (minutes per layer)")
    ap.add_argument("--vector", action="store_true", help="run the whole-row learner on the whole output row")
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks/hf-attention.md")
    args = ap.parse_args()
    folder = minilm_dir()
    layers = [int(x) for x in args.layers.split(",")]
    sections = []
    if args.vector:
        sections.append(("Whole-row learner on the live module (vector answers, K = 384)",
                         vector_table(folder, layers)))
    elif args.extract:
        sections.append(("Multi-head learner on one output row of the live module", extraction_table(
            folder, layers, args.row)))
    else:
        sections.append(("Vector-layout converter against the real module", converter_table(folder, layers)))
        sections.append(("Input clamps read from length-1 answers (layer 0, probes up to norm 1e13)",
                         clipping_table(folder)))
    note = f"\n\nMeasured with {load()} (the machine was shared: times are noisy)."
    for title, table in sections:
        print(f"\n{title}\n{table.markdown()}{note}")
        if args.write:
            write_section(title, table.markdown() + note, command_line(), parent=PARENT, doc=DOC)


if __name__ == "__main__":
    main()
