"""Every RoPE head's query row space and every group's key row space from anchor sequences (docs/positional.md,
"The logit start at LLaMA-3-8B's head shape: row spaces, then linear").

A sequence ``[a_1 … a_m, z_1 … z_n]`` holds ``m`` *anchor* tokens, the same in every sequence, and ``n`` random
block-sparse *probe* tokens. Each row's weights are solved in the heads' coordinates
(:func:`~.row_logits.attention_from_rows`), and probe ``p``'s logit against anchor ``j`` minus its logit against
``a_1`` (no row constant) reads

    ``ℓ = z_pᵀ T_h c_h,p,j``,   ``T_h = W_Q,hᵀ`` (d × d_h),   ``c_h,p,j = R(j − p) W_K,g a_j − R(1 − p) W_K,g a_1``,

with ``c`` the same in every sequence: the matrix of a slot's logits over sequences and anchors is ``Z_p T_h C_p``,
every slot's columns in one ``d_h``-dimensional subspace, the row space of ``W_Q,h`` (``side="query"``). With the
anchors last (``[a_0, z_1 … z_n, a_1 … a_l]``) anchor ``r``'s row against probe ``p`` minus against ``a_0`` reads
``z_pᵀ W_K,gᵀ R(p − r)ᵀ W_Q,h a_r`` plus a constant, for every head of the group: the row space of ``W_K,g``
(``side="key"``). The ``c`` are free (no rotation tied to them: the only gauge is ``T → T S``, ``C → S⁻¹C``, which
keeps the span), so this is low-rank column-wise sensing (:func:`column_subspace`, alternating least squares):
``S·n·m`` logits for ``d·d_h + n·d_h·m`` unknowns, far fewer than the ``d`` sequences a per-vector regression needs.
The anchors must span the slowly turning pairs (over ``n`` offsets they barely rotate: ``c`` restricted to them is
about ``W_K a_j``), so ``m`` is near ``d_h`` on the query side (two families of 80 at ``d_h = 128``: each family
its own anchors and ``c``); on the key side the group's heads multiply the columns. Measured: docs.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.learners.core.conjugate_gradients import conjugate_gradients
from attnprobe.learners.positional.row_logits import BlockTokens, attention_from_rows

#: probe slots per sequence (the research driver's anchors: 80 a family, two families on the query side)
SLOTS = 20
#: alternating rounds and conjugate-gradient steps of the subspace's half-step (d = 256 float32 rows: the misfit
#: at its floor after ~15 rounds from a random start)
ROUNDS, CG_STEPS = 20, 30
#: sequences asked at once
BATCH = 32


def anchor_logits(oracle, Cb: np.ndarray, G: np.ndarray, c, anchors: np.ndarray, probes: BlockTokens,
                  sequences: int, *, side: str, batch: int = BATCH):
    """Logits ``(S, n, H, m')`` of every head between the probes (slot ``p`` of sequence ``s`` is token ``s·n + p``
    of ``probes``) and the anchors, each relative to a fixed token's (no row constant, no zero token):
    ``side="query"``, ``[a_1 … a_m, z_1 … z_n]``, probe rows against anchors ``2 … m`` minus against ``a_1``
    (``m' = m − 1``; exactly ``z_pᵀ T (c_p,j − c_p,1)``); ``side="key"``, ``[a_0, z_1 … z_n, a_1 … a_m]``, anchor
    rows ``1 … m`` against the probes minus against ``a_0`` (``m' = m``; ``z_pᵀ T c_p,r`` minus a constant per
    anchor and head: :func:`column_subspace`'s intercepts). Non-positive weights give NaN."""
    H, dh, d = G.shape
    m = len(anchors)
    n = len(probes.block) // sequences
    if m + n > dh:
        raise ConfigError(f"a sequence's weights are solved in a head's {dh} coordinates: at most {dh} anchors and "
                          f"probes; got {m} + {n}", param="anchors")
    out = np.empty((sequences, n, H, m - 1))
    anchor_vals = np.einsum("hkd,md->mhk", G, anchors)
    for at in range(0, sequences, batch):
        sl = slice(at * n, min(sequences, at + batch) * n)
        Z = probes.dense(sl).reshape(-1, n, d)
        B = len(Z)
        zv = probes.project(G.reshape(H * dh, d), sl).reshape(B, n, H, dh)
        A = np.broadcast_to(anchors, (B, m, d))
        av = np.broadcast_to(anchor_vals, (B, m, H, dh))
        if side == "query":
            X, vals = np.concatenate([A, Z], axis=1), np.concatenate([av, zv], axis=1)
        else:
            X = np.concatenate([A[:, :1], Z, A[:, 1:]], axis=1)
            vals = np.concatenate([av[:, :1], zv, av[:, 1:]], axis=1)
        Y = np.asarray(oracle.answer_rows(X), dtype=np.float64)
        a = attention_from_rows(Y, vals, Cb, G, c)  # (B, H, N, N)
        with np.errstate(divide="ignore", invalid="ignore"):
            ell = np.log(a / a[..., :1])
        ell[~((a > 0) & (a[..., :1] > 0))] = np.nan
        if side == "query":
            out[at:at + B] = ell[:, :, m:, 1:m].transpose(0, 2, 1, 3)
        else:
            out[at:at + B] = ell[:, :, n + 1:, 1:n + 1].transpose(0, 3, 1, 2)
    return out


def joined(parts: list) -> BlockTokens:
    """The probes of several anchor families as one :class:`BlockTokens` (their tokens in order)."""
    return BlockTokens(np.concatenate([t.block for t in parts]), np.concatenate([t.vals for t in parts]), parts[0].d)


def column_subspace(probes: BlockTokens, Ys: list, k: int, rng: np.random.Generator, *, intercept: bool = False,
                    spectral: bool = True, rounds: int = ROUNDS, cg_steps: int = CG_STEPS, log=None):
    """An orthonormal basis ``(k, d)`` of the ``k``-dimensional ``T`` in ``Y[s, p, col] ≈ z_s,pᵀ T c_p,col`` over
    every family's ``Y (S_f, n, cols_f)`` in ``Ys`` (NaN = missing; the probes of the families in order, slot ``p``
    of a family's sequence ``s`` its token ``s·n + p``; each family its own ``c``; ``intercept``: plus ``b_p,col``):
    alternating least squares from ``T``'s spectral estimate (``spectral``; else a random ``T``), the ``c`` by one
    least squares per family and slot, ``T`` by conjugate gradients on its normal equations preconditioned by
    ``(XᵀX)⁻¹ ⊗ (mean c cᵀ)⁻¹``.
    ``log(round, misfit)``: the relative misfit."""
    d = probes.d
    ok = [~np.isnan(Y) for Y in Ys]
    Y0 = [np.where(o, Y, 0.0) for o, Y in zip(ok, Ys)]
    w = [o.astype(float) for o in ok]
    at = np.cumsum([0] + [Y.shape[0] * Y.shape[1] for Y in Ys])
    norm = float(np.sqrt(sum((Y**2).sum() for Y in Y0))) or 1.0
    T = _spectral_start(probes, Y0, k) if spectral else np.linalg.qr(rng.standard_normal((d, k)))[0]

    def split(P):
        return [P[at[f]:at[f + 1]].reshape(Y.shape[0], Y.shape[1], -1) for f, Y in enumerate(Ys)]

    for rnd in range(rounds):
        Cs, Yc = [], []
        for P, Y, wf, o in zip(split(probes.project(T.T)), Y0, w, ok):
            n = Y.shape[1]
            ones = [np.ones((len(P), 1))] if intercept else []
            Cb = np.stack([_weighted_lstsq(np.concatenate([P[:, p], *ones], axis=1), Y[:, p], wf[:, p])
                           for p in range(n)])  # (n, k [+ 1], cols)
            Cs.append(Cb[:, :k])
            Yc.append(np.where(o, Y - Cb[:, k][None], 0.0) if intercept else Y)
        Cbar_inv = np.linalg.pinv(sum(np.einsum("pkc,plc->kl", C, C) for C in Cs) / sum(len(C) for C in Cs),
                                  hermitian=True)

        def back(Rs, Cs=Cs):
            return probes.adjoint(np.concatenate([_slots(R, np.swapaxes(C, 1, 2)).reshape(-1, k)
                                                  for R, C in zip(Rs, Cs)]))

        def forward(Tt, Cs=Cs):
            return [_slots(P, C) for P, C in zip(split(probes.project(Tt)), Cs)]

        def normal(Tt):
            return back([wf * R for wf, R in zip(w, forward(Tt))])

        Tt = conjugate_gradients(normal, back(Yc), cg_steps, x=T.T,
                                 precondition=lambda G, Ci=Cbar_inv: probes.gram_solve(Ci @ G), rtol=1e-12)
        T = np.linalg.qr(Tt.T)[0]
        if log is not None:
            res = sum(float((wf * (R - Y) ** 2).sum()) for wf, R, Y in zip(w, forward(Tt), Yc))
            log(rnd, np.sqrt(res) / norm)
    return T.T


def _spectral_start(probes: BlockTokens, Ys: list, k: int) -> np.ndarray:
    """The top ``k`` left singular vectors of ``[(XᵀX)⁻¹ Z_pᵀ Y_p]`` over every family and slot (``E[z zᵀ] ∝ I``:
    each block is ``T C_p`` plus noise), a ``(d, k)`` orthonormal start."""
    parts, at = [], 0
    for Y in Ys:
        S, n, _ = Y.shape
        for p in range(n):
            idx = at + np.arange(S) * n + p
            parts.append(BlockTokens(probes.block[idx], probes.vals[idx], probes.d).adjoint(Y[:, p]))
        at += S * n
    F = probes.gram_solve(np.concatenate(parts))  # (Σ n·cols, d)
    return np.linalg.svd(F.T, full_matrices=False)[0][:, :k]


def _slots(P: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``P[s, p] @ C[p]`` for every sequence and slot (one batched product per slot)."""
    return np.swapaxes(np.swapaxes(P, 0, 1) @ C, 0, 1)


def _weighted_lstsq(A: np.ndarray, Y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each column ``c`` of ``argmin Σ_s w[s, c] (A[s] x_c − Y[s, c])²``; one solve when no weight is missing."""
    if w.all():
        return np.linalg.lstsq(A, Y, rcond=None)[0]
    AtA = np.einsum("sk,sl,sc->ckl", A, A, w)
    Aty = np.einsum("sk,sc->ck", A, w * Y)
    return np.linalg.solve(AtA + 1e-12 * np.eye(A.shape[1]), Aty[..., None])[..., 0].T
