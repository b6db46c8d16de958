"""Research: the float32 coarse RoPE start (bias-free, key probe) at LLaMA-3-8B's head shape and smaller widths:
``d_h = 128``, ``H = d/128`` query heads, ``max(1, H/4)`` key/value groups, rope base 5e5 (declared to the start),
a random-init float32 ``LlamaAttention`` (seed 0) answering its last position, against the float64 module.

Runs :func:`coarse.coarse_start`'s stages one by one and prints, per stage: queries, tokens (sequences × their
lengths: the victim's cost grows with tokens), the victim's seconds, the learner's seconds and the process's peak
memory so far; then the start's function error at lengths 2 / 17 / 256. ``--stop`` ends after a stage (the
later stages' plan is printed from their query formulas); ``--row-space``: the value maps on ``M``'s row space
(``per·r`` queries, ``r = KV·d_h``) instead of ``per·d``. Pokes nothing private; not shipped.

    PYTHONPATH=src python benchmarks/research/rope_8b_start.py --d 256
    PYTHONPATH=src python benchmarks/research/rope_8b_start.py --d 512 --row-space --stop values
    PYTHONPATH=src python benchmarks/research/rope_8b_start.py --victim-rate 256 512 1024 2048 4096
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import time

import numpy as np

from attnprobe.learners.positional import coarse, row_logits
from attnprobe.learners.positional.logit_samples import LOGIT_OFFSETS
from attnprobe.learners.positional.start_plan import coarse_start_tokens, row_logit_tokens, victim_macs_per_token
from attnprobe.learners.positional.value_span import span_queries, split_span, value_span
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention, rope_frequencies
from attnprobe.oracles.base import Oracle
from attnprobe.oracles.torch_adapter import TorchFunction
from attnprobe.targets.positional_modules import positional_victim, reference_model

LENGTHS = (2, 17, 256)
BASE = 5e5
STAGES = ("values", "walk", "value maps", "logit maps", "span", "split", "token scale")


class EveryRow:
    """A victim's every row (a decoder's causal rows)."""

    positions = "causal"

    def __init__(self, victim):
        self.victim, self.dtype, self.__name__ = victim, "float32", type(victim).__name__

    def __call__(self, X):
        return np.asarray(self.victim.every_position(X), dtype=np.float64)


class Timed:
    """The victim's answers, counting tokens and the victim's own seconds."""

    def __init__(self, fn):
        self.fn, self.dtype, self.__name__ = fn, fn.dtype, fn.__name__
        self.tokens, self.seconds = 0, 0.0
        if hasattr(fn, "positions"):
            self.positions = fn.positions

    def __call__(self, X):
        t0 = time.perf_counter()
        y = self.fn(X)
        self.seconds += time.perf_counter() - t0
        self.tokens += int(np.prod(np.shape(X)[:2]))
        return y


def shape(d: int) -> tuple[int, int]:
    H = max(1, d // 128)
    return H, max(1, H // 4)


def victim_rates(widths) -> None:
    """The float32 victim's seconds per token at each width: the start's 18-token probes and its 129-token logit
    sequences, batches of about 2,000 tokens (one thread)."""
    import torch

    torch.set_num_threads(1)
    print("| d | heads | MACs per token | µs per token, 18-token probes | µs per token, 129-token sequences |")
    for d in widths:
        H, kv = shape(d)
        fn = TorchFunction(positional_victim("llama", d=d, heads=H, kv_heads=kv, seed=0, dtype="float32",
                                             rope={"rope_type": "default", "rope_theta": BASE}), d)
        rates = []
        for n in (18, 129):
            X = np.random.default_rng(1).standard_normal((max(1, 2048 // n), n, d))
            fn(X[:1])
            t0 = time.perf_counter()
            fn(X)
            rates.append((time.perf_counter() - t0) / X.shape[0] / n * 1e6)
        print(f"| {d} | {H}/{kv} | {victim_macs_per_token(d, H, kv)} | {rates[0]:.1f} | {rates[1]:.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--victim-rate", type=int, nargs="+", metavar="D", help="only the victim's time per token")
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--per", type=int, default=coarse.VALUE_QUERIES, help="value maps' random queries per d (or r)")
    ap.add_argument("--row-space", action="store_true", help="value maps on M's row space: per·r queries")
    ap.add_argument("--stop", choices=STAGES, help="end after this stage")
    ap.add_argument("--logit-extra", type=int, help="the logit maps' extra sequences per regression (default the "
                    "route's: 2d for wide heads)")
    ap.add_argument("--samples", type=int, default=2, help="the logit maps' random sequences per entry of M(δ)")
    ap.add_argument("--values", default="walk", choices=("walk", "span"),
                    help="the value maps: the route's walk and value-map stage, or value_span.py's")
    ap.add_argument("--logits", default="route", choices=("route", "rows"),
                    help="the logit maps: the route's regressions, or row_logits.py's fit to every-position rows")
    ap.add_argument("--row-tokens", type=float, default=16, help="rows: tokens per input dimension (sequences of "
                    "d_h - 8 tokens)")
    ap.add_argument("--support", type=int, default=row_logits.SUPPORT, help="rows: nonzero coordinates per token")
    ap.add_argument("--rounds", type=int, default=row_logits.ROUNDS, help="rows: Gauss-Newton rounds")
    ap.add_argument("--cg-steps", type=int, default=row_logits.CG_STEPS, help="rows: conjugate-gradient steps a round")
    ap.add_argument("--cache", help="rows: an .npz of the value maps and token scale (written after the values, "
                    "read instead of them when it exists)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.victim_rate:
        return victim_rates(args.victim_rate)
    if args.logits == "rows" and args.values != "span":
        ap.error("--logits rows reads every-position rows: give --values span")
    d = args.d
    H, kv = shape(d)
    rope = {"rope_type": "default", "rope_theta": BASE}
    t0 = time.perf_counter()
    victim = positional_victim("llama", d=d, heads=H, kv_heads=kv, seed=0, dtype="float32", rope=rope)
    truth = reference_model(positional_victim("llama", d=d, heads=H, kv_heads=kv, seed=0, dtype="float64",
                                              rope=rope))
    fn = Timed(EveryRow(victim) if args.values == "span" else TorchFunction(victim, d))
    oracle = Oracle(fn, d, precision="float32")
    with oracle.phase("start", fresh=True):  # no answer kept for reuse
        run(args, oracle, fn, truth, H, kv, t0)


def run(args, oracle, fn, truth, H: int, kv: int, t0: float) -> None:
    d = args.d
    print(f"LLaMA d = {d}, {H}/{kv} heads, d_h = {d // H}, base {BASE:g}, float32 answers, per {args.per}"
          f"{' on M row space' if args.row_space else ''}; victims built in {time.perf_counter() - t0:.0f} s",
          flush=True)
    plan = {**coarse_start_tokens(d, H, kv, per=args.per, row_space=args.row_space), "token scale": (16, 16 * 129),
            **span_queries(d, H, kv)}
    rng = np.random.default_rng(args.seed)
    mark = dict(t=time.perf_counter(), q=oracle.queries, tok=0, vs=0.0)

    def stage(name: str, what: str = "") -> None:
        now = time.perf_counter()
        q, tok, vs = oracle.queries - mark["q"], fn.tokens - mark["tok"], fn.seconds - mark["vs"]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"| {d} | {name} | {q} (plan {plan[name][0]}) | {tok} | {vs:.1f} | {now - mark['t'] - vs:.1f} | "
              f"{peak:.2f} | {what} |", flush=True)
        mark.update(t=now, q=oracle.queries, tok=fn.tokens, vs=fn.seconds)

    print("| d | stage | queries (plan) | tokens | victim s | learner s | peak GB | measured |")
    if args.logits == "rows":
        plan["logit maps"] = row_logit_tokens(d, H, args.row_tokens, row_logits.MARGIN)
        if args.cache and os.path.exists(args.cache):
            z = np.load(args.cache)
            print(f"value maps, output bias and token scale read from {args.cache}", flush=True)
            return logits(args, oracle, fn, truth, rng, z["Cb"], z["G"], z["c"], float(z["scale"]), stage, t0)
    M, c = coarse.coarse_values(oracle, rng, math.sqrt(d))
    kernel = coarse.key_probe_kernel(M, H)
    Mt = truth.value_maps().sum(0)
    stage("values", f"M {np.linalg.norm(M - Mt) / np.linalg.norm(Mt):.1e} off; kernel "
          f"{0 if kernel is None else len(kernel)}")
    if args.stop == "values":
        return summary(plan, d)
    if args.values == "span":  # the value maps from kernel-token rows and a few key probes (value_span.py)
        Q = coarse.row_space_basis(kernel, d)
        S, sv = value_span(oracle, Q, kernel, H, rng)
        stage("span", f"gap s_H/s_H+1 = {sv[H - 1]:.1e}/{sv[H]:.1e}")
        V, far = split_span(oracle, S, Q, M, rng, kernel=kernel)
        errs = value_map_errors(V, truth.value_maps())
        stage("split", f"V_h off {errs.min():.1e} … {errs.max():.1e}; probes off their median "
              + " ".join(f"{x:.0e}" for x in np.sort(far)))
        Cb, G = coarse.split_value_maps(V, M)
        probe = rng.standard_normal((16, len(LOGIT_OFFSETS) + 1, d))
        ell = coarse.log_weights(oracle, Cb, G, c, probe, np.tile(LOGIT_OFFSETS, (16, 1)), -min(LOGIT_OFFSETS))
        med = max(float(np.nanmedian(np.abs(ell))), 1e-12)
        scale = float(np.clip(math.sqrt(coarse.TARGET_LOGIT / med), 1e-3, 1e3))
        stage("token scale", f"median logit {med:.2f}, token scale {scale:.2f}")
        if args.cache:
            np.savez(args.cache, Cb=Cb, G=G, c=c, scale=scale)
        if args.stop:
            return summary(plan, d)
        return logits(args, oracle, fn, truth, rng, Cb, G, c, scale, stage, t0)
    rough, G = coarse.coarse_output_spaces(oracle, M, rng, H, kernel=kernel)
    probe = rng.standard_normal((16, len(LOGIT_OFFSETS) + 1, d))
    ell = coarse.log_weights(oracle, rough, G, c, probe, np.tile(LOGIT_OFFSETS, (16, 1)), -min(LOGIT_OFFSETS))
    med = max(float(np.nanmedian(np.abs(ell))), 1e-12)
    scale = float(np.clip(math.sqrt(coarse.TARGET_LOGIT / med), 1e-3, 1e3))
    stage("walk", f"rough spaces; median logit {med:.2f}, token scale {scale:.2f}")
    if args.stop == "walk":
        return summary(plan, d)
    V = coarse.coarse_value_maps(oracle, M, rough, rng, H, per=args.per, kernel=kernel, row_space=args.row_space,
                                 query_scale=min(1.0, math.sqrt(coarse.PROBE_LOGIT / med)))
    errs = value_map_errors(V, truth.value_maps())
    stage("value maps", "V_h off " + " … ".join(f"{e:.1e}" for e in (errs.min(), errs.max())))
    if args.stop == "value maps":
        return summary(plan, d)
    Cb, G = coarse.split_value_maps(V, M)
    return logits(args, oracle, fn, truth, rng, Cb, G, c, scale, stage, t0)


def logits(args, oracle, fn, truth, rng, Cb, G, c, scale, stage, t0) -> None:
    d = args.d
    dh = G.shape[1]
    theta = rope_frequencies(dh, BASE)
    if args.logits == "rows":
        kv = shape(d)[1]
        count = row_logit_tokens(d, G.shape[0], args.row_tokens, row_logits.MARGIN)[0]
        Wq, Wk = row_logits.row_logit_maps(oracle, Cb, G, c, theta, kv, rng, sequences=count, support=args.support,
                                           scale=scale, rounds=args.rounds, cg_steps=args.cg_steps,
                                           log=lambda r, m: print(f"  round {r}: misfit {m:.2e}, "
                                                                  f"{time.perf_counter() - t0:.0f} s", flush=True))
        Wk = np.repeat(Wk, G.shape[0] // kv, axis=0)
    else:
        settings = coarse.logit_settings(d, dh)
        if args.logit_extra is not None:
            settings["extra"] = args.logit_extra
        Wq, Wk, count = coarse.logit_maps(oracle, rng, Cb, G, c, theta, scale, samples=args.samples, **settings)
    model = PositionalAttention(Wq, Wk, G, Cb, bo=c, position="rope", inv_freq=theta, layout="half", scale=1.0,
                                causal=True)
    stage("logit maps", f"{count} sequences")
    errors = [function_error_over_lengths(model, truth, np.random.default_rng(5), (n,)) for n in LENGTHS]
    print(f"start: {oracle.queries} queries, {fn.tokens} tokens, {time.perf_counter() - t0:.0f} s in all; "
          "function error at N = " + " / ".join(map(str, LENGTHS)) + ": " + " / ".join(f"{e:.1e}" for e in errors),
          flush=True)


def value_map_errors(V: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Each true head's value map's relative Frobenius error, the estimates matched to the heads."""
    from scipy.optimize import linear_sum_assignment

    err = np.array([[np.linalg.norm(v - t) / np.linalg.norm(t) for t in truth] for v in V])
    rows, cols = linear_sum_assignment(err)
    return err[rows, cols][np.argsort(cols)]


def summary(plan: dict, d: int) -> None:
    print("plan (queries, tokens) of every stage at d = " + str(d) + ": "
          + "; ".join(f"{k} {q} / {t}" for k, (q, t) in plan.items()), flush=True)


if __name__ == "__main__":
    main()
