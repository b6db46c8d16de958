"""RoPE layers from coarse answers: what the precision itself costs, and what the joint polish recovers from it.

Two tables (random-init ``transformers`` LLaMA attention, GQA, whole output rows at the last position):

- ``--served``: how far the module served in float32 / bfloat16 is from the same module in float64 (the target
  "as close as the served layer is"), the part due to its rounded weights alone, and a float64 Hugging Face LLaMA
  folder (eager attention: cos/sin and the softmax computed in float32) against its exact float64 function, with
  the precision attnprobe reads for it.
- ``--polish``: the joint Levenberg–Marquardt polish (``learners/positional/polish.py``) started from the float64
  module's weights perturbed by a relative ``--perturb`` and fitted to fresh answers of the served module: sequences
  against unknowns, the function's error at every length up to 256 against the float64 module before and after.
  This measures the last stage of a coarse-answer route (its start must come within the perturbation first).

    PYTHONPATH=src python benchmarks/positional_precision.py --served --write
    PYTHONPATH=src python benchmarks/positional_precision.py --polish --d 128 --heads 8 --kv-heads 2 --write
    PYTHONPATH=src python benchmarks/positional_precision.py --scaling 128 256 512 --write

- ``--scaling``: the cost of the polish's matrix-free rounds at LLaMA-3's shape (d_h = 128, H = d/128 query heads,
  H/4 key/value groups) on float32 answers: one Levenberg–Marquardt round of a few conjugate-gradient steps on twice
  the information limit's sequences (``⌈unknowns/d⌉``), seconds and peak memory, for an extrapolation to d = 4096.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from attnprobe.learners.positional.polish import fresh_answers, polish
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import rope_frequencies
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.reports import Table
from attnprobe.targets.positional_modules import positional_victim, reference_model
from sections import command_line, write_section

DOC = "positional-precision"  # its results file: docs/benchmarks/positional-precision.md
LENGTHS = (1, 2, 3, 5, 17, 64, 100, 200, 256)
PRECISIONS = ("float64", "float32", "bfloat16")
#: the fitted weight arrays the perturbation moves
PERTURBED = ("Wq", "Wk", "Wv", "Wo")


class Served:
    """The oracle's answers as a model :func:`function_error_over_lengths` can score."""

    def __init__(self, oracle):
        self.oracle, self.d = oracle, oracle.d

    def __call__(self, X):
        return np.asarray(self.oracle(X), dtype=np.float64)


def error(model, truth) -> float:
    return function_error_over_lengths(model, truth, np.random.default_rng(5), LENGTHS)


def served_table(args) -> Table:
    table = Table(["module", "served in", "precision read", "served vs float64 module",
                   "its rounded weights in float64 vs float64 module"])
    kw = dict(d=args.d, heads=args.heads, kv_heads=args.kv_heads, seed=args.seed)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    name = f"LLaMA d={args.d} {args.heads}/{args.kv_heads}"
    for prec in PRECISIONS:
        victim = positional_victim("llama", dtype=prec, **kw)
        oracle = oracle_from_torch(victim, args.d, precision=prec)
        table.add(name, prec, oracle.precision, f"{error(Served(oracle), truth):.1e}",
                  f"{error(reference_model(victim), truth):.1e}")
        print(table.markdown().splitlines()[-1], flush=True)
    table.add(*hf_float64_row(args.seed))
    return table


def hf_float64_row(seed: int) -> list:
    """A float64 LLaMA folder (``save_pretrained`` in float64, d = 64, 4/2 heads) through ``--hf-dir``'s oracle:
    its answers against the exact float64 function of its weights."""
    import torch
    import transformers

    from attnprobe.models.positional import PositionalAttention
    from attnprobe.oracles.hf_attention import hf_attention_layer, oracle_from_hf
    from attnprobe.oracles.hf_families import layer_spec

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama"
        config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                          intermediate_size=128, num_hidden_layers=2, vocab_size=8,
                                          attention_bias=False)
        torch.manual_seed(seed)
        model = transformers.AutoModel.from_config(config).to(torch.float64)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "self_attn" in n:
                    p.normal_(0.0, 0.125)
        model.save_pretrained(folder)
        spec = layer_spec(folder)
        p = hf_attention_layer(folder, 1, positional=True).projections()
        truth = PositionalAttention(p["Q"], p["K"], p["V"], p["WO"], position="rope",
                                    inv_freq=rope_frequencies(spec.rotary.dims, spec.rotary.base), scale=spec.scale)
        oracle = oracle_from_hf(folder, 1, dtype="float64", positional=True)
        err = error(Served(oracle), truth)
    return ["HF LlamaAttention (eager) d=64 4/2, float64 folder", "float64 (cos/sin, softmax in float32)",
            oracle.precision, f"{err:.1e}", "– (same weights)"]


