"""Refining a RoPE attention read at a fixed query rms (the block learner's attention stage, docs/block.md).

Through a block the query's scale is fixed by the norm, and the RoPE learner's logit sketches then put small keys
beside a large query: each head's weights are read off a small share of the answer, and the output spaces' error
(~1e-10) comes back ~100× larger in the logits (measured at d = 32: values 4e-10, logit matrices 1e-6, function
1.9e-7). Two exact sub-problems finish the job from that start:

- :func:`refit_logits` — **logits, one head at a time.** With the heads' value maps known, an answer in head h's own
  coordinates is ``Σ_j α_hj G_h x_j``: with fewer nonzero tokens than ``d_h`` the weights come out exactly
  (:func:`~attnprobe.learners.positional.rope.attention_weights`), and ``log α_hk/α_hN = q_hᵀ R(δ_k) k(x_k) −
  q_hᵀ k(z)`` with ``q_h = W_Q,h z``: a bilinear function of ``(W_Q,h, W_K,h)`` and the angles. Keys of rms
  :data:`KEY_RMS` (as large as the query's share, logits of order one); Gauss–Newton per head on the normal
  equations (``2 d_h d + d_h/2`` unknowns), Levenberg's diagonal 1e-12 for the scaled-rotation gauge of each pair.

Measured at d = 32 (2/1 heads) on the true attention: 1.9e-7 → 2.8e-10 in 256 queries and 4 s. What did not help:
refitting the values by linear least squares given the logits (``Σ_h V_h u_h + c``, ``u_h = Σ_j α_hj x_j``, each
``V_h`` cut to rank ``d_h``) and alternating: 2.8e-10 → 6.2e-10 → 1.1e-9 (the heads' weights on the same few tokens
are alike, so the split between the heads' value maps is ill-conditioned); the learner's value maps are kept.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg
import scipy.linalg.blas

from attnprobe.learners.positional.rope import attention_weights
from attnprobe.models.positional import PositionalAttention

#: the keys' rms in the logit data (inside the norm's ball; the query's rms is fixed by the norm)
KEY_RMS = 0.5
#: the longest sequence of the refit data (offsets −1 … −(N − 1): the check's lengths reach 64)
MAX_LENGTH = 64
#: at most this many steps per head (on the true attention the first reaches the floor the value maps' error sets;
#: through a block it takes several, from a far start dozens)
STEPS = 40
#: a full step from a fresh matrix that keeps more than this share of the residual ends the descent (the floor)
STALL = 0.9
#: normal matrices formed per head at most (:func:`_gauss_newton_head`)
FORMATIONS = 8
#: Levenberg's relative diagonal (the gauge: a scaled rotation per frequency pair leaves every logit unchanged)
DAMPING = 1e-12
#: rows of the Jacobian formed at once
CHUNK = 2048


def refit_data(att_oracle, query_rms: float, head_dim: int, rng: np.random.Generator, sequences: int):
    """Sequences of length :data:`MAX_LENGTH` with the query (rms ``query_rms``) last, ``head_dim // 2`` keys of rms
    :data:`KEY_RMS` at random distinct earlier positions and zero rows elsewhere (a zero row has logit 0 and value
    0), and their last-row answers. Returns ``(X, keys, offsets, Y)``: X (B, N, d), the keys (B, T, d) and their
    offsets (B, T) (negative), the answers (B, K)."""
    d, N, T = att_oracle.d, MAX_LENGTH, max(1, head_dim // 2)
    pos = np.stack([rng.choice(N - 1, size=T, replace=False) for _ in range(sequences)])
    keys = rng.standard_normal((sequences, T, d)) * KEY_RMS
    z = rng.standard_normal((sequences, d))
    z *= query_rms * math.sqrt(d) / np.linalg.norm(z, axis=1, keepdims=True)
    X = np.zeros((sequences, N, d))
    X[np.arange(sequences)[:, None], pos] = keys
    X[:, -1] = z
    return X, keys, pos - (N - 1), np.asarray(att_oracle(X), dtype=np.float64)


def _rot(x: np.ndarray, ang: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE of rows ``x (n, d_h)`` by angles ``ang (n, d_h/2)``."""
    h = ang.shape[1]
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[:, :h], x[:, h:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=1)


def _head_residual(params, rows, jacobian: bool):
    """Log-ratio residuals ``q_hᵀ R(δ) k(x) − q_hᵀ k(z) − target`` for ``rows = (z, x, δ, target)`` and, with
    ``jacobian``, their derivatives in ``params = (W_Q,h, W_K,h, θ)`` (n, 2 d_h d + d_h/2)."""
    Wq, Wk, theta = params
    z, x, off, target = rows
    q, kx, kz = z @ Wq.T, x @ Wk.T, z @ Wk.T
    ang = off[:, None] * theta[None]
    rk = _rot(kx, ang)
    r = np.sum(q * rk, axis=1) - np.sum(q * kz, axis=1) - target
    if not jacobian:
        return r, None
    n, dh = q.shape
    h = dh // 2
    rq = _rot(q, -ang)  # R(δ)ᵀ q
    jq = ((rk - kz)[:, :, None] * z[:, None, :]).reshape(n, -1)
    jk = (rq[:, :, None] * x[:, None, :] - q[:, :, None] * z[:, None, :]).reshape(n, -1)
    # d/dθ_p of q_aᵀ(k_a c − k_b s) + q_bᵀ(k_b c + k_a s) = δ(−q_a k_a s − q_a k_b c − q_b k_b s + q_b k_a c)
    c, s = np.cos(ang), np.sin(ang)
    qa, qb, ka, kb = q[:, :h], q[:, h:], kx[:, :h], kx[:, h:]
    jt = off[:, None] * (-qa * ka * s - qa * kb * c - qb * kb * s + qb * ka * c)
    return r, np.concatenate([jq, jk, jt], axis=1)


