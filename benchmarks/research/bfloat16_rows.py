"""Research: RoPE (LLaMA, GQA) from bfloat16 every-position answers, stage by stage, each measured against the
float64 module (docs/positional.md, "bfloat16 answers"). Stages save .npz under /tmp/bf16rows/ and resume.

    PYTHONPATH=src python benchmarks/research/bfloat16_rows.py values --d 128 --heads 8 --kv-heads 2
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from attnprobe.learners.positional import coarse
from attnprobe.learners.positional.value_span import split_span, value_span
from attnprobe.oracles.base import Oracle
from attnprobe.targets.positional_modules import positional_victim, reference_model

OUT = "/tmp/bf16rows"


class EveryRow:
    """A bfloat16 victim's every row (causal)."""

    positions = "causal"

    def __init__(self, victim):
        self.victim, self.dtype, self.__name__ = victim, "bfloat16", type(victim).__name__

    def __call__(self, X):
        return np.asarray(self.victim.every_position(X).float(), dtype=np.float64)


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
    S, sv = value_span(oracle, Q, kernel, H, rng, rows=args.rows)
    # every true V_h's distance from the span
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


def span_sweep_answers(oracle, Z, zeros, block):
    """Every row of ``[0 × n, z × block]``: (len(Z), len(zeros), block, K) — the rows inside the query block."""
    B, d = Z.shape
    out = []
    for n in zeros:
        X = np.zeros((B, n + block, d))
        X[:, n:] = Z[:, None]
        out.append(np.asarray(oracle.answer_rows(X), dtype=np.float64)[:, n:])
    return np.stack(out, axis=1)


def shapes(logS, zeros):
    """S/(n + S): logS (..., H) -> (..., len(zeros), H)."""
    S = np.exp(np.clip(logS, -15, 20))[..., None, :]
    n = np.asarray(zeros, dtype=np.float64)[:, None]
    return S / (n + S)


def fit_centres(C, T, logS, zeros, steps=8):
    """Gauss-Newton on every (query, block) at once: C (B, nz, H) coefficients, T (H, H) -> logS (B, H)."""
    for _ in range(steps):
        w = shapes(logS, zeros)  # (B, nz, H)
        r = C - w @ T.T  # (B, nz, H)
        dw = w * (1 - w)  # d w / d log S
        J = dw[:, :, None, :] * T[None, None]  # (B, nz, H_out, H_in)
        J = J.reshape(len(C), -1, T.shape[1])
        A = np.einsum("bni,bnj->bij", J, J) + 1e-6 * np.eye(T.shape[1])
        g = np.einsum("bni,bn->bi", J, r.reshape(len(C), -1))
        logS = np.clip(logS + np.linalg.solve(A, g[..., None])[..., 0], -15, 20)
    return logS


def grid_centres(C, T, zeros):
    """Each head's centre from w = T⁻¹c by a 1-D grid search (no coupling between heads)."""
    w = C @ np.linalg.inv(T).T  # (B, nz, H)
    grid = np.linspace(-6, 12, 181)
    sh = shapes(grid[:, None], zeros)[:, :, 0]  # (grid, nz)
    err = ((w[:, None, :, :] - sh[None, :, :, None]) ** 2).sum(2)  # (B, grid, H)
    return grid[np.argmin(err, axis=1)]


def eigen_mixing(C, zeros, rng):
    """T from the pencil: c(n) = T w(n), w_h = 1/(1 + n/S_h), so n L c(n) = c(0) − c(n) with L = T diag(1/S) T⁻¹ per
    block; the blocks' L share T's columns as eigenvectors (a random combination's eigenvectors), scaled by
    T 1 = c(0)."""
    n = np.asarray(zeros, dtype=np.float64)
    assert n[0] == 0
    Ls = []
    for c in C:
        X = n[1:, None] * c[1:]
        Lt = np.linalg.lstsq(X, c[0][None] - c[1:], rcond=None)[0]
        Ls.append(Lt.T / np.linalg.norm(Lt))
    Ls = np.array(Ls)
    g = rng.standard_normal(len(Ls))
    w, E = np.linalg.eig(np.einsum("b,bij->ij", g, Ls))
    E = np.real(E)
    s = np.linalg.lstsq(E, C[:, 0].mean(0), rcond=None)[0]
    return E * s[None]


