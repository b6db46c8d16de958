"""Research: the sign of a low frequency pair's sine part in one key/value group, tested by the row polish's misfit
(docs/positional.md, "bfloat16 answers": where the d = 128 error sits). From the row-polished state of
``bfloat16_rows.py`` (/tmp/bf16rows/polished_128_8_2.npz), negate pair ``k``'s second coordinate (rotate-half:
``k + d_h/2``) in group ``g``'s ``W_K`` and its heads' ``W_Q`` — the pair's form ``conj(q) kᵀ`` becomes its conjugate
— then row-polish on fresh bfloat16 rows; ``--no-flip`` polishes the same rows unflipped (the control).

    PYTHONPATH=src python benchmarks/research/bfloat16_low_pair_flip.py --group 1 --pair 7 --rounds 5
    PYTHONPATH=src python benchmarks/research/bfloat16_low_pair_flip.py --no-flip --rounds 2
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from attnprobe.learners.positional.row_polish import fresh_rows, polish_rows
from attnprobe.models.compare import function_error_over_lengths

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bfloat16_rows import OUT, grouped_start, setup  # noqa: E402

LENGTHS = (1, 2, 3, 5, 17, 64, 100, 128, 160, 200, 256)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--group", type=int, default=1)
    ap.add_argument("--pair", type=int, default=7)
    ap.add_argument("--no-flip", dest="flip", action="store_false")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sequences", type=int, default=48)
    ap.add_argument("--seed", type=int, default=31)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)

    class Shape:
        d, heads, kv_heads = 128, 8, 2
    truth, oracle = setup(Shape)
    z = np.load(f"{OUT}/start_128_8_2.npz")
    p = np.load(f"{OUT}/polished_128_8_2.npz")
    model = replace(grouped_start(z["Wq"], z["Wk"], z["Gh"], z["Cb"], z["c"], z["theta"]), **{n: p[n] for n in p.files})
    if args.flip:
        H, dh, _ = model.Wq.shape
        G = model.Wk.shape[0]
        Wq, Wk = model.Wq.copy(), model.Wk.copy()
        heads = [h for h in range(H) if h // (H // G) == args.group]
        Wq[heads, dh // 2 + args.pair] *= -1
        Wk[args.group, dh // 2 + args.pair] *= -1
        model = replace(model, Wq=Wq, Wk=Wk)

    def error(m, lengths, per):
        return function_error_over_lengths(m, truth, np.random.default_rng(5), lengths, per_length=per)
    print(f"start ({'flipped' if args.flip else 'as polished'}): {error(model, LENGTHS, 8):.2e} over "
          f"{len(LENGTHS)} lengths", flush=True)
    t0 = time.perf_counter()
    data = fresh_rows(oracle, args.sequences, np.random.default_rng(args.seed))
    for r in range(args.rounds):
        model, rep = polish_rows(model, data, rounds=1, compute="float32", cg_steps=60, frequencies=False,
                                 dense=False)
        print(f"round {r + 1}: misfit {rep.misfit_before:.2e} -> {rep.misfit_after:.2e}, function "
              f"{error(model, LENGTHS, 8):.2e}, {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"every length 1 … 256 (4 sequences each): {error(model, tuple(range(1, 257)), 4):.2e}", flush=True)


if __name__ == "__main__":
    main()
