"""Research: Qwen2 (RoPE + GQA + q/k/v biases) from bfloat16 every-position answers, stage by stage, each measured
against the float64 module (docs/positional.md, "bfloat16 answers", "Qwen2"). Stages save .npz under
/tmp/qwen2bf16/ and resume.

    PYTHONPATH=src python benchmarks/research/qwen2_bfloat16.py served --d 128 --heads 8 --kv-heads 2
    PYTHONPATH=src python benchmarks/research/qwen2_bfloat16.py neutral --length 256 --steps 8 --refresh 3
    PYTHONPATH=src python benchmarks/research/qwen2_bfloat16.py values          (--true-x0: the truth's token)
    PYTHONPATH=src python benchmarks/research/qwen2_bfloat16.py logits --sequences 120 --als 6
    PYTHONPATH=src python benchmarks/research/qwen2_bfloat16.py polish --polish-sequences 24 --polish-stages 14

(d = 64, 4/1 by default; ``--d 128 --heads 8 --kv-heads 2`` under the heavy-run lock.) The zero token ``x₀`` (every
group's key and value zero) is read by ``learners/positional/bias_rows.py``; the later stages run on the rows of the
tokens shifted by it, the logit stage's ALS with the query augmented by a 1 (the query bias ``b' = W_Q x₀ + b_Q``),
and the model is shifted back before the row polish, which fits every bias.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from attnprobe.learners.positional import coarse, coarse_bias
from attnprobe.learners.positional.bias_rows import (QUERY_SCALE, identical_token_residual, neutral_token,
                                                     probe_moves, zero_value_token)
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.base import Oracle
from attnprobe.targets.positional_modules import positional_victim, reference_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from positional_bfloat16 import EveryRow  # noqa: E402  (the bfloat16 victim's every row)

OUT = Path("/tmp/qwen2bf16")
LENGTHS9 = (1, 2, 3, 5, 17, 64, 100, 200, 256)
ALL = tuple(range(1, 257))


class ShiftedRows:
    """Every row of the served layer on ``X + x₀`` (the shifted frame; a prototype's shift_inputs for rows)."""

    positions, dtype = "causal", "bfloat16"

    def __init__(self, fn, x0):
        self.fn, self.x0, self.victim = fn, x0, fn.victim

    def __call__(self, X):
        return self.fn(np.asarray(X, dtype=np.float64) + self.x0)


def shift_inputs(oracle, x0):
    return Oracle(ShiftedRows(oracle.fn, x0), oracle.d, precision="bfloat16")


def tag(args):
    return f"{args.d}_{args.heads}_{args.kv_heads}"


def suffix(args):
    return "_true" if args.true_x0 else f"_r{args.x0_residual:g}" if args.x0_residual else ""


def setup(args, family="qwen2"):
    kw = dict(d=args.d, heads=args.heads, kv_heads=args.kv_heads, seed=0)
    truth = reference_model(positional_victim(family, dtype="float64", **kw))
    victim = positional_victim(family, dtype="bfloat16", **kw)
    return truth, Oracle(EveryRow(victim), args.d, precision="bfloat16")


def key_residual(truth, x0, pairs=False):
    """``‖W_K x₀ + b_K‖ / ‖b_K‖`` over every group (the truth's); ``pairs``: per RoPE frequency pair (fastest
    first, half layout)."""
    k = np.einsum("gad,d->ga", truth.Wk, x0) + truth.bk
    if pairs:
        h = k.shape[1] // 2
        return np.sqrt((k[:, :h] ** 2 + k[:, h:] ** 2).sum(0)) / np.linalg.norm(truth.bk)
    return float(np.linalg.norm(k) / np.linalg.norm(truth.bk))


def value_residual(truth, x0):
    """``‖M x₀ + c‖ / ‖c‖``: the output constant left on a sequence of copies of ``x₀``."""
    c = truth.output_bias()
    return float(np.linalg.norm(truth.value_maps().sum(0) @ x0 + c) / np.linalg.norm(c))


def true_neutral(truth):
    """The least-norm ``x₀`` with every group's key and value zero (``W x₀ + b = 0``)."""
    d = truth.Wk.shape[-1]
    W = np.concatenate([truth.Wk.reshape(-1, d), truth.Wv.reshape(-1, d)])
    return -np.linalg.lstsq(W, np.concatenate([truth.bk.ravel(), truth.bv.ravel()]), rcond=None)[0]


# ------------------------------------------------------------------------------------------------ served
def stage_served(args, truth, oracle, rng):
    class Served:
        def __init__(self, o):
            self.o, self.d = o, o.d

        def __call__(self, X):
            return np.asarray(self.o(X), dtype=np.float64)
    for fam in ("llama", "qwen2"):
        t, o = setup(args, fam)
        v = o.fn.victim
        for name, lengths in (("9 lengths", LENGTHS9), ("1…256", ALL)):
            e1 = function_error_over_lengths(Served(o), t, np.random.default_rng(5), lengths)
            e2 = function_error_over_lengths(reference_model(v), t, np.random.default_rng(5), lengths)
            print(f"{fam} d={args.d} {args.heads}/{args.kv_heads} {name}: served answers {e1:.1e}, its rounded "
                  f"weights in float64 {e2:.1e}", flush=True)


# ------------------------------------------------------------------------------------------------ neutral key
def stage_neutral(args, truth, oracle, rng):
    """The value half of x₀ from the values stage (``M x₀ = −c``), the key half in M's kernel by the probe
    (``bias_rows.neutral_token``); every key residual measured against the truth's."""
    d = args.d
    t0 = time.perf_counter()
    M, c = coarse.coarse_values(oracle, rng, math.sqrt(d), repeats=16)
    kernel = coarse_bias.coarse_kernel(M, args.heads)
    rank = d - len(kernel)
    xv = zero_value_token(M, c, kernel)
    print(f"values: M {np.linalg.norm(M - truth.value_maps().sum(0)) / np.linalg.norm(truth.value_maps().sum(0)):.1e}"
          f" off, kernel {len(kernel)}, rank {rank}; |M x_v + c| / |c| {value_residual(truth, xv):.1e}; "
          f"{oracle.queries} queries", flush=True)
    U, Z = probe_moves(rng, args.n_u, args.length, kernel, 0.0 if args.old_probe else QUERY_SCALE)
    for name, x in (("the true neutral key", true_neutral(truth)), ("x_v", xv)):
        F = identical_token_residual(oracle, x, U, Z, M, move=args.eps)
        print(f"  |F| at {name}: {np.linalg.norm(F):.3e}", flush=True)
    # --old-probe: no query row (its residual also vanishes where queries, not keys, are zero: did not work)
    x0, info = neutral_token(oracle, M, c, kernel, rng, steps=args.steps, length=args.length, patterns=args.n_u,
                             difference=args.eta, refresh=args.refresh, move=args.eps,
                             query_scale=0.0 if args.old_probe else QUERY_SCALE,
                             log=lambda line: print(f"  {line}; {oracle.queries} q", flush=True))
    print(f"  {info}")
    print("  per frequency pair (fastest first): " + " ".join(f"{x:.1e}" for x in key_residual(truth, x0, True)))
    print(f"neutral key: key residual {key_residual(truth, x0):.3e}, value residual {value_residual(truth, x0):.1e};"
          f" {oracle.queries} queries, {time.perf_counter() - t0:.0f} s", flush=True)
    np.savez(OUT / f"neutral_{tag(args)}.npz", x0=x0, M=M, c=c, kernel=kernel)


# ------------------------------------------------------------------------------------------------ values
def load_x0(args, truth):
    z = np.load(OUT / f"neutral_{tag(args)}.npz")
    x0 = true_neutral(truth) if args.true_x0 or args.x0_residual else z["x0"]
    if args.x0_residual:  # the truth's neutral key moved to a given key residual (the stages' tolerance)
        step = np.random.default_rng(7).standard_normal(len(x0))
        Wv = truth.Wv.reshape(-1, len(x0))
        step -= np.linalg.pinv(Wv) @ (Wv @ step)  # values kept zero: the key residual alone
        moved = np.linalg.norm(np.einsum("gad,d->ga", truth.Wk, step)) / np.linalg.norm(truth.bk)
        x0 = x0 + step * args.x0_residual / moved
    return x0, z["M"], z["c"]


def stage_values(args, truth, oracle, rng):
    from attnprobe.learners.positional.span_sweep import row_value_maps

    from bfloat16_rows import matched
    x0, M, c = load_x0(args, truth)
    print(f"x0: key residual {key_residual(truth, x0):.3e}" + (" (the truth's)" if args.true_x0 else ""))
    shifted = shift_inputs(oracle, x0)
    t0 = time.perf_counter()
    V, info = row_value_maps(shifted, args.heads, rng, M=M, c=c + M @ x0)
    e = matched(V, truth.value_maps())
    print(f"values: V_h off {' '.join(f'{x:.1e}' for x in e)}; {info}; {oracle.queries} queries, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    np.savez(OUT / f"values_{tag(args)}{suffix(args)}.npz", V=V, x0=x0, M=M, c=c)


# ------------------------------------------------------------------------------------------------ logits
def stage_logits(args, truth, oracle, rng):
    from attnprobe.learners.positional.coarse import split_value_maps
    from attnprobe.learners.positional.neutral import shifted_back
    from attnprobe.models.positional import rope_frequencies

    from bfloat16_rows import fit_logit_maps, grouped_start, row_logits
    sfx = suffix(args)
    z = np.load(OUT / f"values_{tag(args)}{sfx}.npz")
    x0, M, c = z["x0"], z["M"], z["c"]
    V = truth.value_maps() if args.true_values else z["V"]
    shifted = shift_inputs(oracle, x0)
    Cb, Gh = split_value_maps(V, M)
    H, G, dh = args.heads, args.kv_heads, args.d // args.heads
    t0 = time.perf_counter()
    data = row_logits(shifted, Cb, Gh, c + M @ x0, rng, args.sequences, args.tokens, 288, 32, 1.0)
    print(f"row logits: {(data['w'] > 0).sum()} samples; {oracle.queries} queries, {time.perf_counter() - t0:.0f} s",
          flush=True)
    n = len(data["q"])
    data["q"] = np.concatenate([data["q"], np.ones((n, 1))], axis=1)  # the query bias b' = W_Q x₀ + b_Q
    data["k"] = np.concatenate([data["k"], np.zeros((n, 1))], axis=1)
    theta = rope_frequencies(dh, 1e4)
    Wq, Wk = fit_logit_maps(data, H, G, dh, theta, rng, rounds=args.als)
    model = grouped_start(Wq[..., :-1], Wk[..., :-1], Gh, Cb, c + M @ x0, theta)
    model = replace(model, bq=Wq[..., -1])
    back = shifted_back(model, x0)
    errs = [function_error_over_lengths(back, truth, np.random.default_rng(5), (n,)) for n in (2, 17, 64, 256)]
    print(f"logit maps: {time.perf_counter() - t0:.0f} s; start error at N = 2/17/64/256: "
          + " / ".join(f"{e:.1e}" for e in errs), flush=True)
    np.savez(OUT / f"start_{tag(args)}{sfx}.npz", **{k: np.asarray(getattr(back, k)) for k in
                                                     ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo", "inv_freq")})


def stage_polish(args, truth, oracle, rng):
    from attnprobe.learners.positional.row_polish import fresh_rows, polish_rows
    from attnprobe.models.positional import PositionalAttention
    sfx = suffix(args)
    name = OUT / (f"polished_{tag(args)}{sfx}.npz" if args.resume else f"start_{tag(args)}{sfx}.npz")
    p = dict(np.load(name))
    model = PositionalAttention(p.pop("Wq"), p.pop("Wk"), p.pop("Wv"), p.pop("Wo"), position="rope", layout="half",
                                scale=1.0, causal=True, **p)
    print(f"start: {function_error_over_lengths(model, truth, np.random.default_rng(5), LENGTHS9):.2e}", flush=True)
    t0 = time.perf_counter()
    data = fresh_rows(oracle, args.polish_sequences, rng)
    print(f"{args.polish_sequences} sequences × 256 rows, {time.perf_counter() - t0:.0f} s", flush=True)
    for stage in range(args.polish_stages):
        model, rep = polish_rows(model, data, rounds=args.polish_rounds, compute="float32", cg_steps=args.cg_steps,
                                 log=print, dense=False)
        err = function_error_over_lengths(model, truth, np.random.default_rng(5), LENGTHS9)
        print(f"polish {stage + 1}: misfit {rep.misfit_before:.2e} -> {rep.misfit_after:.2e}, function error "
              f"{err:.2e}, {time.perf_counter() - t0:.0f} s", flush=True)
        np.savez(OUT / f"polished_{tag(args)}{sfx}.npz", **{k: np.asarray(getattr(model, k)) for k in
                 ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo", "inv_freq")})
    for seed in (5, 6):
        print(f"every length 1…256 (seed {seed}): "
              f"{function_error_over_lengths(model, truth, np.random.default_rng(seed), ALL):.2e}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=("served", "neutral", "values", "logits", "polish"))
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--refresh", type=int, default=3)
    ap.add_argument("--old-probe", action="store_true", help="the probe without its query row (did not work)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--n-u", type=int, default=4)
    ap.add_argument("--eta", type=float, default=0.2)
    ap.add_argument("--true-x0", action="store_true")
    ap.add_argument("--x0-residual", type=float, default=0.0)
    ap.add_argument("--true-values", action="store_true")
    ap.add_argument("--sequences", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--als", type=int, default=12)
    ap.add_argument("--polish-sequences", type=int, default=16)
    ap.add_argument("--polish-rounds", type=int, default=1)
    ap.add_argument("--polish-stages", type=int, default=6)
    ap.add_argument("--cg-steps", type=int, default=60)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    OUT.mkdir(exist_ok=True)
    truth, oracle = setup(args)
    rng = np.random.default_rng(args.seed)
    {"served": stage_served, "neutral": stage_neutral, "values": stage_values, "logits": stage_logits,
     "polish": stage_polish}[args.stage](args, truth, oracle, rng)


if __name__ == "__main__":
    main()
