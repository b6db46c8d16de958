"""Attention logits of every head at once, once the value maps ``V_h`` are known (docs/multihead-vector.md).

A query ``X = [b + p_1; …; b + p_m; b]`` answers ``f(X) = M b + c + Σ_h Σ_i α_{h,i} V_h p_i``: K numbers and
``H·m`` unknown attention weights, read by one least-squares solve with the K × Hm matrix ``[V_h p_i]``
(well-conditioned for m ≪ K/H). Then ``log(α_{h,i}/α_{h,N}) = p_iᵀ(W_h b + u_h)`` (eq. 1 of the paper, one
bilinear measurement per head and token), so ``m`` tokens per query measure ``H·m`` entries of ``W_h b + u_h``.
"""

from __future__ import annotations

import numpy as np

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
    A = np.einsum("hkd,md->khm", V, P).reshape(V.shape[1], H * m)
    alpha = np.linalg.lstsq(A, R.T, rcond=None)[0].T.reshape(-1, H, m)
    last = 1.0 - alpha.sum(axis=2)
    smallest = float(min(alpha.min(), last.min()))
    if smallest <= 0:
        raise RecoveryError(f"an attention weight came out {smallest:.2e} ≤ 0: the value maps V_h do not explain "
                            "the answers (heads not separated, or the answers too coarse for these probes)")
    return np.log(alpha) - np.log(last)[:, :, None], smallest


def chunks(P: np.ndarray, m: int) -> list[np.ndarray]:
    """Rows of ``P`` in consecutive blocks of at most ``m``."""
    return [P[i:i + m] for i in range(0, P.shape[0], m)]


def learn_logits(layer, V, scale, tokens, rng, report):
    """Every ``W_h`` and ``u_h`` from :func:`token_queries` (stage 4 of the vector learner): token offsets ``p``
    over a scaled orthogonal basis in blocks of ``tokens``, last tokens ``b = 0`` (``u_h``) and a scaled
    orthogonal basis (``W_h``): ``(d + 1)·⌈d/tokens⌉`` queries. Returns ``W, u`` and the smallest attention
    weight seen."""
    from attnprobe.learners.probes import random_orthogonal

    H, d = V.shape[0], V.shape[-1]
    P = scale * random_orthogonal(d, rng)  # token offsets p (rows)
    Bs = np.concatenate([np.zeros((1, d)), scale * random_orthogonal(d, rng)])  # b = 0, then scale·O
    Y = np.empty((H, d, d + 1))  # P (W_h b + u_h) for each b
    smallest = 1.0
    for idx in chunks(np.arange(d), tokens):
        R = layer.residuals(token_queries(Bs, P[idx])).T  # (d + 1, K)
        L, sm = read_logits(R, V, P[idx])
        smallest = min(smallest, sm)
        Y[:, idx, :] = L.transpose(1, 2, 0)
        report()
    Pb = np.einsum("ed,heb->hdb", P, Y) / scale**2  # W_h b + u_h for each b (P orthogonal·scale)
    u = Pb[:, :, 0]
    W = np.einsum("hdb,be->hde", Pb[:, :, 1:] - u[:, :, None], Bs[1:]) / scale**2
    return W, u, smallest


def head_attention_errors(layer, model, scale, tokens, rng, queries: int = 16) -> np.ndarray:
    """Per head, the relative error of its attention logits on fresh random queries (a check of each ``W_h,
    u_h`` apart, with no access to the truth): the observed logits :func:`read_logits` against the recovered
    model's ``p_iᵀ(Ŵ_h b + û_h)``, RMS miss over RMS logit. Asks ``queries`` queries."""
    d = model.d
    B = scale * rng.standard_normal((queries, d)) / np.sqrt(d)
    P = scale * rng.standard_normal((tokens, d)) / np.sqrt(d)
    R = layer.residuals(token_queries(B, P)).T
    L, _ = read_logits(R, model.v, P)
    pred = np.einsum("md,hde,be->bhm", P, model.W, B) + np.einsum("md,hd->hm", P, model.u)[None]
    miss = np.sqrt(np.mean((L - pred) ** 2, axis=(0, 2)))
    return miss / np.maximum(np.sqrt(np.mean(pred**2, axis=(0, 2))), 1e-300)
