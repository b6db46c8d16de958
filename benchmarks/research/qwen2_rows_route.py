"""Research: the every-row route with biases (Qwen2: RoPE + GQA + q/k/v biases) from bfloat16 every-position rows, its
library stages run one by one and each measured against the float64 module (docs/positional.md, "bfloat16 answers",
"Qwen2 (q/k/v biases) from every-position rows"). Stages save .npz under /tmp/qwen2/ and resume:

    PYTHONPATH=src python benchmarks/research/qwen2_rows_route.py start            (biased_start.biased_logit_start)
    PYTHONPATH=src python benchmarks/research/qwen2_rows_route.py polish           (the route's row polish + pair signs)
    PYTHONPATH=src python benchmarks/research/qwen2_rows_route.py final            (the hook's row polish on more rows,
                                                                                    then the route's check)

(d = 64, 4/1 by default; ``--d 128 --heads 8 --kv-heads 2`` under the heavy-run wrapper.) The served layer is a
``transformers`` Qwen2 layer in bfloat16 answering every row, declaring its rotary frequencies as a Hugging Face
folder's config does (the route holds them). Each stage prints the function error over every length 1 … 256 (four
sequences each) against the float64 module; ``final`` also the route's check (the worst length against the answers,
what the claim bounds).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from attnprobe.learners.positional import bfloat16_rows as route
from attnprobe.learners.positional.row_polish import chunk_precision, fresh_rows, polish_rows
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention
from attnprobe.oracles.base import Oracle
from attnprobe.targets.positional_modules import positional_victim, reference_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from positional_bfloat16 import EveryRow  # noqa: E402  (the bfloat16 victim's every row)

OUT = Path("/tmp/qwen2")
ALL = tuple(range(1, 257))
NAMES = ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo", "inv_freq")


class DeclaredRows(EveryRow):
    """The victim's every row, declaring its rotary frequencies (as ``--hf-dir`` does from the folder's config)."""

    def __init__(self, victim, frequencies):
        super().__init__(victim)
        self.rotary_frequencies = frequencies


def setup(args):
    kw = dict(d=args.d, heads=args.heads, kv_heads=args.kv_heads, seed=args.model_seed)
    truth = reference_model(positional_victim("qwen2", dtype="float64", **kw))
    victim = positional_victim("qwen2", dtype="bfloat16", **kw)
    return truth, Oracle(DeclaredRows(victim, truth.inv_freq), args.d, precision="bfloat16")


def path(args, stage):
    return OUT / f"{stage}_{args.d}_{args.heads}_{args.kv_heads}_m{args.model_seed}.npz"


def save(args, stage, model):
    np.savez(path(args, stage), **{k: np.asarray(getattr(model, k)) for k in NAMES})


def load(args, stage):
    p = dict(np.load(path(args, stage)))
    return PositionalAttention(p.pop("Wq"), p.pop("Wk"), p.pop("Wv"), p.pop("Wo"), position="rope", layout="half",
                               scale=1.0, causal=True, **p)


def every_length(model, truth, seed=5):
    return function_error_over_lengths(model, truth, np.random.default_rng(seed), ALL)


def options(oracle):
    return {"frequencies": False, "cg_steps": route.ROW_CG_STEPS, "dense": False,
            "compute": chunk_precision(oracle.precision), "log": lambda line: print(f"  {line}", flush=True)}


def stage_start(args, truth, oracle, rng):
    from attnprobe.learners.positional.biased_start import biased_logit_start

    model, info = biased_logit_start(oracle, args.heads, rng, logit_rounds=args.als,
                                     log=lambda line: print(f"  {line}", flush=True))
    print(f"start: {oracle.queries} queries; {info['neutral_token']}; mixing misfit {info['mixing_misfit']:.1e}; "
          f"logit misfit {info['logit_misfit']:.2e}; every length {every_length(model, truth):.2e}", flush=True)
    save(args, "start", model)


def stage_polish(args, truth, oracle, rng):
    from attnprobe.learners.positional.pair_signs import choose_pair_signs

    model = load(args, "polished" if args.resume else "start")
    data = fresh_rows(oracle, args.sequences, rng, length=route.ROW_TOKENS)
    model, rep = polish_rows(model, data, rounds=args.rounds, **options(oracle))
    print(f"row polish: misfit {rep.misfit_before:.2e} -> {rep.misfit_after:.2e}, every length "
          f"{every_length(model, truth):.2e}", flush=True)
    save(args, "polished", model)
    if args.signs:
        model, signs = choose_pair_signs(model, data, polish_options=options(oracle),
                                         log=lambda line: print(f"  {line}", flush=True))
        print(f"pair signs: flipped {signs['flipped']}; every length {every_length(model, truth):.2e}", flush=True)
        save(args, "polished", model)


def stage_final(args, truth, oracle, rng):
    from attnprobe.learners.positional.coarse import worst_length_check

    model = load(args, "final" if args.resume else "polished")
    data = fresh_rows(oracle, args.sequences, rng)
    for r in range(args.rounds):
        model, rep = polish_rows(model, data, rounds=1, **options(oracle))
        print(f"more rows, round {r + 1}: misfit {rep.misfit_before:.2e} -> {rep.misfit_after:.2e}, every length "
              f"{every_length(model, truth):.2e}", flush=True)
        save(args, "final", model)
    check = worst_length_check(oracle, model, np.random.default_rng(99), route.CHECK_LENGTHS, route.CHECK_PER_LENGTH)
    print(f"check (worst length against the answers): {check.error:.2e} (claim {route.CLAIM:g}); every length against "
          f"float64 {every_length(model, truth, 6):.2e} (seed 6)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=("start", "polish", "final"))
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--model-seed", type=int, default=0)
    ap.add_argument("--als", type=int, default=route.LOGIT_ROUNDS)
    ap.add_argument("--sequences", type=int, default=route.ROW_SEQUENCES)
    ap.add_argument("--rounds", type=int, default=route.ROW_ROUNDS)
    ap.add_argument("--no-signs", dest="signs", action="store_false")
    ap.add_argument("--seed", type=int, default=0, help="the stage's fresh sequences (plus 10 per stage)")
    ap.add_argument("--resume", action="store_true", help="polish, final: from the stage's own saved state")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    import torch
    torch.set_num_threads(1)
    truth, oracle = setup(args)
    t0 = time.perf_counter()
    {"start": stage_start, "polish": stage_polish, "final": stage_final}[args.stage](
        args, truth, oracle, np.random.default_rng(args.seed + 10 * ["start", "polish", "final"].index(args.stage)))
    print(f"{args.stage}: {oracle.queries} queries, {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
