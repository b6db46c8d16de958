"""Research: the post-norm neurons stage through probes (``post_norm_probe_neurons.probe_neurons``'s calls) on
MiniLM layer 2 from its answers alone, in stages that save under a folder and resume (each run ≤ 20 min under the
heavy wrapper; docs/block.md, "Through probes, as library pieces").

    PYTHONPATH=src python benchmarks/research/post_norm_minilm_chain.py STAGE [--dir=/tmp/minilm/chain]
        [--seconds=T] [--layer=2]

STAGE: ``prep`` (stages 1–3: n2, the single token's n1 input), ``span`` (the probe points and the span by
Gauss–Newton), ``factors`` (the deflated pencil, resumed from the factors saved, stopped after T seconds),
``directions`` (the factors' completeness check, then the directions past the probes, resumed block by block),
``curves`` (each neuron's GELU curve), ``truth`` (every neuron against the layer's ``intermediate.dense``). Each
prints its time, queries and errors against the truth.
"""
import sys
import time
from pathlib import Path

import numpy as np

from attnprobe.learners.block.post_norm import FirstNormInput, first_norm_centre, first_norm_input, output_norm
from attnprobe.learners.block.post_norm_factors import factors_complete, probe_factors
from attnprobe.learners.block.post_norm_probe_neurons import (STARTS_PER_FACTOR, direction_blocks, probe_curves,
                                                              probe_plan)
from attnprobe.learners.block.post_norm_probe_span import probe_points, probe_span
from attnprobe.oracles.hf_block import block_model, hf_block, oracle_from_hf_block
from attnprobe.targets.hf import minilm_dir

stage = sys.argv[1]
opt = dict(a[2:].split("=", 1) for a in sys.argv[2:] if a.startswith("--") and "=" in a)
out = Path(opt.get("dir", "/tmp/minilm/chain"))
out.mkdir(parents=True, exist_ok=True)
seconds = float(opt.get("seconds", 1e9))
layer = int(opt.get("layer", 2))
folder = str(minilm_dir())
t = block_model(hf_block(folder, layer))
oracle = oracle_from_hf_block(folder, layer)
rows, d, m = oracle.answer_rows, t.d, t.m
P = np.eye(d) - 1.0 / d
At, at = (t.ffn.W1 * t.norm1_w) @ P, t.ffn.W1 @ t.norm1_b + t.ffn.b1
t0 = time.time()


def load(name):
    return dict(np.load(out / f"{name}.npz"))


def affine_of(p):
    return FirstNormInput(p["K"], p["c"], float(p["misfit"]), int(p["queries"]))


def factor_truth(W, A, U):
    """Worst ``1 − |cos|`` of the found (α, w) against the true factors, and how many true ones were hit."""
    au = At @ U
    au /= np.linalg.norm(au, axis=1, keepdims=True)
    wt = P @ t.ffn.W2
    wt /= np.linalg.norm(wt, axis=0)
    ca, cw = np.abs(A @ au.T), np.abs(W @ wt)
    i = np.argmax(ca, axis=1)
    return float(np.max(1 - ca[np.arange(len(A)), i])), float(np.max(1 - cw[np.arange(len(A)), i])), \
        len(set(i.tolist()))


if stage == "prep":
    rng = np.random.default_rng([0, 11])
    n2 = output_norm(rows, d, rng)
    aff = first_norm_input(rows, first_norm_centre(rows, d, rng), rng)
    np.savez(out / "prep.npz", w2=n2[0], b2=n2[1], K=aff.K, c=aff.c, misfit=aff.misfit, queries=aff.queries,
             calls=oracle.queries if hasattr(oracle, "queries") else -1)
    print(f"prep: n2 and n1's input (misfit {aff.misfit:.1e}), {time.time() - t0:.0f} s")
elif stage == "span":
    p = load("prep")
    aff, n2 = affine_of(p), (p["w2"], p["b2"])
    rng = np.random.default_rng(3)
    C, n, per_block, total = probe_plan(d, m)
    U = np.linalg.qr(P @ rng.standard_normal((d, C)))[0]
    Z, Q, X = probe_points(rows, aff, n2, U, rng, n)
    t1 = time.time()
    B, res = probe_span(X, Q, C, m + 1)
    A1U = At @ U
    F = np.hstack([np.einsum("xi,ic->xci", P @ t.ffn.W2, A1U).reshape(d * C, m), ((P * t.norm1_w) @ U).reshape(-1, 1)])
    Ft = np.linalg.qr(F)[0]
    sines = np.linalg.svd(B - Ft @ (Ft.T @ B), compute_uv=False)
    np.savez(out / "span.npz", U=U, Z=Z, Q=Q, X=X, B=B, residuals=res, rng=np.array([0]))
    print(f"span: C = {C}, {n} points ({n * (2 * C + 1):,} single tokens, plan {total:,} in all), points "
          f"{t1 - t0:.0f} s, Gauss–Newton {time.time() - t1:.0f} s, residuals {['%.1e' % r for r in res]}, "
          f"largest sine to the true span {sines.max():.1e}")
