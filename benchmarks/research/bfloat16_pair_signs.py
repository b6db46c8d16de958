"""Research: the every-row route's stages (``learners/positional/bfloat16_rows.py``) on LLaMA from bfloat16 rows, each
measured against the float64 module and saved under /tmp/bf16signs/ so the next resumes: ``start`` (values, value
maps, logit maps: ``logit_start``), ``polish`` (the row polish on the route's rows), ``signs`` (``choose_pair_signs``
on the same rows), ``mix`` (``fit_slow_mixing`` on the same rows), ``final`` (the row polish on more fresh rows, as
the learners' hook runs it).

    PYTHONPATH=src python benchmarks/research/bfloat16_pair_signs.py start --d 128 --heads 8 --kv-heads 2
    PYTHONPATH=src python benchmarks/research/bfloat16_pair_signs.py polish --rounds 12
    PYTHONPATH=src python benchmarks/research/bfloat16_pair_signs.py signs
    PYTHONPATH=src python benchmarks/research/bfloat16_pair_signs.py mix --rounds 4 --from signs
    PYTHONPATH=src python benchmarks/research/bfloat16_pair_signs.py final --sequences 48 --rounds 8
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from attnprobe.learners.positional import bfloat16_rows
from attnprobe.learners.positional.pair_signs import choose_pair_signs, slow_pairs
from attnprobe.learners.positional.row_polish import fresh_rows, polish_rows
from attnprobe.learners.positional.slow_mixing import fit_slow_mixing
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention
from attnprobe.oracles.base import Oracle
from attnprobe.targets.positional_modules import positional_victim, reference_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from positional_bfloat16 import EveryRow  # noqa: E402  (the bfloat16 victim's every row)

OUT = "/tmp/bf16signs"
LENGTHS = (1, 2, 3, 5, 17, 64, 100, 128, 160, 200, 256)
ARRAYS = ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo", "inv_freq")


def save(model: PositionalAttention, name: str, info: dict) -> None:
    np.savez(f"{OUT}/{name}.npz", **{n: getattr(model, n) for n in ARRAYS})
    Path(f"{OUT}/{name}.json").write_text(json.dumps(info, default=float, indent=1))


def load(name: str) -> PositionalAttention:
    z = np.load(f"{OUT}/{name}.npz")
    return PositionalAttention(**{n: z[n] for n in ARRAYS}, position="rope", layout="half", scale=1.0, causal=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=("start", "polish", "signs", "mix", "final"))
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--from", dest="source", default=None, help="the saved state to start from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--held", action="store_true", help="hold every bias at zero (the LLaMA layer has none)")
    ap.add_argument("--tag", default="", help="suffix of the saved state's name")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    kw = dict(d=args.d, heads=args.heads, kv_heads=args.kv_heads, seed=0)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    oracle = Oracle(EveryRow(positional_victim("llama", dtype="bfloat16", **kw)), args.d, precision="bfloat16")
    tag = f"{args.d}_{args.heads}_{args.kv_heads}"

    def error(m, every=False):
        lengths, per = (tuple(range(1, 257)), 4) if every else (LENGTHS, 8)
        return function_error_over_lengths(m, truth, np.random.default_rng(5), lengths, per_length=per)

    t0 = time.perf_counter()
    options = {"frequencies": False, "cg_steps": bfloat16_rows.ROW_CG_STEPS, "dense": False, "compute": "float32",
               "held": ("bq", "bk", "bv", "bo") if args.held else (), "log": print}
    if args.stage == "start":
        model, measured = bfloat16_rows.logit_start(oracle, args.heads, np.random.default_rng(args.seed), log=print)
        save(model, f"start_{tag}", {**measured, "queries": oracle.queries})
        print(f"start: {error(model):.2e} over {len(LENGTHS)} lengths, {oracle.queries} queries, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        return
    source = args.source or {"polish": "start", "signs": "polish", "mix": "polish", "final": "signs"}[args.stage]
    model = load(f"{source}_{tag}")
    print(f"{source}: {error(model):.2e} over {len(LENGTHS)} lengths", flush=True)
    # the route's rows (stage polish and signs: the same seed, the same rows); final: fresh ones
    rng = np.random.default_rng(args.seed + (0 if args.stage != "final" else 1000))
    data = fresh_rows(oracle, args.sequences, rng, length=bfloat16_rows.ROW_TOKENS)
    if args.stage == "signs":
        model, info = choose_pair_signs(model, data, polish_options=options, log=print)
    elif args.stage == "mix":
        model, info = fit_slow_mixing(model, data, slow_pairs(model, data[0][0].shape[1]), rounds=args.rounds,
                                      compute="float32", log=print)
    else:
        model, rep = polish_rows(model, data, rounds=args.rounds, **options)
        info = rep.to_dict()
    save(model, f"{args.stage}{args.tag}_{tag}", info)
    print(f"{args.stage}: {error(model):.2e} over {len(LENGTHS)} lengths, every length 1 … 256: "
          f"{error(model, every=True):.2e}; {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
