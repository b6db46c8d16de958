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


def row_logits(oracle, Cb, Gh, c, rng, sequences, tokens, length, lead, rho):
    """Absolute logits from every-position rows: ``tokens`` random tokens at random positions in
    ``[lead, length)``, zeros elsewhere (logit 0, no value). At a token's row, each head's output component
    ``u_h = Σ_s α_s G_h x_s`` (over the tokens so far; ``tokens ≤ d_h``) gives the weights α by least squares, the
    zeros' weight 1/Z = (1 − Σα)/zeros, so ``ℓ_s = log(α_s Z)`` — the logit itself, the zero key's being 0.
    Returns per head arrays of (query token, key token, offset, logit, weight)."""
    H, dh, d = Gh.shape
    pos = np.sort(np.stack([rng.choice(np.arange(lead, length), tokens, replace=False) for _ in range(sequences)]), 1)
    import ml_dtypes
    T = (rng.standard_normal((sequences, tokens, d)) * rho).astype(ml_dtypes.bfloat16).astype(np.float64)
    X = np.zeros((sequences, length, d))
    np.put_along_axis(X, pos[:, :, None], T, axis=1)
    Y = np.concatenate([np.asarray(oracle.answer_rows(X[a:a + 16]), dtype=np.float64)
                        for a in range(0, sequences, 16)])
    Yt = np.take_along_axis(Y, pos[:, :, None], axis=1) - c  # (S, tokens, K)
    U = Yt @ np.linalg.pinv(Cb).T  # (S, tokens, H·dh)
    U = U.reshape(sequences, tokens, H, dh)
    Vx = np.einsum("hed,std->shte", Gh, T)  # (S, H, tokens, dh): each token's value in each head's coordinates
    out = {k: [] for k in ("q", "k", "off", "ell", "w", "head")}
    for t in range(tokens):
        A = Vx[:, :, :t + 1].transpose(0, 1, 3, 2)  # (S, H, dh, t+1)
        alpha = np.linalg.solve(np.einsum("shei,shej->shij", A, A) + 1e-12 * np.eye(t + 1),
                                np.einsum("shei,she->shi", A, U[:, t])[..., None])[..., 0]  # (S, H, t+1)
        zeros = (pos[:, t] + 1 - (t + 1)).astype(float)  # (S,)
        invZ = (1 - alpha.sum(-1)) / zeros[:, None]  # (S, H)
        ratio = alpha / invZ[..., None]
        ok = (ratio > 0) & (invZ[..., None] > 0)
        ell = np.log(np.where(ok, ratio, 1.0))
        w = np.where(ok, np.minimum(1.0, ratio) ** 2, 0.0)  # the logit's error ∝ 1/ratio
        for h in range(H):
            out["q"].append(np.repeat(T[:, t], t + 1, axis=0))
            out["k"].append(T[:, :t + 1].reshape(-1, d))
            out["off"].append((pos[:, :t + 1] - pos[:, t:t + 1]).reshape(-1))
            out["ell"].append(ell[:, h].reshape(-1))
            out["w"].append(w[:, h].reshape(-1))
            out["head"].append(np.full(sequences * (t + 1), h))
    return {k: np.concatenate(v) for k, v in out.items()}


def rotated(theta, offs, dh):
    """R(δ) for every sample: (n, dh, dh)."""
    from attnprobe.models.positional import rotation_matrix
    table = {o: rotation_matrix(float(o), theta, dh) for o in np.unique(offs)}
    return np.stack([table[o] for o in offs])