elif stage == "factors":
    s = load("span")
    U, B = s["U"], s["B"]
    C = U.shape[1]
    f = out / "factors.npz"
    found = (load("factors")["W"], load("factors")["A"]) if f.exists() else None
    done = int(load("factors")["starts"]) if f.exists() else 0
    rng = np.random.default_rng([5, done])
    state = {"W": found[0] if found else np.zeros((0, d)), "A": found[1] if found else np.zeros((0, C)), "n": 0}

    class Stop(Exception):
        pass

    def log(starts, W, A):
        state.update(W=W, A=A, n=starts)
        np.savez(f, W=W, A=A, starts=done + starts)
        if starts % 128 == 0:
            print(f"  {done + starts} starts: {len(W)} factors, {time.time() - t0:.0f} s", flush=True)
        if time.time() - t0 > seconds:
            raise Stop

    try:
        probe_factors(B, d, C, m, rng, STARTS_PER_FACTOR * m - done, found=found, log=log)
    except Stop:
        pass
    W, A = state["W"], state["A"]
    ea, ew, hit = factor_truth(W, A, U)
    print(f"factors: {len(W)} of {m} after {done + state['n']} starts ({time.time() - t0:.0f} s this run); against "
          f"the truth worst 1 − |cos| {ea:.1e} (α), {ew:.1e} (w), {hit} distinct true neurons")
elif stage == "directions":
    s, fa, p = load("span"), load("factors"), load("prep")
    U, B, W, A = s["U"], s["B"], fa["W"], fa["A"]
    ok, det = factors_complete(B, W, A, U, tol=1e-6)
    print(f"complete: {ok} {det}", flush=True)
    f = out / "directions.npz"
    D = load("directions")["D"] if f.exists() else U @ A.T
    lo0 = int(load("directions")["next"]) if f.exists() else 0
    queries = int(load("directions")["queries"]) if f.exists() else 0
    ask = (rows, affine_of(p), (p["w2"], p["b2"]))
    for lo, Dn, q in direction_blocks(ask, U, (W, A), B, np.random.default_rng([7, lo0]), start=lo0, D=D):
        queries += q
        np.savez(f, D=Dn, next=lo, queries=queries)
        print(f"  block at {lo}: {time.time() - t0:.0f} s", flush=True)
        if time.time() - t0 > seconds:
            break
    print(f"directions: {queries:,} single tokens, {time.time() - t0:.0f} s this run")
elif stage == "curves":
    s, fa, di = load("span"), load("factors"), load("directions")
    A1, a1, misfit = probe_curves(s["B"], (s["Z"], s["Q"], s["X"]), s["U"], (fa["W"], fa["A"]), di["D"].T)
    np.savez(out / "neurons.npz", A=A1, a=a1, misfit=misfit)
    print(f"curves: misfit {misfit:.1e}, {time.time() - t0:.0f} s")
if stage == "report":
    s = load("span")
    U = s["U"]
    print(f"span: residuals {['%.1e' % r for r in s['residuals']]}")
    if (out / "factors.npz").exists():
        fa = load("factors")
        ea, ew, hit = factor_truth(fa["W"], fa["A"], U)
        print(f"factors: {len(fa['W'])} after {int(fa['starts'])} starts; worst 1 − |cos| {ea:.1e} (α), {ew:.1e} (w), "
              f"{hit} distinct true neurons; complete {factors_complete(s['B'], fa['W'], fa['A'], U, tol=1e-6)}")
    if (out / "directions.npz").exists():
        di = load("directions")
        Dm = di["D"].T
        true = At / np.linalg.norm(At @ U, axis=1, keepdims=True)
        i = np.argmax(np.abs(Dm @ true.T) / np.linalg.norm(true, axis=1), axis=1)
        sg = np.sign(np.sum(Dm * true[i], axis=1))
        e = np.linalg.norm(Dm - sg[:, None] * true[i], axis=1) / np.linalg.norm(true[i], axis=1)
        print(f"directions: up to {int(di['next']) + U.shape[1]} of {d - 1}, {int(di['queries']):,} single tokens; "
              f"relative error (full rows only meaningful when complete) median {np.median(e):.1e} worst {e.max():.1e}")
if stage in ("curves", "truth") or (stage == "report" and (out / "neurons.npz").exists()):
    nn = load("neurons")
    A1, a1 = nn["A"], nn["a"]
    i = np.argmin(np.linalg.norm(At[None] - A1[:, None], axis=2), axis=1)
    ea = np.linalg.norm(A1 - At[i], axis=1) / np.linalg.norm(At[i], axis=1)
    eb = np.abs(a1 - at[i])
    print(f"truth: {len(set(i.tolist()))} distinct of {m}; rows relative median {np.median(ea):.1e} worst "
          f"{ea.max():.1e}; biases median {np.median(eb):.1e} worst {eb.max():.1e}")