def _normal_matrix(p, split, rows):
    """``(JᵀJ, Jᵀr)`` at ``p`` (``JᵀJ``'s upper triangle, by ``syrk`` over :data:`CHUNK` rows at a time)."""
    A = np.zeros((p.size, p.size), order="F")
    g = np.zeros(p.size)
    for i in range(0, len(rows[0]), CHUNK):
        r, J = _head_residual(split(p), [a[i:i + CHUNK] for a in rows], True)
        A = scipy.linalg.blas.dsyrk(1.0, J.T, beta=1.0, c=A, trans=0, lower=0, overwrite_c=1)
        g += J.T @ r
    return A, g


def _gradient(p, split, rows):
    g = np.zeros(p.size)
    for i in range(0, len(rows[0]), CHUNK):
        r, J = _head_residual(split(p), [a[i:i + CHUNK] for a in rows], True)
        g += J.T @ r
    return g


def _gauss_newton_head(start, rows, steps: int):
    """Levenberg–Marquardt from ``start = (W_Q,h, W_K,h, θ)`` on the log-ratio ``rows`` (:func:`_head_residual`).
    The normal matrix is the cost (d = 128: 8,192 rows × 4,104 unknowns per head): its damped Cholesky factor is
    reused (a chord step) while the steps keep halving the residual, and re-formed where they do not (at most
    :data:`FORMATIONS` times); a step that does not lower the residual from a fresh matrix is retried with the
    damping ×10, a kept one from a fresh matrix lowers it ÷10 (down to :data:`DAMPING`)."""
    Wq, Wk, theta = start
    dh, d = Wq.shape
    p = np.concatenate([Wq.ravel(), Wk.ravel(), theta])

    def split(p):
        return p[:dh * d].reshape(dh, d), p[dh * d:2 * dh * d].reshape(dh, d), p[2 * dh * d:]

    def factor(A, damping):
        B = A.copy(order="F")
        diag = np.diag(A)
        B[np.diag_indices_from(B)] += damping * np.maximum(diag, diag.max() * 1e-4)
        return scipy.linalg.cho_factor(B, lower=False, overwrite_a=True, check_finite=False)

    history = [float(np.linalg.norm(_head_residual(start, rows, False)[0]))]
    A, g = _normal_matrix(p, split, rows)
    damping, formed, fresh = DAMPING, 1, True
    chol = factor(A, damping)
    for _ in range(steps):
        trial = p - scipy.linalg.cho_solve(chol, g, check_finite=False)
        err = float(np.linalg.norm(_head_residual(split(trial), rows, False)[0]))
        if err < history[-1]:
            p = trial
            history.append(err)
            if err <= history[-2] / 2:
                g, fresh = _gradient(p, split, rows), False
                continue
            if fresh and err > history[-2] * STALL:  # the floor: a step from a fresh matrix gained next to nothing
                break
            damping = max(DAMPING, damping / 10) if fresh else damping
        elif fresh:
            if damping >= 1:
                break
            damping *= 10
            chol = factor(A, damping)
            continue
        if formed >= FORMATIONS:
            break
        A, g = _normal_matrix(p, split, rows)
        formed, fresh = formed + 1, True
        chol = factor(A, damping)
    return (*split(p), history)


def refit_logits(model: PositionalAttention, data, steps: int = STEPS) -> tuple[PositionalAttention, list]:
    """Per head, Gauss–Newton on the log-ratios of the weights read in the head's own coordinates (module
    docstring); the heads' angles are averaged afterwards. Returns the model and each head's residual history."""
    X, keys, offs, Y = data
    H, dh = model.H, model.Wq.shape[1]
    Pc = np.linalg.pinv(model.Wo).reshape(H, dh, -1)
    z = X[:, -1]
    toks = np.concatenate([keys, z[:, None]], axis=1)
    la = np.log(attention_weights(Pc, model.Wv, toks, Y - model.bo))  # (B, H, T+1)
    ell = la[..., :-1] - la[..., -1:]
    T = keys.shape[1]
    zz, xx, oo = np.repeat(z, T, axis=0), keys.reshape(-1, keys.shape[2]), offs.reshape(-1).astype(np.float64)
    Wq, Wk, thetas, hist = [], [], [], []
    for h in range(H):
        q, k, t, hh = _gauss_newton_head((model.scale * model.Wq[h], model.Wk[model.group(h)], model.inv_freq),
                                         (zz, xx, oo, ell[:, h].reshape(-1)), steps)
        Wq.append(q)
        Wk.append(k)
        thetas.append(t)
        hist.append(hh)
    theta = np.mean(thetas, axis=0)
    out = PositionalAttention(np.array(Wq), np.array(Wk), model.Wv if model.G == H else
                              np.array([model.Wv[model.group(h)] for h in range(H)]), model.Wo, bo=model.bo,
                              position="rope", inv_freq=theta, layout="half", scale=1.0, causal=True)
    return out, hist