def fit_logit_maps(data, H, G, dh, theta, rng, rounds=10, log=print, truth=None):
    """Alternating least squares on ``ℓ = (W_Q,h x_q)ᵀ R(δ) (W_K,g x_k)``: each head's W_Q given its group's W_K,
    each group's W_K given its heads' W_Q (pooled), weighted; each round extrapolated along its step (line search
    over the step's multiple, as for CP decompositions)."""
    d = data["q"].shape[1]
    g = H // G
    heads = [np.flatnonzero(data["head"] == h) for h in range(H)]
    Rs = [rotated(theta, data["off"][i], dh) for i in heads]
    sw = [np.sqrt(data["w"][i]) for i in heads]
    tot = sum(float((data["ell"][i] ** 2 * data["w"][i]).sum()) for i in heads)

    def keys(Wk, h):
        return np.einsum("nab,nb->na", Rs[h], data["k"][heads[h]] @ Wk[h // g].T)

    def misfit(Wq, Wk):
        res = 0.0
        for h in range(H):
            i = heads[h]
            pred = np.einsum("na,na->n", data["q"][i] @ Wq[h].T, keys(Wk, h))
            res += float((((pred - data["ell"][i]) * sw[h]) ** 2).sum())
        return math.sqrt(res / tot)

    def solve_q(Wk):
        Wq = np.zeros((H, dh, d))
        for h in range(H):
            i = heads[h]
            D = (data["q"][i][:, :, None] * keys(Wk, h)[:, None, :]).reshape(len(i), -1) * sw[h][:, None]
            Wq[h] = np.linalg.solve(D.T @ D + 1e-9 * np.eye(D.shape[1]), D.T @ (data["ell"][i] * sw[h])
                                    ).reshape(d, dh).T
        return Wq

    def solve_k(Wq):
        Wk = np.zeros((G, dh, d))
        for grp in range(G):
            A, b = 0.0, 0.0
            for h in range(grp * g, (grp + 1) * g):
                i = heads[h]
                qq = np.einsum("nab,na->nb", Rs[h], data["q"][i] @ Wq[h].T)
                D = (data["k"][i][:, :, None] * qq[:, None, :]).reshape(len(i), -1) * sw[h][:, None]
                A, b = A + D.T @ D, b + D.T @ (data["ell"][i] * sw[h])
            Wk[grp] = np.linalg.solve(A + 1e-9 * np.eye(len(b)), b).reshape(d, dh).T
        return Wk

    Wk = rng.standard_normal((G, dh, d)) / math.sqrt(d)
    Wq = solve_q(Wk)
    f = misfit(Wq, Wk)
    for r in range(rounds):
        Wk1 = solve_k(Wq)
        Wq1 = solve_q(Wk1)
        f1 = misfit(Wq1, Wk1)
        best = (f1, Wq1, Wk1)
        for beta in (0.5, 1.0, 2.0):  # extrapolate: old + (1 + β)·step
            Wqe, Wke = Wq1 + beta * (Wq1 - Wq), Wk1 + beta * (Wk1 - Wk)
            fe = misfit(Wqe, Wke)
            if fe < best[0]:
                best = (fe, Wqe, Wke)
        f, Wq, Wk = best
        log(f"  ALS round {r + 1}: misfit {f:.3e}")
    return Wq, Wk


def stage_logits(args, truth, oracle, rng):
    from attnprobe.learners.positional.coarse import split_value_maps
    from attnprobe.models.compare import function_error_over_lengths
    from attnprobe.models.positional import PositionalAttention, rope_frequencies
    d, H, G = args.d, args.heads, args.kv_heads
    z = np.load(f"{OUT}/values_{d}_{H}_{G}.npz")
    M, c = z["M"], z["c"]
    V = truth.value_maps() if args.true_values else np.load(f"{OUT}/split_{d}_{H}_{G}.npz")["V"]
    Cb, Gh = split_value_maps(V, M)
    dh = d // H
    t0 = time.perf_counter()
    data = row_logits(oracle, Cb, Gh, c, rng, args.sequences, args.tokens, args.length, args.lead, args.rho)
    ok = data["w"] > 0
    print(f"row logits: {args.sequences} sequences, {ok.sum()} samples of {len(ok)}; {time.perf_counter() - t0:.0f} s",
          flush=True)
    theta = rope_frequencies(dh, 1e4)
    if args.true_values:  # the logits' own error against the float64 module's (heads in the truth's order)
        g = H // G
        for h in range(H):
            i = np.flatnonzero((data["head"] == h) & ok)
            qq = data["q"][i] @ truth.Wq[h].T
            kk = np.einsum("nab,nb->na", rotated(np.asarray(truth.inv_freq), data["off"][i], dh),
                           data["k"][i] @ truth.Wk[h // g].T)
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
    Wq, Wk = fit_logit_maps(data, H, G, dh, theta, rng, rounds=args.als)
    model = grouped_start(Wq, Wk, Gh, Cb, c, theta)
    errs = [function_error_over_lengths(model, truth, np.random.default_rng(5), (n,)) for n in (2, 17, 64, 256)]
    print(f"logit maps: {time.perf_counter() - t0:.0f} s; start error at N = 2/17/64/256: "
          + " / ".join(f"{e:.1e}" for e in errs), flush=True)
    np.savez(f"{OUT}/start_{d}_{H}_{G}.npz", Wq=Wq, Wk=Wk, Gh=Gh, Cb=Cb, c=c, theta=theta)


def grouped_start(Wq, Wk, Gh, Cb, c, theta):
    """The start with one value map per key/value group: ``W_V,g`` the group's first head's, each head's
    ``W_O,h ← C_h G_h W_V,g⁺`` (docs/positional.md, "GQA in the result")."""
    from attnprobe.models.positional import PositionalAttention
    H, dh, d = Gh.shape
    G = Wk.shape[0]
    g = H // G
    Wv = Gh[::g]
    Wo = np.concatenate([Cb[:, h * dh:(h + 1) * dh] @ Gh[h] @ np.linalg.pinv(Wv[h // g]) for h in range(H)], axis=1)
    return PositionalAttention(Wq, Wk, Wv, Wo, bo=c, position="rope", inv_freq=theta, layout="half", scale=1.0,
                               causal=True)


def stage_polish(args, truth, oracle, rng):
    from attnprobe.learners.positional.row_polish import fresh_rows, polish_rows
    from attnprobe.models.compare import function_error_over_lengths
    from attnprobe.models.positional import PositionalAttention
    d, H, G = args.d, args.heads, args.kv_heads
    z = np.load(f"{OUT}/start_{d}_{H}_{G}.npz")
    Wq, Wk = z["Wq"], z["Wk"]
    if args.random_logits:  # no logit stage: the polish from random query and key maps of the logits' size
        Wq = rng.standard_normal(Wq.shape) * np.linalg.norm(Wq) / math.sqrt(Wq.size)
        Wk = rng.standard_normal(Wk.shape) * np.linalg.norm(Wk) / math.sqrt(Wk.size)
    model = grouped_start(Wq, Wk, z["Gh"], z["Cb"], z["c"], z["theta"])
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
        model, rep = polish_rows(model, data, rounds=args.polish_rounds, compute=args.compute,
                                 frequencies=args.frequencies, log=print, dense=False)
        err = function_error_over_lengths(model, truth, np.random.default_rng(5), lengths)
        print(f"polish {stage + 1}: misfit {rep.misfit_before:.2e} -> {rep.misfit_after:.2e}, function error {err:.2e}, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        np.savez(f"{OUT}/polished_{d}_{H}_{G}.npz", **{n: np.asarray(getattr(model, n)) for n in
                 ("Wq", "Wk", "Wv", "Wo", "bo", "inv_freq")})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=("values", "split", "logits", "polish"))
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
    ap.add_argument("--logits-first", type=int, default=0, help="polish stages fitting W_Q and W_K only")
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
    {"values": stage_values, "split": stage_split, "logits": stage_logits, "polish": stage_polish}[args.stage](args, truth, oracle, rng)


if __name__ == "__main__":
    main()
