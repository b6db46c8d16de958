"""Research: RoPE (LLaMA, GQA) from bfloat16 every-position answers, stage by stage, each measured against the
float64 module (docs/positional.md, "bfloat16 answers"). Stages save .npz under /tmp/bf16rows/ and resume.

    PYTHONPATH=src python benchmarks/research/bfloat16_rows.py values --d 128 --heads 8 --kv-heads 2
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

from attnprobe.learners.positional import coarse
from attnprobe.learners.positional.value_span import split_span, value_span
from attnprobe.oracles.base import Oracle
from attnprobe.targets.positional_modules import positional_victim, reference_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from positional_bfloat16 import EveryRow  # noqa: E402  (the bfloat16 victim's every row)

OUT = "/tmp/bf16rows"


def setup(args):
    kw = dict(d=args.d, heads=args.heads, kv_heads=args.kv_heads, seed=0)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    victim = positional_victim("llama", dtype="bfloat16", **kw)
    return truth, Oracle(EveryRow(victim), args.d, precision="bfloat16")


def matched(V, T):
    C = np.array([[np.linalg.norm(a - b) / np.linalg.norm(b) for b in T] for a in V])
    r, c = linear_sum_assignment(C)
    return C[r, c]


def stage_values(args, truth, oracle, rng):
    d, H = args.d, args.heads
    t0 = time.perf_counter()
    M, c = coarse.coarse_values(oracle, rng, math.sqrt(d), repeats=args.repeats)
    Mt = truth.value_maps().sum(0)
    kernel = coarse.key_probe_kernel(M, H, key_probe=True)
    Q = coarse.row_space_basis(kernel, d)
    print(f"values: M {np.linalg.norm(M - Mt) / np.linalg.norm(Mt):.1e} off, kernel {len(kernel)}, "
          f"{oracle.queries} queries, {time.perf_counter() - t0:.0f} s", flush=True)
    t0 = time.perf_counter()
    S, sv = value_span(oracle, Q, kernel, H, rng, rows=args.rows, key_scale=args.key_scale)
    # every true V_h's distance from the span
    served = reference_model(oracle.fn.victim)  # the served layer's own (bfloat16-rounded) weights
    for name, maps in (("the served layer's", served.value_maps()), ("float64", truth.value_maps())):
        off = [np.linalg.norm(V @ Q.T - np.einsum("h,har->ar", np.einsum("har,ar->h", S, V @ Q.T), S))
               / np.linalg.norm(V @ Q.T) for V in maps]
        print(f"  {name} V_h off the span {min(off):.1e} … {max(off):.1e}")
    off = []
    for V in truth.value_maps():
        t = V @ Q.T
        off.append(np.linalg.norm(t - np.einsum("h,har->ar", np.einsum("har,ar->h", S, t), S)) / np.linalg.norm(t))
    print(f"span: sv {' '.join(f'{s:.2e}' for s in sv[:H + 2])}; V_h off the span {min(off):.1e} … {max(off):.1e}; "
          f"{oracle.queries} queries, {time.perf_counter() - t0:.0f} s", flush=True)
    np.savez(f"{OUT}/values_{args.d}_{H}_{args.kv_heads}.npz", M=M, c=c, kernel=kernel, Q=Q, S=S, sv=sv)
    if not args.probes:
        return
    t0 = time.perf_counter()
    V, far = split_span(oracle, S, Q, M, rng, kernel=kernel, probes=args.probes)
    e = matched(V, truth.value_maps())
    print(f"split ({args.probes} probes): V_h off {' '.join(f'{x:.1e}' for x in e)}; probes far "
          f"{' '.join(f'{x:.0e}' for x in np.sort(far))}; {oracle.queries} queries, {time.perf_counter() - t0:.0f} s",
          flush=True)


def eigen_mixing(C, zeros, rng):
    """(Did not work: each block's L too noisy at bfloat16.) T from the pencil: c(n) = T w(n), w_h = 1/(1 + n/S_h),
    so n L c(n) = c(0) − c(n) with L = T diag(1/S) T⁻¹ per block; the blocks' L share T's columns as eigenvectors (a
    random combination's), scaled by T 1 = c(0)."""
    n = np.asarray(zeros, dtype=np.float64)
    Ls = []
    for c in C:
        Lt = np.linalg.lstsq(n[1:, None] * c[1:], c[0][None] - c[1:], rcond=None)[0]
        Ls.append(Lt.T / np.linalg.norm(Lt))
    E = np.real(np.linalg.eig(np.einsum("b,bij->ij", rng.standard_normal(len(Ls)), np.array(Ls)))[1])
    return E * np.linalg.lstsq(E, C[:, 0].mean(0), rcond=None)[0][None]


def stage_split(args, truth, oracle, rng):
    """Each group's mixing from the sweep in span coordinates (span_sweep.py), against the module's own mixing."""
    from scipy.linalg import block_diag

    from attnprobe.learners.positional.span_sweep import (QUERY_SCALE, ZEROS, fit_mixing, group_bases, shapes,
                                                          span_coordinates)
    d, H, G = args.d, args.heads, args.kv_heads
    z = np.load(f"{OUT}/values_{d}_{H}_{G}.npz")
    c, Q, S = z["c"], z["Q"], z["S"]
    t0 = time.perf_counter()
    Z = rng.standard_normal((args.queries, d)) * QUERY_SCALE
    C, off = span_coordinates(oracle, S, Q, c, Z)
    print(f"span sweep: {oracle.queries} queries, {time.perf_counter() - t0:.0f} s; rows off the span {off:.1e}")
    Tt = np.einsum("har,kar->kh", truth.value_maps() @ Q.T, S)
    if args.eigen:
        E = eigen_mixing(C, ZEROS, rng)
        cos = np.abs((E / np.linalg.norm(E, axis=0)).T @ (Tt / np.linalg.norm(Tt, axis=0))).max(0)
        print("the pencil's columns against the module's: cos " + " ".join(f"{x:.2f}" for x in np.sort(cos)))
    per = H // G if args.group_cut else H
    Gf = np.concatenate(group_bases(S, d // H, G, rng)).T if args.group_cut and G > 1 else np.eye(H)
    Cg = C @ np.linalg.inv(Gf).T
    fits = [fit_mixing(Cg[..., g * per:(g + 1) * per], per, rng, starts=args.starts, rounds=args.als)
            for g in range(H // per)]
    T = Gf @ block_diag(*[f[1] for f in fits])
    logS = np.concatenate([f[2] for f in fits], axis=1)
    misfit = np.linalg.norm(C - shapes(logS) @ T.T) / np.linalg.norm(C)
    V = np.einsum("kh,kar->har", T, S) @ Q
    Vt = np.einsum("kh,kar->har", Tt, S) @ Q
    print(f"mixing: misfit {misfit:.2e} (groups {' '.join(f'{f[0]:.2e}' for f in fits)}), "
          f"{time.perf_counter() - t0:.0f} s; V_h off {' '.join(f'{x:.1e}' for x in matched(V, truth.value_maps()))}; "
          f"the span's floor {' '.join(f'{x:.1e}' for x in matched(Vt, truth.value_maps()))}", flush=True)
    np.savez(f"{OUT}/split_{d}_{H}_{G}.npz", V=V, T=T, Z=Z, C=C, logS=logS)


def rotated(theta, offs, dh):
    """R(δ) for every sample: (n, dh, dh)."""
    from attnprobe.models.positional import rotation_matrix
    table = {o: rotation_matrix(float(o), theta, dh) for o in np.unique(offs)}
    return np.stack([table[o] for o in offs])


def stage_logits(args, truth, oracle, rng):
    """The route's logit stage (absolute_logits.py) on the saved value maps, its start measured."""
    from attnprobe.learners.positional.absolute_logits import absolute_logit_samples, fit_logit_maps
    from attnprobe.learners.positional.coarse import split_value_maps
    from attnprobe.models.compare import function_error_over_lengths
    from attnprobe.models.positional import rope_frequencies
    d, H, G = args.d, args.heads, args.kv_heads
    z = np.load(f"{OUT}/values_{d}_{H}_{G}.npz")
    M, c = z["M"], z["c"]
    V = truth.value_maps() if args.true_values else np.load(f"{OUT}/split_{d}_{H}_{G}.npz")["V"]
    Cb, Gh = split_value_maps(V, M)
    dh = d // H
    t0 = time.perf_counter()
    data = absolute_logit_samples(oracle, Cb, Gh, c, rng, sequences=args.sequences, tokens=args.tokens,
                                  length=args.length, lead=args.lead, scale=args.rho)
    ok = data["w"] > 0
    print(f"row logits: {args.sequences} sequences, {ok.sum()} samples of {len(ok)}; {time.perf_counter() - t0:.0f} s",
          flush=True)
    theta = rope_frequencies(dh, 1e4)
    if args.true_values:  # the logits' own error against the float64 module's (heads in the truth's order)
        g = H // G
        for h in range(H):
            i = np.flatnonzero((data["head"] == h) & ok)
            qq = data["tokens"][data["qid"][i]] @ truth.Wq[h].T
            kk = np.einsum("nab,nb->na", rotated(np.asarray(truth.inv_freq), data["off"][i], dh),
                           data["tokens"][data["kid"][i]] @ truth.Wk[h // g].T)
            true = truth.scale * np.einsum("na,na->n", qq, kk)
            err = np.abs(data["ell"][i] - true)
            wi = data["w"][i]
            print("   by weight:", " ".join(f"[{lo:.2f},{hi:.2f}): {np.median(err[(wi >= lo) & (wi < hi)]):.1e}"
                                          for lo, hi in ((0, 0.1), (0.1, 0.3), (0.3, 1), (1, 1.1))))
            if args.exact_logits:
                data["ell"][i] = true
            print(f"  head {h}: logits' error median {np.median(err):.1e}, 90% {np.quantile(err, 0.9):.1e}; "
                  f"logits' median size {np.median(np.abs(true)):.1e}", flush=True)
    t0 = time.perf_counter()
    Wq, Wk, _ = fit_logit_maps(data, H, G, theta, rng, rounds=args.als, log=print)
    model = grouped_start(Wq, Wk, Gh, Cb, c, theta)
    errs = [function_error_over_lengths(model, truth, np.random.default_rng(5), (n,)) for n in (2, 17, 64, 256)]
    print(f"logit maps: {time.perf_counter() - t0:.0f} s; start error at N = 2/17/64/256: "
          + " / ".join(f"{e:.1e}" for e in errs), flush=True)
    np.savez(f"{OUT}/start_{d}_{H}_{G}.npz", Wq=Wq, Wk=Wk, Gh=Gh, Cb=Cb, c=c, theta=theta)


def grouped_start(Wq, Wk, Gh, Cb, c, theta):
    """The start with one value map per key/value group (the route's ``bfloat16_rows.grouped_start``)."""
    from attnprobe.learners.positional.bfloat16_rows import grouped_start as start
    return start(Wq, Wk, Cb, Gh, c, theta)


def stage_polish(args, truth, oracle, rng):
    from attnprobe.learners.positional.row_polish import fresh_rows, polish_rows
    from attnprobe.models.compare import function_error_over_lengths
    d, H, G = args.d, args.heads, args.kv_heads
    z = np.load(f"{OUT}/start_{d}_{H}_{G}.npz")
    Wq, Wk = z["Wq"], z["Wk"]
    if args.random_logits:  # no logit stage: the polish from random query and key maps of the logits' size
        Wq = rng.standard_normal(Wq.shape) * np.linalg.norm(Wq) / math.sqrt(Wq.size)
        Wk = rng.standard_normal(Wk.shape) * np.linalg.norm(Wk) / math.sqrt(Wk.size)
    model = grouped_start(Wq, Wk, z["Gh"], z["Cb"], z["c"], z["theta"])
    if args.resume:  # from the last polish stage saved
        from dataclasses import replace
        p = np.load(f"{OUT}/polished_{d}_{H}_{G}.npz")
        model = replace(model, **{n: p[n] for n in p.files})
    lengths = (1, 2, 3, 5, 17, 64, 100, 200, 256)
    print(f"start: {function_error_over_lengths(model, truth, np.random.default_rng(5), lengths):.2e}", flush=True)
    t0 = time.perf_counter()
    data = fresh_rows(oracle, args.polish_sequences, rng)
    print(f"{args.polish_sequences} sequences × 256 rows, {time.perf_counter() - t0:.0f} s", flush=True)
    for stage in range(args.polish_stages):
        import attnprobe.learners.positional.row_polish as rp
        from attnprobe.learners.positional.polish import fitted_names
        rp.fitted_names = ((lambda m, f: ("Wq", "Wk") if f is False else fitted_names(m, f))
                            if stage < args.logits_first else fitted_names)
        model, rep = polish_rows(model, data, rounds=args.polish_rounds, compute=args.compute, cg_steps=args.cg_steps,
                                 frequencies=args.frequencies, log=print, dense=False, relative=args.relative)
        err = function_error_over_lengths(model, truth, np.random.default_rng(5), lengths)
        print(f"polish {stage + 1}: misfit {rep.misfit_before:.2e} -> {rep.misfit_after:.2e}, function error "
              f"{err:.2e}, {time.perf_counter() - t0:.0f} s", flush=True)
        np.savez(f"{OUT}/polished_{d}_{H}_{G}.npz", **{n: np.asarray(getattr(model, n)) for n in
                 ("Wq", "Wk", "Wv", "Wo", "bo", "inv_freq")})


def stage_lastpos(args, truth, oracle, rng):
    """(Did not help.) The last-position polish (polish.py, ``fresh_answers``) from the row-polished state: per-length
    errors (16 sequences a length) and over every length 1 … 256 after each round."""
    from dataclasses import replace

    from attnprobe.learners.positional.polish import fresh_answers, polish
    from attnprobe.models.compare import function_error_over_lengths
    from attnprobe.oracles.torch_adapter import oracle_from_torch
    d, H, G = args.d, args.heads, args.kv_heads
    z = np.load(f"{OUT}/start_{d}_{H}_{G}.npz")
    p = np.load(f"{OUT}/polished_{d}_{H}_{G}.npz")
    model = replace(grouped_start(z["Wq"], z["Wk"], z["Gh"], z["Cb"], z["c"], z["theta"]), **{n: p[n] for n in p.files})
    last = oracle_from_torch(oracle.fn.victim, d, precision="bfloat16")
    lengths = (1, 17, 64, 128, 160, 192, 224, 256)

    def report(m, tag):
        per = [function_error_over_lengths(m, truth, np.random.default_rng(5), (n,), per_length=16) for n in lengths]
        every = function_error_over_lengths(m, truth, np.random.default_rng(7), tuple(range(1, 257)))
        print(tag, " ".join(f"{n}:{e:.1e}" for n, e in zip(lengths, per)), f"every length {every:.2e}", flush=True)
    report(model, "start:")
    t0 = time.perf_counter()
    data = fresh_answers(last, args.last_sequences, np.random.default_rng(11))
    for r in range(args.polish_rounds):
        model, rep = polish(model, data, frequencies=args.frequencies, rounds=1, relative=args.relative)
        report(model, f"round {r + 1}: misfit {rep.misfit_before:.2e} -> {rep.misfit_after:.2e}, "
                      f"{time.perf_counter() - t0:.0f} s; function error")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=("values", "split", "logits", "polish", "lastpos"))
    ap.add_argument("--last-sequences", type=int, default=2000, help="lastpos: fresh last-position sequences")
    ap.add_argument("--relative", action="store_true",
                    help="polish/lastpos: residuals relative to each length's spread")
    ap.add_argument("--sequences", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--length", type=int, default=288)
    ap.add_argument("--lead", type=int, default=32)
    ap.add_argument("--rho", type=float, default=1.0)
    ap.add_argument("--true-values", action="store_true")
    ap.add_argument("--exact-logits", action="store_true")
    ap.add_argument("--polish-sequences", type=int, default=32)
    ap.add_argument("--polish-rounds", type=int, default=6)
    ap.add_argument("--polish-stages", type=int, default=2)
    ap.add_argument("--compute", default="float32")
    ap.add_argument("--frequencies", action="store_true")
    ap.add_argument("--random-logits", action="store_true")
    ap.add_argument("--resume", action="store_true", help="from the last polish stage saved")
    ap.add_argument("--cg-steps", type=int, default=60)
    ap.add_argument("--logits-first", type=int, default=0, help="polish stages fitting W_Q and W_K only")
    ap.add_argument("--queries", type=int, default=8)
    ap.add_argument("--query-scale", type=float, default=2.0)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--eigen", action="store_true", help="also the pencil's start (did not work)")
    ap.add_argument("--no-group-cut", dest="group_cut", action="store_false", help="one H × H mixing (did not work)")
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--als", type=int, default=40)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=16)
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--key-scale", type=float, default=1.0)
    ap.add_argument("--probes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    truth, oracle = setup(args)
    rng = np.random.default_rng(args.seed)
    stages = {"values": stage_values, "split": stage_split, "logits": stage_logits, "polish": stage_polish,
              "lastpos": stage_lastpos}
    stages[args.stage](args, truth, oracle, rng)


if __name__ == "__main__":
    main()