def polish_table(args) -> Table:
    table = Table(["module", "answers", "sequences", "unknowns", "numbers", "start error", "polished error",
                   "misfit after", "rounds", "seconds", "peak MB"])
    kw = dict(d=args.d, heads=args.heads, kv_heads=args.kv_heads, seed=args.seed)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    for size in args.perturb:
        rng = np.random.default_rng(args.seed)
        start = replace(truth, **{n: np.asarray(getattr(truth, n)) * (1 + size * rng.standard_normal(
            np.shape(getattr(truth, n)))) for n in PERTURBED})
        if args.start_base:  # the start's frequencies from another base (θ_k = base^(−2k/d_h)): off most at the lowest
            start = replace(start, inv_freq=rope_frequencies(truth.head_dim, args.start_base))
        before = error(start, truth)
        for prec, count in zip(args.precisions, args.sequences):
            oracle = oracle_from_torch(positional_victim("llama", dtype=prec, **kw), args.d, precision=prec)
            t0 = time.perf_counter()
            data = fresh_answers(oracle, count, np.random.default_rng(args.seed + 1))
            model, rep = polish(start, data, frequencies=True, rounds=args.rounds)
            seconds = time.perf_counter() - t0
            table.add(f"LLaMA d={args.d} {args.heads}/{args.kv_heads}", prec, rep.sequences, rep.unknowns,
                      rep.numbers, f"{before:.1e}", f"{error(model, truth):.1e}", f"{rep.misfit_after:.1e}",
                      rep.rounds, round(seconds), round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
            print(table.markdown().splitlines()[-1], flush=True)
    return table


def scaling_table(args) -> Table:
    table = Table(["d", "heads", "unknowns", "sequences", "numbers", "answers s", "seconds per CG step",
                   "peak MB"])
    for d in args.scaling:
        H = max(1, d // 128)
        G = max(1, H // 4)
        victim = positional_victim("llama", d=d, heads=H, kv_heads=G, seed=args.seed, dtype="float32")
        truth = reference_model(victim)
        unknowns = truth.unknowns(d, H, G, truth.head_dim, truth.outputs)
        count = 2 * -(-unknowns // d)
        oracle = oracle_from_torch(victim, d, precision="float32")
        t0 = time.perf_counter()
        data = fresh_answers(oracle, count, np.random.default_rng(args.seed + 1))
        t1 = time.perf_counter()
        polish(truth, data, rounds=1, cg_steps=args.cg_steps)
        per_step = (time.perf_counter() - t1) / args.cg_steps
        table.add(d, f"{H}/{G}", unknowns, count, count * d, round(t1 - t0), f"{per_step:.2f}",
                  round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
        print(table.markdown().splitlines()[-1], flush=True)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--served", action="store_true", help="the served modules against the float64 one")
    ap.add_argument("--polish", action="store_true", help="the polish from a perturbed start on coarse answers")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--perturb", type=float, nargs="+", default=[1e-3],
                    help="relative perturbations of the start's weights (one start each)")
    ap.add_argument("--start-base", type=float, help="--polish: the start's RoPE base (default: the module's)")
    ap.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"], choices=PRECISIONS)
    ap.add_argument("--sequences", type=int, nargs="+", default=[400, 400], help="one count per precision")
    ap.add_argument("--scaling", type=int, nargs="+", help="widths d of the polish's cost at LLaMA-3's shape")
    ap.add_argument("--cg-steps", type=int, default=4, help="--scaling: conjugate-gradient steps timed")
    ap.add_argument("--rounds", type=int, default=3, help="Levenberg–Marquardt rounds of the polish")
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/")
    args = ap.parse_args()
    if args.served + args.polish + bool(args.scaling) != 1:
        sys.exit("choose one of --served, --polish and --scaling")
    if args.polish and len(args.sequences) != len(args.precisions):
        sys.exit("give one --sequences count per --precisions entry")
    table = served_table(args) if args.served else polish_table(args) if args.polish else scaling_table(args)
    print(table.markdown())
    if args.write:
        title = ("RoPE: the served module against the float64 one" if args.served else
                 (f"RoPE: the polish on coarse answers from a start {args.perturb[0]:g} off (d = {args.d})"
                  if len(args.perturb) == 1 and not args.start_base else
                  f"RoPE: the polish's reach from farther starts (d = {args.d}"
                  + (f", start base {args.start_base:g})" if args.start_base else ")"))
                 if args.polish
                 else "RoPE: the polish's cost at LLaMA-3's shape (float32 answers)")
        write_section(title, table.markdown(), command_line(), doc=DOC)


if __name__ == "__main__":
    main()
