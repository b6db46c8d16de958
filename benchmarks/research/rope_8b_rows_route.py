"""Research: the every-row RoPE route (:mod:`attnprobe.learners.positional.bfloat16_rows`'s stages) on FLOAT32 rows
at LLaMA-3-8B's head shape — ``d_h = 128``, ``H = d/128`` query heads, ``max(1, H/4)`` key/value groups, rope base
5e5 declared (as a Hugging Face folder's config declares it) — a random-init float32 ``LlamaAttention`` (seed 0)
answering every row, against the float64 module (docs/positional.md, "The every-row route at LLaMA-3-8B's size").

Each stage runs in its own process, saves ``/tmp/rope8b/<stage>_<d>.npz`` and prints one table row: queries,
tokens (the victim's cost is per token), victim seconds, learner seconds, the process's peak memory, and the
function error against the float64 module over every length 1 … 256 (``--per-length`` sequences each) of the model
made of this stage's output and the truth elsewhere:

    values     coarse_values: ``M``, ``c`` (the error: the value maps' sum, not a function)
    maps       span_sweep.row_value_maps (every ``V_h``; the truth's logit maps, heads matched)
    block      one block of block_logits (absolute_logit_samples on a block oracle, fit_logit_maps): its time, the
               normal matrix's size, its score maps against the truth's on the block (gauge-free) — the cost of
               ``blocks`` at widths where the whole stage is too long
    logits     the logit maps: ``blocks`` (block_logits: absolute logits on coordinate blocks, alternating least
               squares per block, gauges aligned on shared anchor coordinates), ``als`` (the route's
               absolute_logits on the whole input: its dense ``(d·d_h)²`` normal matrix is counted, refused past
               ``--max-gb``), ``rows`` (row_logits.row_logit_maps: Levenberg–Marquardt on the rows' log-weights
               from a random start, ``--als`` rounds of ``--cg-steps``), or ``truth`` (the default: the float64
               module's maps times ``exp`` of N(0, ``--perturb``²) noise in every entry, a start in the polish's
               basin, to time the polish)
    toy        block_logits end to end on a float64 layer at d = 64, 4/2 heads (d_h = 16), against the whole-input
               alternating fit on as many sequences (score maps and function; no victim)
    polish     row_polish.polish_rows (from the ``--logits`` method's start) on ``--sequences`` fresh sequences of
               256 rows, ``--rounds`` rounds of ``--cg-steps`` steps, chunks in float32; ``--resume`` from its own
               saved state

    PYTHONPATH=src python benchmarks/research/rope_8b_rows_route.py values --d 256
    PYTHONPATH=src python benchmarks/research/rope_8b_rows_route.py maps --d 256
    PYTHONPATH=src python benchmarks/research/rope_8b_rows_route.py logits --d 256 --logits blocks
    PYTHONPATH=src python benchmarks/research/rope_8b_rows_route.py polish --d 256 --rounds 2
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np

from attnprobe.learners.positional import bfloat16_rows as route
from attnprobe.learners.positional.coarse import coarse_values, split_value_maps, start_frequencies
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention
from attnprobe.oracles.base import Oracle
from attnprobe.targets.positional_modules import positional_victim, reference_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from positional_bfloat16 import matched_errors  # noqa: E402
from research.rope_8b_start import EveryRow, Timed  # noqa: E402  (float32 rows; tokens and victim seconds counted)

OUT = Path("/tmp/rope8b")
BASE = 5e5
ALL = tuple(range(1, 257))
STAGES = ("values", "maps", "block", "logits", "polish")


def shape(d: int) -> tuple[int, int]:
    H = max(1, d // 128)
    return H, max(1, H // 4)


def setup(d: int):
    H, G = shape(d)
    kw = dict(d=d, heads=H, kv_heads=G, seed=0, rope={"rope_type": "default", "rope_theta": BASE})
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    fn = Timed(EveryRow(positional_victim("llama", dtype="float32", **kw)))
    fn.rotary_frequencies = truth.inv_freq  # declared, as --hf-dir declares a folder's config
    return truth, fn, Oracle(fn, d, precision="float32")


def path(d: int, stage: str) -> Path:
    return OUT / f"{stage}_{d}.npz"


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def start_model(Wq, Wk, Cb, Gh, c, theta) -> PositionalAttention:
    return route.grouped_start(Wq, Wk, Cb, Gh, c, theta)


def matched_truth_logits(truth, V):
    """The truth's ``W_Q`` (scale in it) and ``W_K`` with its heads in the order of the recovered value maps ``V``
    (matched by the value maps; a recovered group is the truth's group of its first head)."""
    H = V.shape[0]
    T = truth.value_maps().reshape(H, -1)
    C = np.array([[np.linalg.norm(u - t) / np.linalg.norm(t) for t in T] for u in V.reshape(H, -1)])
    from scipy.optimize import linear_sum_assignment

    _, perm = linear_sum_assignment(C)
    per = H // truth.Wk.shape[0]
    Wq = truth.Wq[perm] * truth.scale
    Wk = truth.Wk[perm[::per] // per]
    return Wq, Wk


def every_length(model, truth, per_length: int, seed: int = 5) -> float:
    return function_error_over_lengths(model, truth, np.random.default_rng(seed), ALL, per_length=per_length)


def stage_values(args, truth, fn, oracle, rng):
    M, c = coarse_values(oracle, rng, math.sqrt(args.d), repeats=args.value_repeats)
    Mt = truth.value_maps().sum(0)
    np.savez(path(args.d, "values"), M=M, c=c)
    return {"error": float(np.linalg.norm(M - Mt) / np.linalg.norm(Mt)), "what": "M off"}


def stage_maps(args, truth, fn, oracle, rng):
    from attnprobe.learners.positional.span_sweep import row_value_maps

    v = np.load(path(args.d, "values"))
    V, info = row_value_maps(oracle, truth.Wq.shape[0], rng, M=v["M"], c=v["c"])
    errs = matched_errors(V.reshape(truth.Wq.shape[0], -1), truth.value_maps().reshape(truth.Wq.shape[0], -1))
    np.savez(path(args.d, "maps"), V=V, groups=info["groups"])
    t0 = time.perf_counter()
    Cb, Gh = split_value_maps(V, v["M"])
    Wq, Wk = matched_truth_logits(truth, V)
    model = start_model(Wq, Wk, Cb, Gh, v["c"], truth.inv_freq)
    print(f"  V_h off: median {np.median(errs):.1e}, worst {errs.max():.1e}; span gap {info['span_gap']:.1e}, "
          f"mixing misfit {info['mixing_misfit']:.1e}", flush=True)
    return {"error": every_length(model, truth, args.per_length), "what": "function (truth's logits)",
            "eval": time.perf_counter() - t0}


def saved_maps(d: int, oracle):
    """The values and maps stages' results: ``v`` (``M``, ``c``), ``V``, the groups, ``Cb``, ``Gh``, the frequencies."""
    v, m = np.load(path(d, "values")), np.load(path(d, "maps"))
    Cb, Gh = split_value_maps(m["V"], v["M"])
    return v, m["V"], int(m["groups"]), Cb, Gh, start_frequencies(oracle, Gh.shape[1])[0]


def stage_logits(args, truth, fn, oracle, rng):
    v, V, G, Cb, Gh, theta = saved_maps(args.d, oracle)
    H, dh, d = Gh.shape
    if args.logits == "truth":
        Wq, Wk = matched_truth_logits(truth, V)
        Wq = Wq * np.exp(args.perturb * rng.standard_normal(Wq.shape))
        Wk = Wk * np.exp(args.perturb * rng.standard_normal(Wk.shape))
    elif args.logits == "rows":
        from attnprobe.learners.positional import row_logits

        sequences = args.logit_sequences or math.ceil(16 * d / (dh - row_logits.MARGIN))
        Wq, Wk = row_logits.row_logit_maps(oracle, Cb, Gh, v["c"], theta, G, rng, sequences=sequences,
                                           rounds=args.als, cg_steps=args.cg_steps,
                                           log=lambda r, f: print(f"  round {r + 1}: misfit {f:.2e}", flush=True))
    elif args.logits == "als":
        gb = (d * dh) ** 2 * 8 * 2 / 2**30  # the normal matrix and its transposed copy
        if gb > args.max_gb:
            raise SystemExit(f"absolute_logits.fit_logit_maps forms a dense ({d * dh})² normal matrix per head and "
                             f"half-step: {gb:.1f} GB with its copy, over --max-gb {args.max_gb:g}")
        from attnprobe.learners.positional.absolute_logits import absolute_logit_samples, fit_logit_maps

        samples = absolute_logit_samples(oracle, Cb, Gh, c=v["c"], rng=rng, sequences=args.logit_sequences or 120)
        Wq, Wk, _ = fit_logit_maps(samples, H, G, theta, rng, rounds=args.als, log=print)
    else:
        from attnprobe.learners.positional.block_logits import block_logit_maps

        Wq, Wk, info = block_logit_maps(oracle, Cb, Gh, v["c"], theta, G, rng, block=args.block,
                                        anchor=args.anchor, sequences=args.logit_sequences or 40,
                                        tokens=args.tokens, rounds=args.als,
                                        log=lambda line: print(f"  {line}", flush=True))
        print(f"  blocks: {info}", flush=True)
    t0 = time.perf_counter()
    model = start_model(Wq, Wk, Cb, Gh, v["c"], theta)
    np.savez(path(args.d, f"logits-{args.logits}"), **model.arrays())
    return {"error": every_length(model, truth, args.per_length), "what": f"function (start, {args.logits})",
            "eval": time.perf_counter() - t0}


def scores_off(Wq, Wk, Wq_t, Wk_t, theta, deltas=(0.0, -10.0, -100.0, -250.0)):
    """``max over heads ‖B_h(δ) − B̂_h(δ)‖/‖B_h(δ)‖`` at each offset (the score maps: gauge-free)."""
    from attnprobe.models.positional import rotation_matrix

    H, dh, _ = Wq.shape
    per = H // Wk.shape[0]
    out = []
    for dl in deltas:
        R = rotation_matrix(dl, theta, dh)
        b = np.einsum("hai,ab,hbj->hij", Wq, R, Wk[np.arange(H) // per])
        t = np.einsum("hai,ab,hbj->hij", Wq_t, R, Wk_t[np.arange(H) // per])
        out.append(float(max(np.linalg.norm(b[h] - t[h]) / np.linalg.norm(t[h]) for h in range(H))))
    return out


def stage_block(args, truth, fn, oracle, rng):
    from attnprobe.learners.positional.absolute_logits import absolute_logit_samples, fit_logit_maps
    from attnprobe.learners.positional.block_logits import BlockOracle, block_coordinates

    v, V, G, Cb, Gh, theta = saved_maps(args.d, oracle)
    H, dh, d = Gh.shape
    blocks = block_coordinates(d, args.block, args.anchor, rng)
    S = blocks[0]
    data = absolute_logit_samples(BlockOracle(oracle, S), Cb, Gh[:, :, S], v["c"], rng,
                                  sequences=args.logit_sequences or 40, tokens=args.tokens,
                                  scale=math.sqrt(d / args.block))
    t0 = time.perf_counter()
    Wq, Wk, misfit = fit_logit_maps(data, H, G, theta, rng, rounds=args.als,
                                    log=lambda line: print(f"  {line} ({time.perf_counter() - t0:.0f} s)",
                                                           flush=True))
    learner = time.perf_counter() - t0
    Wq_t, Wk_t = matched_truth_logits(truth, V)
    off = scores_off(Wq, Wk, Wq_t[:, :, S], Wk_t[:, :, S], theta)
    n = args.block * dh
    print(f"  one block of {args.block} ({args.anchor} shared): {len(blocks)} blocks at d = {d}; samples "
          f"{int((data['w'] > 0).sum()):,}, normal matrix {n}² ({n * n * 8 / 2**30:.2f} GB), fit {learner:.0f} s "
          f"({args.als} rounds: {H + args.als * (H + G)} solves); misfit {misfit:.2e}; score maps off (worst head, "
          f"δ = 0 / -10 / -100 / -250) " + " / ".join(f"{e:.1e}" for e in off), flush=True)
    return {"error": off[-1], "what": "block's score maps at δ = -250", "learner": learner}


def toy(args) -> None:
    """block_logit_maps end to end on a float64 layer (``random_rope_attention(64, 4, 2)``, base 1e4, d_h = 16, its
    own value maps), against the whole-input alternating fit on as many sequences."""
    from attnprobe.learners.positional.absolute_logits import absolute_logit_samples, fit_logit_maps
    from attnprobe.learners.positional.block_logits import block_coordinates, block_logit_maps
    from attnprobe.targets import random_rope_attention

    d, H, G = 64, 4, 2
    m = random_rope_attention(d, H, G, seed=3, base=1e4)
    theta, c = np.asarray(m.inv_freq), m.output_bias()
    V = m.value_maps()
    Cb, Gh = split_value_maps(V, V.sum(0))
    lengths = (2, 17, 64, 256)
    for name in ("blocks", "whole"):
        oracle = Oracle(m.every_position, d, precision="float64")
        oracle.declare_positions("causal")
        rng = np.random.default_rng(args.seed)
        t0 = time.perf_counter()
        if name == "blocks":
            Wq, Wk, info = block_logit_maps(oracle, Cb, Gh, c, theta, G, rng, block=args.block, anchor=args.anchor,
                                            sequences=args.logit_sequences or 60, tokens=args.tokens,
                                            rounds=args.als)
            seqs = oracle.queries
            misfit = f"blocks' misfits {' / '.join(f'{f:.2e}' for f in info['misfits'])}"
        else:
            data = absolute_logit_samples(oracle, Cb, Gh, c, rng, sequences=seqs, tokens=args.tokens)
            Wq, Wk, f = fit_logit_maps(data, H, G, theta, rng, rounds=args.als)
            misfit = f"misfit {f:.2e}"
        off = scores_off(Wq, Wk, m.Wq * m.scale, m.Wk, theta)
        err = function_error_over_lengths(route.grouped_start(Wq, Wk, Cb, Gh, c, theta), m,
                                          np.random.default_rng(1), lengths)
        blocks = len(block_coordinates(d, args.block, args.anchor, np.random.default_rng(0)))
        print(f"| {name} ({blocks} blocks of {args.block}, {args.anchor} shared)" if name == "blocks" else
              "| whole input", f"| {oracle.queries} | {args.als} | {misfit} | "
              + " / ".join(f"{e:.1e}" for e in off) + f" | {err:.2e} | {time.perf_counter() - t0:.0f} |", flush=True)


def load_model(d: int, stage: str) -> PositionalAttention:
    p = dict(np.load(path(d, stage)))
    keep = {k: p[k] for k in ("Wq", "Wk", "Wv", "Wo")}
    extra = {k: p[k] for k in ("bq", "bk", "bv", "bo", "inv_freq") if k in p}
    return PositionalAttention(**keep, **extra, position="rope", layout="half", scale=1.0, causal=True)


def stage_polish(args, truth, fn, oracle, rng):
    from attnprobe.learners.positional.row_polish import fresh_rows, polish_rows

    model = load_model(args.d, f"polish-{args.logits}{args.tag}" if args.resume else f"logits-{args.logits}")
    data = fresh_rows(oracle, args.sequences, rng, length=route.ROW_TOKENS)
    learner = 0.0
    err = None
    for r in range(args.rounds):
        t0 = time.perf_counter()
        model, rep = polish_rows(model, data, rounds=1, frequencies=False, cg_steps=args.cg_steps, dense=False,
                                 compute="float32")
        learner += time.perf_counter() - t0
        np.savez(path(args.d, f"polish-{args.logits}{args.tag}"), **model.arrays())
        t1 = time.perf_counter()
        err = every_length(model, truth, args.per_length) if args.every_round or r == args.rounds - 1 else None
        print(f"  round {r + 1}: misfit {rep.misfit_before:.2e} -> {rep.misfit_after:.2e}, "
              f"{time.perf_counter() - t0 - (time.perf_counter() - t1):.0f} s"
              + (f", every length {err:.2e} ({time.perf_counter() - t1:.0f} s)" if err is not None else ""),
              flush=True)
    return {"error": err, "what": "function (polished)", "learner": learner}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=STAGES + ("toy",))
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--per-length", type=int, default=2, help="sequences per length in the function error")
    ap.add_argument("--value-repeats", type=int, default=2, help="values: one-token sequences per dimension and sign")
    ap.add_argument("--logits", default="truth", choices=("blocks", "als", "rows", "truth", "anchor"),
                    help="logits: the method; polish: the start (that method's saved maps)")
    ap.add_argument("--perturb", type=float, default=0.3, help="logits truth: log-normal noise in every entry")
    ap.add_argument("--max-gb", type=float, default=4.0, help="logits als: the largest normal matrix formed")
    ap.add_argument("--block", type=int, default=32, help="logits blocks: coordinates per block (anchor included)")
    ap.add_argument("--anchor", type=int, default=8, help="logits blocks: coordinates every block shares")
    ap.add_argument("--logit-sequences", type=int, help="logits: zero-padded sequences (per block; default 40), "
                    "rows: sequences of d_h - 8 tokens (default 16·d tokens)")
    ap.add_argument("--tokens", type=int, default=12, help="logits blocks: random tokens per sequence")
    ap.add_argument("--als", type=int, default=route.LOGIT_ROUNDS, help="logits: alternating rounds")
    ap.add_argument("--sequences", type=int, default=route.ROW_SEQUENCES, help="polish: fresh sequences of 256 rows")
    ap.add_argument("--rounds", type=int, default=1, help="polish: rounds")
    ap.add_argument("--cg-steps", type=int, default=route.ROW_CG_STEPS, help="polish: conjugate-gradient steps")
    ap.add_argument("--every-round", action="store_true", help="polish: the function error after every round")
    ap.add_argument("--tag", default="", help="polish: a suffix to its saved state's name (runs side by side)")
    ap.add_argument("--resume", action="store_true", help="polish: from its own saved state")
    ap.add_argument("--seed", type=int, default=0, help="the stage's randomness (plus 10 per stage)")
    args = ap.parse_args()
    if args.stage == "toy":
        return toy(args)
    OUT.mkdir(exist_ok=True)
    import torch

    torch.set_num_threads(1)
    truth, fn, oracle = setup(args.d)
    H, G = shape(args.d)
    t0 = time.perf_counter()
    with oracle.phase(args.stage, fresh=True):  # no answer kept for reuse
        out = globals()[f"stage_{args.stage}"](args, truth, fn, oracle,
                                               np.random.default_rng(args.seed + 10 * STAGES.index(args.stage)))
    total = time.perf_counter() - t0
    learner = out.get("learner", total - fn.seconds - out.get("eval", 0.0))
    err = "—" if out["error"] is None else f"{out['error']:.2e}"
    print(f"| {args.d} | {H}/{G} | {args.stage} | {oracle.queries:,} | {fn.tokens:,} | {fn.seconds:.0f} | "
          f"{learner:.0f} | {peak_gb():.2f} | {err} ({out['what']}) |", flush=True)


if __name__ == "__main__":
    main()
