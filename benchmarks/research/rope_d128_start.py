"""Research: the bias-free coarse RoPE start with the key probe for the heads, LLaMA 8/2 heads at d = 128 (d_h = 16),
float32 answers (a random-init ``LlamaAttention``, seed 0), against the float64 module.

The coarse route's stages (``learners/positional/coarse.py``, ``coarse_start``) run one by one, with the heads read
either by the zero-key pair probe (the bias-free route) or by the key probe inside the kernel of the value maps' sum
``M`` (``coarse_bias.coarse_kernel``: the q/k-bias route's probe; heads sharing keys and values), and the logit maps
with the route's settings for the width (``coarse.logit_settings``: ``extra = 2d`` and no alternating least squares for
wide heads). Prints each head's value map's error against the truth (relative Frobenius, heads matched), the start's
function error per length, the queries and seconds of each stage; ``--polish``: then polish rounds on fresh answers
(``polish(relative=True)``, as the route's hook). Pokes nothing private; not shipped.

    PYTHONPATH=src python benchmarks/research/rope_d128_start.py --d 64 --heads 4 --kv-heads 1
    PYTHONPATH=src python benchmarks/research/rope_d128_start.py --probe pair --d 64 --heads 4 --kv-heads 1
    PYTHONPATH=src python benchmarks/research/rope_d128_start.py --save start.npz   # d = 128, 8/2
    PYTHONPATH=src python benchmarks/research/rope_d128_start.py --load start.npz --polish 300 --rounds 2
    PYTHONPATH=src python benchmarks/research/rope_d128_start.py --route [--route-polish always]   # the route
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from attnprobe.learners.positional import coarse
from attnprobe.learners.positional.coarse_bias import coarse_kernel
from attnprobe.learners.positional.polish import fresh_answers, polish
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention, rope_frequencies
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.targets.positional_modules import positional_victim, reference_model

LENGTHS = (2, 17, 256)


def value_map_errors(V: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Each true head's value map's relative Frobenius error, the estimates matched to the heads."""
    err = np.array([[np.linalg.norm(v - t) / np.linalg.norm(t) for t in truth] for v in V])
    rows, cols = linear_sum_assignment(err)
    return err[rows, cols][np.argsort(cols)]


def function_errors(model, truth) -> str:
    return " / ".join(f"{function_error_over_lengths(model, truth, np.random.default_rng(5), (n,)):.1e}"
                      for n in LENGTHS)


