"""The smooth FFN learner (``--method ffn`` on GELU, tanh-GELU, SiLU, SwiGLU and GeGLU FFNs) on random FFNs,
``transformers``' LlamaMLP and MiniLM's.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/smooth_ffn.py [--cases 16-48-16-gelu
        32-96-8-silu-nobias 32-64-32-swiglu llama-128-256-swiglu minilm2 minilm2:192 ...]
        [--precision float64|float32] [--minilm LAYER] [--hidden] [--activation A] [--seeds S ...]
        [--write TITLE]

A case ``d-m-K-act[-nobias]`` is a seeded :func:`attnprobe.targets.random_smooth_ffn` (act gelu, gelu_tanh, silu)
or :func:`attnprobe.targets.random_gated_ffn` (act swiglu, geglu, geglu_tanh; m gated units), weights at
1/√fan-in; ``llama-d-m-FAMILY[-bias]`` is a random-init ``transformers`` ``LlamaMLP`` (weights at 1/√fan-in);
``minilmL[:k]`` (or ``--minilm L``) is MiniLM-L6 layer L's real GELU FFN (384 → 1536 → 384), or its first k
hidden units. Each is learned through ``--method ffn``'s dispatch (activation detected unless ``--activation``;
``--hidden`` gives the width instead of searching it).
Reported: queries, unknowns, seconds, the activation found, the largest relative error over 1000 fresh N(0, I)
inputs (max |ŷ − y| / max |y|), the neurons' largest relative errors up to order, and the learner's check.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.smooth_ffn.dispatch import extract_ffn_any
from attnprobe.models.gated_ffn import GATED_FAMILIES, gated_match
from attnprobe.models.smooth_ffn import neuron_match
from attnprobe.oracles import Oracle
from attnprobe.targets import random_gated_ffn, random_smooth_ffn

DOC = "smooth-ffn"


def target(case: str, precision: str):
    """``(oracle function, truth as a model)`` for a case."""
    if case.startswith("minilm"):
        from attnprobe.targets import minilm_ffn

        layer, _, k = case[6:].partition(":")
        truth = minilm_ffn(int(layer), precision, neurons=int(k) if k else None)
        return truth, truth
    parts = case.split("-")
    if parts[0] == "llama":
        from attnprobe.oracles.torch_adapter import TorchFunction
        from attnprobe.targets.gated_modules import llama_mlp

        d, m = int(parts[1]), int(parts[2])
        victim = llama_mlp(d, m, family=parts[3], bias="bias" in parts, seed=d + m, dtype=precision)
        return TorchFunction(victim, d), victim.reference()
    d, m, K = map(int, parts[:3])
    bias = "nobias" not in parts
    if parts[3] in GATED_FAMILIES:
        truth = random_gated_ffn(d, m, K, activation=GATED_FAMILIES[parts[3]], bias=bias, seed=d + m,
                                 dtype=precision)
    else:
        truth = random_smooth_ffn(d, m, K, activation=parts[3], bias=bias, seed=d + m, dtype=precision)
    return truth, truth


def one(case: str, precision: str, hidden: bool, activation: str | None, seed: int = 0,
        start: str | None = None) -> str:
    fn, truth = target(case, precision)
    oracle = Oracle(fn, truth.d, precision=precision)
    gated = truth.kind == "gated_ffn"
    biases = (truth.bg, truth.bu, truth.b2) if gated else (truth.b1, truth.b2)
    t0 = time.perf_counter()
    try:
        res = extract_ffn_any(oracle, seed=seed, hidden=truth.m if hidden else None, activation=activation,
                              bias=any(np.any(b != 0) for b in biases), start=start)
    except (ConfigError, UnidentifiableError) as err:  # refused before it claims anything
        return (f"| {case} | {precision} | {oracle.queries:,} | – | – | refused ({getattr(err, 'param', None) or err}) "
                "| – | – | – | – | "
                f"{time.perf_counter() - t0:.0f} |")
    secs = time.perf_counter() - t0
    keys = ("start", "left_out", "jennrich_left_out", "bends", "mixed_bends_read", "groups_dropped", "factor_attempts",
            "core_residual", "worst_separation", "extrapolated_step",
            "polish_residuals", "attempts", "circles", "units_found", "up_fit_median")
    print(case, {k: res.details[k] for k in keys if k in res.details}, res.queries_by_phase, file=sys.stderr)
    X = np.random.default_rng(1).standard_normal((1000, truth.d))
    y = truth.with_dtype("float64").forward(X)
    err = np.abs(res.model.forward(X) - y).max() / np.abs(y).max()
    if res.model.kind != truth.kind:
        errors = "(other kind)"
    elif gated:
        match = gated_match(truth, res.model)
        errors = f"{match['gate_error']:.1e} / {match['up_down_error']:.1e}"
    else:
        match = neuron_match(truth, res.model)
        errors = f"{match['first_layer_error']:.1e} / {match['second_layer_error']:.1e}"
    return (f"| {case} | {precision} | {res.queries:,} | {res.unknowns:,} | {res.queries / res.unknowns:.2f} | "
            f"{res.details['activation']} | {res.details['hidden']} | {err:.1e} | {errors} | "
            f"{'yes' if res.passed else 'NO'} | {secs:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="*", default=["16-48-16-gelu", "32-96-8-silu-nobias", "64-128-64-gelu_tanh"])
    ap.add_argument("--precision", default="float64", choices=["float64", "float32"])
    ap.add_argument("--minilm", type=int, help="add MiniLM-L6 layer L's GELU FFN")
    ap.add_argument("--hidden", action="store_true", help="give the hidden width (no width search)")
    ap.add_argument("--activation", help="give the activation (default: detected)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0], help="the learner's seeds (one row each)")
    ap.add_argument("--start", choices=["jennrich", "drive"], help="the smooth learner's start (default: its choice)")
    ap.add_argument("--write", metavar="TITLE", help="also write the table as the section TITLE of "
                    "docs/benchmarks/smooth-ffn.md, under 'Float32 answers' or 'Float64 answers' by the precision")
    args = ap.parse_args()
    cases = list(args.cases) + ([f"minilm{args.minilm}"] if args.minilm is not None else [])
    lines = ["| case d-m-K | answers | queries | unknowns | queries/unknown | activation found | m found | "
             "fresh max error | neurons W1,b1 / W2 error (gated: gate / w2·up) | check | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines))
    for case in cases:
        for seed in args.seeds:
            row = one(case, args.precision, args.hidden, args.activation, seed, args.start)
            lines.append(row if args.seeds == [0] else row.replace(f"| {case} |", f"| {case} seed {seed} |", 1))
            print(lines[-1], flush=True)
    if args.write:
        from sections import command_line, write_section

        write_section(args.write, "\n".join(lines), command_line(), doc=DOC,
                      parent="Float32 answers" if args.precision == "float32" else "Float64 answers")


if __name__ == "__main__":
    main()
