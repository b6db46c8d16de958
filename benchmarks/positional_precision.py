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
    PYTHONPATH=src python benchmarks/positional_precision.py --scaling 512 1024 2048 --rows --write
    PYTHONPATH=src python benchmarks/positional_precision.py --victim-cost 256 1024 2048 --write

- ``--scaling``: the cost of the polish's matrix-free rounds at LLaMA-3's shape (d_h = 128, H = d/128 query heads,
  H/4 key/value groups) on float32 answers: one Levenberg–Marquardt round of a few conjugate-gradient steps on twice
  the information limit's sequences (``⌈unknowns/d⌉``), seconds and peak memory, for an extrapolation to d = 4096.
  With ``--rows``: the row polish (``learners/positional/row_polish.py``) on every-position answers of sequences of
  256 tokens (twice the fitted numbers' limit ``⌈unknowns/K⌉`` in rows), its products streamed over chunks of
  ``--chunk-rows`` rows; base 5e5 as LLaMA-3's. Each width runs in a process of its own (its peak memory).
- ``--victim-cost``: the victim's own cost at LLaMA-3-8B's layer (d = 4096, 32 heads, 8 key/value groups, base
  5e5, float32, one random-init ``transformers`` ``LlamaAttention``): seconds and peak memory to answer one
  sequence of N tokens at every position.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from attnprobe.learners.positional.polish import fresh_answers, polish
from attnprobe.learners.positional.row_polish import ROW_LENGTH, fresh_rows, polish_rows
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import rope_frequencies
from attnprobe.oracles.base import Oracle
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.reports import Table
from attnprobe.targets.positional_modules import positional_victim, reference_model
from sections import command_line, write_section

DOC = "positional-precision"  # its results file: docs/benchmarks/positional-precision.md
LENGTHS = (1, 2, 3, 5, 17, 64, 100, 200, 256)
PRECISIONS = ("float64", "float32", "bfloat16")
#: the fitted weight arrays the perturbation moves
PERTURBED = ("Wq", "Wk", "Wv", "Wo")
#: LLaMA-3's RoPE base
LLAMA3_ROPE = {"rope_type": "default", "rope_theta": 5e5}


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
    kw = dict(d=args.d, heads=args.heads, kv_heads=args.kv_heads, seed=args.seed,
              rope={"rope_type": "default", "rope_theta": args.base})
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    for size in args.perturb:
        rng = np.random.default_rng(args.seed)
        start = replace(truth, **{n: np.asarray(getattr(truth, n)) * (1 + size * rng.standard_normal(
            np.shape(getattr(truth, n)))) for n in PERTURBED})
        if args.start_base:  # the start's frequencies from another base (θ_k = base^(−2k/d_h)): off most at the lowest
            start = replace(start, inv_freq=rope_frequencies(truth.head_dim, args.start_base))
        before = error(start, truth)
        for prec, count in zip(args.precisions, args.sequences):
            victim = positional_victim("llama", dtype=prec, **kw)
            t0 = time.perf_counter()
            if args.rows:  # every-position answers, the row polish streamed over chunks
                oracle = Oracle(Rows(victim), args.d, precision=prec)
                data = fresh_rows(oracle, count, np.random.default_rng(args.seed + 1))
                model, rep = polish_rows(start, data, frequencies=True, rounds=args.rounds, cg_steps=args.cg_steps,
                                         chunk_rows=args.chunk_rows, compute=args.compute[0], dense=False,
                                         log=lambda line: print(line, flush=True))
            else:
                oracle = oracle_from_torch(victim, args.d, precision=prec)
                data = fresh_answers(oracle, count, np.random.default_rng(args.seed + 1))
                model, rep = polish(start, data, frequencies=True, rounds=args.rounds)
            seconds = time.perf_counter() - t0
            answers = f"{prec}, every position" if args.rows else prec
            table.add(f"LLaMA d={args.d} {args.heads}/{args.kv_heads}", answers, rep.sequences, rep.unknowns,
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


def peak_mb() -> int:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def llama3_shape(d: int) -> tuple[int, int]:
    """LLaMA-3's heads at width d: d_h = 128, H = d/128 query heads, H/4 key/value groups."""
    H = max(1, d // 128)
    return H, max(1, H // 4)


class Rows:
    """A victim's every row as an oracle function, declared causal (a decoder)."""

    positions = "causal"

    def __init__(self, victim):
        self.victim = victim

    def __call__(self, X):
        return self.victim.every_position(X).detach().double().numpy()


def row_scaling_row(d: int, seed: int, cg_steps: int, chunk_rows: int, compute: str) -> list:
    """One width of the row polish's cost (run in a process of its own: its peak memory is its own)."""
    import torch

    torch.set_num_threads(1)
    H, G = llama3_shape(d)
    victim = positional_victim("llama", d=d, heads=H, kv_heads=G, seed=seed, dtype="float32", rope=LLAMA3_ROPE)
    truth = reference_model(victim)
    unknowns = sum(np.size(getattr(truth, n)) for n in ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo"))
    count = -(-2 * -(-unknowns // truth.outputs) // ROW_LENGTH)
    oracle = Oracle(Rows(victim), d, precision="float32")
    t0 = time.perf_counter()
    data = fresh_rows(oracle, count, np.random.default_rng(seed + 1))
    t1 = time.perf_counter()
    stamps = []
    polish_rows(truth, data, rounds=1, cg_steps=cg_steps, chunk_rows=chunk_rows, dense=False, compute=compute,
                progress=lambda done, total: stamps.append(time.perf_counter()))
    per_step = float(np.median(np.diff(stamps))) if len(stamps) > 1 else float("nan")
    rows = count * ROW_LENGTH
    return [d, f"{H}/{G}", unknowns, f"{count} × {ROW_LENGTH}", rows, rows * d, round(t1 - t0), compute,
            f"{per_step:.2f}", peak_mb()]


def row_scaling_table(args) -> Table:
    table = Table(["d", "heads", "fitted numbers", "sequences × length", "rows", "numbers", "answers s",
                   "computed in", "seconds per CG step", "peak MB"])
    spawn = multiprocessing.get_context("spawn")
    for d in args.scaling:
        for compute in args.compute:
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
                table.add(*pool.submit(row_scaling_row, d, args.seed, args.cg_steps, args.chunk_rows,
                                       compute).result())
            print(table.markdown().splitlines()[-1], flush=True)
    return table


def llama3_layer(seed: int):
    """LLaMA-3-8B's attention layer (d = 4096, 32/8 heads, base 5e5) built in float32 from its config class (no
    float64 copy on the way: its peak memory is the layer's own), weights N(0, 1/d)."""
    import torch
    import transformers
    from transformers.models.llama.modeling_llama import LlamaAttention

    from attnprobe.targets.positional_modules import PositionalVictim

    d = 4096
    H, G = llama3_shape(d)
    config = transformers.LlamaConfig(hidden_size=d, num_attention_heads=H, num_key_value_heads=G,
                                      intermediate_size=4 * d, num_hidden_layers=1, rope_parameters=LLAMA3_ROPE,
                                      attention_bias=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    module = LlamaAttention(config, layer_idx=0).to(torch.float32)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, d**-0.5)
    return PositionalVictim("llama", module, config, rope_frequencies(128, 5e5), 128)


def victim_cost_row(length: int, seed: int) -> list:
    """One every-position answer of ``length`` tokens at LLaMA-3-8B's layer (own process: its peak memory)."""
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    victim = llama3_layer(seed)
    built, before = time.perf_counter() - t0, peak_mb()
    X = np.random.default_rng(seed).standard_normal((1, length, victim.d)).astype(np.float32)
    t0 = time.perf_counter()
    Y = Rows(victim)(X)
    seconds = time.perf_counter() - t0
    assert Y.shape == (1, length, victim.d) and np.isfinite(Y).all()
    H, G = llama3_shape(victim.d)
    return [f"d={victim.d} {H}/{G}", length, round(built), f"{seconds:.2f}", f"{seconds / length * 1e3:.2f}",
            before, peak_mb()]


def victim_cost_table(args) -> Table:
    table = Table(["layer (float32)", "N", "build s", "answer s", "ms per row", "peak MB after build",
                   "peak MB"])
    spawn = multiprocessing.get_context("spawn")
    for N in args.victim_cost:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            table.add(*pool.submit(victim_cost_row, N, args.seed).result())
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
    ap.add_argument("--cg-steps", type=int, default=4,
                    help="--scaling: conjugate-gradient steps timed; --polish --rows: steps per round")
    ap.add_argument("--rows", action="store_true",
                    help="--scaling, --polish: the row polish on every-position answers (sequences of 256 tokens)")
    ap.add_argument("--base", type=float, default=10000.0, help="--polish: the module's RoPE base")
    ap.add_argument("--chunk-rows", type=int, default=1024, help="--rows: rows per streamed chunk")
    ap.add_argument("--compute", nargs="+", default=["float64"], choices=["float64", "float32"],
                    help="--rows: the precisions the chunks are computed in (one row each)")
    ap.add_argument("--victim-cost", type=int, nargs="+",
                    help="lengths N: the float32 LLaMA-3-8B layer's cost of one every-position answer")
    ap.add_argument("--rounds", type=int, default=3, help="Levenberg–Marquardt rounds of the polish")
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/")
    args = ap.parse_args()
    if args.served + args.polish + bool(args.scaling) + bool(args.victim_cost) != 1:
        sys.exit("choose one of --served, --polish, --scaling and --victim-cost")
    if args.polish and len(args.sequences) != len(args.precisions):
        sys.exit("give one --sequences count per --precisions entry")
    table = (served_table(args) if args.served else polish_table(args) if args.polish else
             victim_cost_table(args) if args.victim_cost else
             row_scaling_table(args) if args.rows else scaling_table(args))
    print(table.markdown())
    if args.write:
        title = ("RoPE: the served module against the float64 one" if args.served else
                 (f"RoPE: the row polish on every-position answers from a start {args.perturb[0]:g} off "
                  f"(d = {args.d})" if args.rows else
                  f"RoPE: the polish on coarse answers from a start {args.perturb[0]:g} off (d = {args.d})"
                  if len(args.perturb) == 1 and not args.start_base else
                  f"RoPE: the polish's reach from farther starts (d = {args.d}"
                  + (f", start base {args.start_base:g})" if args.start_base else ")"))
                 if args.polish
                 else "RoPE: the victim's cost at LLaMA-3-8B's layer (one every-position answer)" if args.victim_cost
                 else "RoPE: the row polish's cost at LLaMA-3's shape (every position, streamed)" if args.rows
                 else "RoPE: the polish's cost at LLaMA-3's shape (float32 answers)")
        write_section(title, table.markdown(), command_line(), doc=DOC)


if __name__ == "__main__":
    main()