def joint_lm(C, T, logS, zeros, steps=50, lam=1e-3):
    """Levenberg–Marquardt on T and every block's centres at once, the centres eliminated (Schur complement):
    r_b = c_b − W_b Tᵀ."""
    B, nz, H = C.shape
    def cost(T, logS):
        return float(((C - shapes(logS, zeros) @ T.T) ** 2).sum())
    f = cost(T, logS)
    for it in range(steps):
        w = shapes(logS, zeros)  # (B, nz, H)
        r = (C - w @ T.T).reshape(B, -1)  # (B, nz·H_k)
        dw = w * (1 - w)
        eye = np.eye(H)
        JT = (w[:, :, None, None, :] * eye[None, None, :, :, None]).reshape(B, nz * H, H * H)  # ∂(W Tᵀ)/∂T[k,h]
        Js = (dw[:, :, None, :] * T[None, None]).reshape(B, nz * H, H)  # ∂/∂s_h
        A = np.einsum("bni,bnj->ij", JT, JT)
        Bb = np.einsum("bni,bnj->bij", JT, Js)
        D = np.einsum("bni,bnj->bij", Js, Js)
        gT = np.einsum("bni,bn->i", JT, r)
        gs = np.einsum("bni,bn->bi", Js, r)
        while True:
            Dd = D + lam * (np.einsum("bii->bi", D)[:, :, None] * eye + 1e-12 * eye)
            Dinv = np.linalg.inv(Dd)
            S_ = A + lam * np.diag(np.diag(A)) - np.einsum("bij,bjk,blk->il", Bb, Dinv, Bb)
            rhs = gT - np.einsum("bij,bjk,bk->i", Bb, Dinv, gs)
            dT = np.linalg.solve(S_, rhs)
            ds = np.einsum("bij,bj->bi", Dinv, gs - np.einsum("bji,j->bi", Bb, dT))
            Tn, sn = T + dT.reshape(H, H), np.clip(logS + ds, -15, 20)
            fn = cost(Tn, sn)
            if fn < f:
                gain = 1 - fn / f
                T, logS, f, lam = Tn, sn, fn, lam / 3
                break
            lam *= 4
            if lam > 1e8:
                return T, logS
        if gain < 1e-7:
            break
    return T, logS


def fit_mixing(C, zeros, H, rng, starts=8, rounds=60):
    """T (H, H) and centres with C ≈ shapes(logS) Tᵀ: alternating, from random starts; the best misfit."""
    best = None
    B = len(C)
    for s in range(starts):
        T = rng.standard_normal((H, H))
        for k in range(rounds):
            logS = fit_centres(C, T, grid_centres(C, T, zeros), zeros, steps=3)
            W = shapes(logS, zeros).reshape(-1, H)
            T = np.linalg.lstsq(W, C.reshape(-1, H), rcond=None)[0].T
        T, logS = joint_lm(C, T, logS, zeros, steps=30)
        misfit = np.linalg.norm(C - shapes(logS, zeros) @ T.T) / np.linalg.norm(C)
        print(f"  start {s}: misfit {misfit:.2e}", flush=True)
        if best is None or misfit < best[0]:
            best = (misfit, T, logS)
    return best


def group_bases(S, dh, groups, rng, iters=60, tries=12):
    """Each key/value group's sub-span of the span ``S`` (H, K, r): the combinations of rank ``d_h`` (a group's
    heads share ``W_V,g``: any mix of them has its row space, rank ``d_h``; across groups the ranks add). Alternating:
    the combination's null space ``N`` (its ``r − d_h`` smallest right singular vectors), then the combinations that
    vanish on ``N`` (the smallest right singular vectors of ``[S_k N]``). Returns ``(groups, H/groups, H)``."""
    H = S.shape[0]
    per = H // groups
    found = []
    for _ in range(tries):
        a = rng.standard_normal(H)
        for _ in range(iters):
            N = np.linalg.svd(np.einsum("k,kar->ar", a, S))[2][dh:].T
            vt = np.linalg.svd(np.einsum("kar,rs->kas", S, N).reshape(H, -1).T, full_matrices=False)[2]
            a = vt[-1]
        sub = vt[-per:]
        if all(np.linalg.norm(sub @ f.T) < 0.5 * math.sqrt(per) for f in found):
            found.append(sub)
        if len(found) == groups:
            return np.array(found)
    raise RuntimeError(f"found {len(found)} of {groups} group sub-spans")