def start(oracle, truth, H: int, probe: str, per: int, seed: int):
    """The coarse start's stages with ``probe`` (``pair`` or ``key``) for the heads; prints each stage."""
    rng = np.random.default_rng(seed)
    d = oracle.d
    t0, q0 = time.perf_counter(), oracle.queries

    def stage(name: str, what: str = "") -> None:
        nonlocal t0, q0
        print(f"  {name}: {oracle.queries - q0} queries, {time.perf_counter() - t0:.0f} s {what}", flush=True)
        t0, q0 = time.perf_counter(), oracle.queries

    M, c = coarse.coarse_values(oracle, rng, math.sqrt(d))
    kernel = coarse_kernel(M, H) if probe == "key" else None
    stage("values", f"(M {np.linalg.norm(M - truth.value_maps().sum(0)) / np.linalg.norm(M):.1e} off"
          + (f"; kernel {len(kernel)} dimensions)" if kernel is not None else ")"))
    rough, G = coarse.coarse_output_spaces(oracle, M, rng, H, kernel=kernel)
    offs = coarse.LOGIT_OFFSETS
    toks = rng.standard_normal((16, len(offs) + 1, d))
    ell = coarse.log_weights(oracle, rough, G, c, toks, np.tile(offs, (16, 1)), -min(offs))
    med = max(float(np.nanmedian(np.abs(ell))), 1e-12)
    scale = float(np.clip(math.sqrt(coarse.TARGET_LOGIT / med), 1e-3, 1e3))
    stage("walk + token scale", f"(median |logit| {med:.2f}, scale {scale:.2f})")
    V = coarse.coarse_value_maps(oracle, M, rough, rng, H, per=per, kernel=kernel,
                                 query_scale=min(1.0, math.sqrt(coarse.PROBE_LOGIT / med)))
    errs = value_map_errors(V, truth.value_maps())
    stage("value maps", "(V_h off: " + " ".join(f"{e:.1e}" for e in errs) + ")")
    Cb, G = coarse.split_value_maps(V, M)
    dh = G.shape[1]
    theta = rope_frequencies(dh, coarse.DEFAULT_BASE)
    Wq, Wk, count = coarse.logit_maps(oracle, rng, Cb, G, c, theta, scale, **coarse.logit_settings(d, dh))
    model = PositionalAttention(Wq, Wk, G, Cb, bo=c, position="rope", inv_freq=theta, layout="half", scale=1.0,
                                causal=True)
    stage("logit maps", f"({count} sequences)")
    return model, errs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--probe", default="key", choices=("key", "pair"), help="the heads' probe")
    ap.add_argument("--per", type=int, default=coarse.VALUE_QUERIES, help="value maps' random queries per d")
    ap.add_argument("--seed", type=int, default=0, help="the start's rng (the module: seed 0)")
    ap.add_argument("--save", help="write the start's arrays to this .npz")
    ap.add_argument("--load", help="read the start from this .npz instead of running it")
    ap.add_argument("--polish", type=int, default=0, help="fresh sequences for the polish (0: none)")
    ap.add_argument("--rounds", type=int, default=2, help="the polish's rounds")
    ap.add_argument("--route", action="store_true", help="the route itself (extract_any_positional)")
    ap.add_argument("--family", default="llama", choices=("llama", "qwen2"), help="--route: the module (qwen2: q/k/v "
                    "biases)")
    ap.add_argument("--route-polish", default="never", choices=("never", "always", "auto"),
                    help="--route: its polish hook")
    args = ap.parse_args()
    kw = dict(d=args.d, heads=args.heads, kv_heads=args.kv_heads, seed=0)
    truth = reference_model(positional_victim(args.family, dtype="float64", **kw))
    oracle = oracle_from_torch(positional_victim(args.family, dtype="float32", **kw), args.d, precision="float32")
    print(f"{args.family} d = {args.d}, {args.heads}/{args.kv_heads} heads, float32 answers, probe {args.probe}, "
          f"per {args.per}", flush=True)
    t0 = time.perf_counter()
    if args.route:
        from attnprobe.learners.positional.route import extract_any_positional

        res = extract_any_positional(oracle, heads=args.heads, seed=args.seed, polish=args.route_polish)
        polished = res.details.get("polish", {})
        if polished.get("ran"):
            print(f"  polish: {polished['sequences']} sequences, {polished['rounds']} rounds (planned "
                  f"{polished['planned_rounds']} × {polished['cg_steps']} CG steps), misfit "
                  f"{polished['misfit_before']:.1e} → {polished['misfit_after']:.1e}, check "
                  f"{polished['check_before']:.1e} → {polished['check_after']:.1e}, kept {polished['kept']}, "
                  f"{polished['seconds']:.0f} s", flush=True)
        print(f"route: {res.queries} queries, {time.perf_counter() - t0:.0f} s, head probe "
              f"{res.details.get('head_probe')}, check (worst length) {res.check.error:.1e} "
              f"{'passed' if res.check.passed else 'FAILED'}; function error at N = " + " / ".join(map(str, LENGTHS))
              + f": {function_errors(res.model, truth)}", flush=True)
        return
    if args.load:
        a = np.load(args.load)
        model = PositionalAttention(a["Wq"], a["Wk"], a["Wv"], a["Wo"], bo=a["bo"], position="rope",
                                    inv_freq=a["inv_freq"], layout="half", scale=1.0, causal=True)
    else:
        model, _ = start(oracle, truth, args.heads, args.probe, args.per, args.seed)
        print(f"start: {oracle.queries} queries, {time.perf_counter() - t0:.0f} s; function error at N = "
              + " / ".join(map(str, LENGTHS)) + f": {function_errors(model, truth)}", flush=True)
        if args.save:
            np.savez(args.save, Wq=model.Wq, Wk=model.Wk, Wv=model.Wv, Wo=model.Wo, bo=model.bo,
                     inv_freq=model.inv_freq)
    if args.polish:
        q0, t1 = oracle.queries, time.perf_counter()
        data = fresh_answers(oracle, args.polish, np.random.default_rng([args.seed, 0x9011]))
        polished, report = polish(model, data, frequencies=True, rounds=args.rounds, relative=True)
        print(f"polish: {oracle.queries - q0} sequences, {report.rounds} rounds, misfit {report.misfit_before:.1e} → "
              f"{report.misfit_after:.1e}, {time.perf_counter() - t1:.0f} s; function error at N = "
              + " / ".join(map(str, LENGTHS)) + f": {function_errors(polished, truth)}", flush=True)


if __name__ == "__main__":
    main()
