"""Attention logits of every head at once, once the value maps ``V_h`` are known (docs/multihead-vector.md).

A query ``X = [b + p_1; …; b + p_m; b]`` answers ``f(X) = M b + c + Σ_h Σ_i α_{h,i} V_h p_i``: K numbers and
``H·m`` unknown attention weights, read by one least-squares solve with the K × Hm matrix ``[V_h p_i]``
(well-conditioned for m ≪ K/H). Then ``log(α_{h,i}/α_{h,N}) = p_iᵀ(W_h b + u_h)`` (eq. 1 of the paper, one
bilinear measurement per head and token), so ``m`` tokens per query measure ``H·m`` entries of ``W_h b + u_h``.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from attnprobe.errors import RecoveryError


def token_queries(B: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Queries ``[b + p_1; …; b + p_m; b]`` for every row ``b`` of ``B`` (n, d) and offsets ``P`` (m, d)."""
    X = np.empty((B.shape[0], P.shape[0] + 1, B.shape[1]))
    X[:, :-1, :] = B[:, None, :] + P[None]
    X[:, -1, :] = B
    return X


def read_logits(R: np.ndarray, V: np.ndarray, P: np.ndarray) -> tuple[np.ndarray, float]:
    """Logits ``p_iᵀ(W_h b + u_h)`` (n, H, m) from residuals ``R = f − M b − c`` (n, K) of :func:`token_queries`;
    also the smallest attention weight seen (how close to saturation the probes came)."""
    H, m = V.shape[0], P.shape[0]
    A = np.matmul(V, P.T).transpose(1, 0, 2).reshape(V.shape[1], H * m)  # [V_h p_i], (K, H·m)
    alpha = least_squares(A, R.T).T.reshape(-1, H, m)
    last = 1.0 - alpha.sum(axis=2)
    smallest = float(min(alpha.min(), last.min()))
    if smallest <= 0:
        raise RecoveryError(f"an attention weight came out {smallest:.2e} ≤ 0: the value maps V_h do not explain "
                            "the answers (heads not separated, or the answers too coarse for these probes)")
    return np.log(alpha) - np.log(last)[:, :, None], smallest