def stage_split(args, truth, oracle, rng):
    d, H = args.d, args.heads
    z = np.load(f"{OUT}/values_{args.d}_{H}_{args.kv_heads}.npz")
    M, c, Q, S = z["M"], z["c"], z["Q"], z["S"]
    from attnprobe.learners.positional.sweep import ZEROS
    zeros = ZEROS if args.zeros is None else tuple(int(x) for x in np.unique(np.round(np.geomspace(1, 512, args.zeros))))
    zeros = tuple(sorted(set((0,) + tuple(zeros))))
    t0 = time.perf_counter()
    Z = rng.standard_normal((args.queries, d)) * args.query_scale
    Y = span_sweep_answers(oracle, Z, zeros, args.block) - c  # (q, nz, m, K)
    U = np.einsum("hkr,qr->qkh", S, Z @ Q.T)  # (q, K, H): u_k = S_k Q z
    Cq = np.stack([np.linalg.lstsq(U[i], Y[i].reshape(-1, Y.shape[-1]).T, rcond=None)[0].T for i in range(len(Z))])
    resid = [np.linalg.norm(Y[i].reshape(-1, Y.shape[-1]) - Cq[i] @ U[i].T) / np.linalg.norm(Y[i]) for i in range(len(Z))]
    print(f"span sweep: {oracle.queries} queries, {time.perf_counter() - t0:.0f} s; answers off the span "
          f"{np.median(resid):.1e} (median)", flush=True)
    Cq = Cq.reshape(len(Z), len(zeros), args.block, H).transpose(0, 2, 1, 3).reshape(-1, len(zeros), H)
    Tt = np.einsum("har,kar->kh", truth.value_maps() @ Q.T, S)
    for trial in range(2):
        ls = fit_centres(Cq, Tt, grid_centres(Cq, Tt, zeros) if trial else np.zeros((len(Cq), H)), zeros, steps=30)
        print(f"  with the truth's mixing: misfit {np.linalg.norm(Cq - shapes(ls, zeros) @ Tt.T) / np.linalg.norm(Cq):.2e}")
    t0 = time.perf_counter()
    G = args.kv_heads
    if G > 1:
        subs = group_bases(S, d // H, G, rng)
        Gf = np.concatenate(subs).T  # (H, H): each group's basis in the span's coordinates
        Cg = Cq @ np.linalg.inv(Gf).T
        per = H // G
        blocks, logS, misfit = [], [], []
        for g in range(G):
            mis, Tg, ls = fit_mixing(Cg[..., g * per:(g + 1) * per], zeros, per, rng, starts=args.starts,
                                     rounds=args.als)
            blocks.append(Tg)
            logS.append(ls)
            misfit.append(mis)
        from scipy.linalg import block_diag
        T = Gf @ block_diag(*blocks)
        logS = np.concatenate(logS, axis=1)
        misfit = np.linalg.norm(Cq - shapes(logS, zeros) @ T.T) / np.linalg.norm(Cq)
    else:
        misfit, T, logS = fit_mixing(Cq, zeros, H, rng, starts=args.starts, rounds=args.als)
    parts = np.einsum("kh,kar->har", T, S)
    V = parts @ Q
    e = matched(V, truth.value_maps())
    # the truth's T for comparison: V_h Q^T in the basis S
    Tt = np.einsum("har,kar->kh", truth.value_maps() @ Q.T, S)
    Vt = np.einsum("kh,kar->har", Tt, S) @ Q
    print(f"mixing fit: misfit {misfit:.2e}, {time.perf_counter() - t0:.0f} s; V_h off "
          f"{' '.join(f'{x:.1e}' for x in e)}; the span's own floor {' '.join(f'{x:.1e}' for x in matched(Vt, truth.value_maps()))}",
          flush=True)
    np.savez(f"{OUT}/split_{args.d}_{H}_{args.kv_heads}.npz", V=V, T=T, Z=Z, C=Cq, logS=logS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=("values", "split"))
    ap.add_argument("--queries", type=int, default=8)
    ap.add_argument("--query-scale", type=float, default=2.0)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--zeros", type=int)
    ap.add_argument("--starts", type=int, default=4)
    ap.add_argument("--als", type=int, default=60)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=16)
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--probes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    truth, oracle = setup(args)
    rng = np.random.default_rng(args.seed)
    {"values": stage_values, "split": stage_split}[args.stage](args, truth, oracle, rng)


if __name__ == "__main__":
    main()