def least_squares(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``argmin ‖A X − B‖`` by a QR factorisation of A (K × p, K ≥ p), or by ``lstsq`` (least norm) when A is
    (nearly) rank-deficient."""
    if A.shape[0] >= A.shape[1] > 0:
        Q, Rr = np.linalg.qr(A)
        diag = np.abs(np.diag(Rr))
        if diag.min() > 1e-10 * diag.max():
            return scipy.linalg.solve_triangular(Rr, Q.T @ B, check_finite=False)
    return np.linalg.lstsq(A, B, rcond=None)[0]


def chunks(P: np.ndarray, m: int) -> list[np.ndarray]:
    """Rows of ``P`` in consecutive blocks of at most ``m``."""
    return [P[i:i + m] for i in range(0, P.shape[0], m)]


def _columns(layer, V, P, Bs, tokens, report):
    """``W_h b + u_h`` (H, d, len(Bs)) for the rows b of ``Bs``: every token offset of ``P`` (orthogonal·scale)
    in blocks of ``tokens``; ``(len(Bs))·⌈d/tokens⌉`` queries. Also the smallest attention weight seen."""
    H, d = V.shape[0], V.shape[-1]
    Y = np.empty((H, d, len(Bs)))
    smallest = 1.0
    for idx in chunks(np.arange(d), tokens):
        L, sm = read_logits(layer.residuals(token_queries(Bs, P[idx])).T, V, P[idx])
        smallest = min(smallest, sm)
        Y[:, idx, :] = L.transpose(1, 2, 0)
        report()
    return np.matmul(P.T, Y) / np.sum(P[0] ** 2), smallest


def gap_rank(sv: np.ndarray, full: int, gap: float = 100.0) -> int:
    """Numerical rank at the largest drop between consecutive singular values, when that drop is at least
    ``gap`` (the head's smallest singular value against the measurement noise); ``full`` when there is none."""
    if sv.size < 2 or sv[0] <= 0:
        return full if sv.size and sv[0] > 0 else 0
    ratio = sv[:-1] / np.maximum(sv[1:], 1e-300)
    i = int(np.argmax(ratio))
    return i + 1 if ratio[i] >= gap else full


def learn_logits(layer, V, scale, tokens, rng, report, *, sketch: bool = True):
    """Every ``W_h`` and ``u_h`` from :func:`token_queries` (stage 4 of the vector learner; Sec. 5's low-rank
    sketch shared by all heads). Token offsets over a scaled orthogonal basis in blocks of ``tokens``:

    1. ``b = 0`` gives ``u_h``; ``b`` over ``L`` rows of a scaled orthogonal basis O gives ``Y_h = W_h Oᵀ_L``
       (its numerical rank, at the largest gap of its singular values, is the head's rank r_h; ``L = d/H + 16``);
    2. if every ``r_h ≤ L − 8``: ``L`` shared random token directions Z against ``b`` over all of O give
       ``ZᵀW_h``, and ``W_h = Q_h (ZᵀQ_h)⁺ ZᵀW_h`` with ``Q_h`` an orthonormal basis of ``Y_h``
       (``(L + 1)⌈d/m⌉ + d⌈L/m⌉`` queries); otherwise ``b`` over the rest of O measures ``W_h`` whole
       (``(d + 1)⌈d/m⌉`` in all).

    Returns ``W, u``, the smallest attention weight seen and the heads' ranks (None when measured whole)."""
    from attnprobe.learners.head.probes import random_orthogonal

    H, d = V.shape[0], V.shape[-1]
    P = scale * random_orthogonal(d, rng)  # token offsets p (rows)
    O = scale * random_orthogonal(d, rng)  # last tokens b (rows)
    L = min(d, -(-d // H) + 16)
    m = max(1, int(tokens))
    if not sketch or (L + 1) * -(-d // m) + d * -(-L // m) >= (d + 1) * -(-d // m):
        L = d  # the sketch would not save queries: measure every W_h whole
    cols, smallest = _columns(layer, V, P, np.concatenate([np.zeros((1, d)), O[:L]]), tokens, report)
    u = cols[:, :, 0]
    Y = cols[:, :, 1:] - u[:, :, None]  # W_h O_Lᵀ
    ranks = [gap_rank(np.linalg.svd(Yh, compute_uv=False), L) for Yh in Y]
    if L < d and max(ranks) <= L - 8:
        Zt = scale * random_orthogonal(d, rng)[:L]  # shared token directions (rows)
        M = np.empty((H, L, d))
        for idx in chunks(np.arange(L), tokens):
            Lg, sm = read_logits(layer.residuals(token_queries(O, Zt[idx])).T, V, Zt[idx])
            smallest = min(smallest, sm)
            M[:, idx, :] = Lg.transpose(1, 2, 0)  # z_kᵀ(W_h b_j + u_h)
            report()
        ZW = (M - np.einsum("kd,hd->hk", Zt, u)[:, :, None]) @ O / scale**2  # Zᵀ W_h, (H, L, d)
        W = np.empty((H, d, d))
        for h in range(H):
            Qh = np.linalg.svd(Y[h], full_matrices=False)[0][:, :ranks[h]]
            W[h] = Qh @ np.linalg.lstsq(Zt @ Qh, ZW[h], rcond=None)[0]
        return W, u, smallest, ranks
    if L < d:
        rest, sm = _columns(layer, V, P, O[L:], tokens, report)
        Y = np.concatenate([Y, rest - u[:, :, None]], axis=2)  # W_h Oᵀ
        smallest = min(smallest, sm)
    return np.matmul(Y, O) / scale**2, u, smallest, None


def head_attention_errors(layer, model, scale, tokens, rng, queries: int = 16) -> np.ndarray:
    """Per head, the relative error of its attention logits on fresh random queries (a check of each ``W_h,
    u_h`` apart, with no access to the truth): the observed logits :func:`read_logits` against the recovered
    model's ``p_iᵀ(Ŵ_h b + û_h)``, RMS miss over RMS logit. Asks ``queries`` queries."""
    d = model.d
    B = scale * rng.standard_normal((queries, d)) / np.sqrt(d)
    P = scale * rng.standard_normal((tokens, d)) / np.sqrt(d)
    R = layer.residuals(token_queries(B, P)).T
    L, _ = read_logits(R, model.v, P)
    pred = np.matmul(np.matmul(P, model.W), B.T).transpose(2, 0, 1) + (model.u @ P.T)[None]  # p_iᵀ(W_h b + u_h)
    miss = np.sqrt(np.mean((L - pred) ** 2, axis=(0, 2)))
    return miss / np.maximum(np.sqrt(np.mean(pred**2, axis=(0, 2))), 1e-300)
