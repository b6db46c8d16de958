"""The post-norm neurons stage's Jacobian span through C probe directions, for wide layers (docs/block.md,
"Post-norm blocks", stage ``neurons``: "Through C probe directions" and "The span by Gauss–Newton").

Restricted to C centred orthonormal directions U, at points ``z_j`` of n1's sphere orthogonal to U, the answers
give ``x_j = Dq(z_j) U`` (central differences along U: ``2C + 1`` single tokens a point) and
``r_j x_j = J_j U − q_j g_jᵀ``: each ``x_j + q̂_j ⊗ g_j`` lies, for the right ``g_j`` (C numbers), in the
(m + 1)-span ``S_U`` of the factors ``w̃_i ⊗ Uᵀa_i`` and the linear part ``P diag(w1) U`` (d × C matrices
flattened row-major, index ``x·C + c``). :func:`probe_span` finds it by Gauss–Newton on the Grassmannian with the
corrections eliminated (variable projection): for a basis B each ``g_j`` is a C × C solve, and the step Δ ⊥ B solves
``Q[Δ Σ c_j c_jᵀ − Σ_j P_j Δ c_j c_jᵀ] = Σ_j e_j c_jᵀ`` (``c_j`` the corrected point's coordinates, ``e_j`` its
residual, ``P_j`` the projector onto ``Q(q̂_j ⊗ I)``, Q off B) by conjugate gradients preconditioned by
``(Σ c_j c_jᵀ)⁻¹``; then ``B ← orth(B + Δ)``. Its rank-one elements are :mod:`.post_norm_factors`'.
"""

from __future__ import annotations

import numpy as np

from attnprobe.learners.block.post_norm import FirstNormInput, centred_unit, single_tokens

#: central-difference step along the probes (n1's input at rms 1)
STEP = 1e-5
#: Gauss–Newton steps at most, conjugate-gradient steps per step, and the relative residual that ends them (the
#: central differences' error is ~1e-10; MiniLM layer 2 reached 4.6e-10 in 6 steps)
STEPS, CG, SETTLED = 12, 10, 1e-9
#: below this residual a step that gains less than ×2 ends the steps (the early steps gain little: 8.5e-2 → 6.4e-2)
STALL = 1e-6


def probe_points(answer_rows, affine: FirstNormInput, n2: tuple, U: np.ndarray, rng, points: int):
    """``(Z, Q, X)``: ``points`` centred unit n1 inputs orthogonal to U, their ``q_j`` and ``x_j = Dq(z_j) U``
    flattened (points × dC), from ``points·(2C + 1)`` single tokens."""
    d, C = U.shape
    Z = rng.standard_normal((points, d))
    Z = Z - Z.mean(axis=1, keepdims=True)
    Z = centred_unit(Z - (Z @ U) @ U.T)
    V = np.concatenate([Z[:, None], Z[:, None] + STEP * U.T, Z[:, None] - STEP * U.T], axis=1).reshape(-1, d)
    w2, b2 = n2
    Y = ((single_tokens(answer_rows, affine.token(V)) - b2) / w2).reshape(points, 2 * C + 1, d)
    X = (Y[:, 1:C + 1] - Y[:, C + 1:]).transpose(0, 2, 1) / (2 * STEP)
    return Z, Y[:, 0], X.reshape(points, d * C)


def point_corrections(B, X, Qh, C):
    """Per point: ``S_j = (I − M_j M_jᵀ)⁻¹`` (``M_j = N_jᵀB``), the coordinates ``c_j`` and residuals ``e_j`` of
    ``x_j + N_j g_j`` at the optimal ``g_j``."""
    n, d = Qh.shape
    k = B.shape[1]
    Mj = np.einsum("dck,jd->jck", B.reshape(d, C, k), Qh, optimize=True)
    Bx = X @ B
    Cx = np.einsum("jdc,jd->jc", X.reshape(n, d, C), Qh)
    S = np.linalg.inv(np.eye(C)[None] - np.einsum("jcm,jem->jce", Mj, Mj))
    g = -np.einsum("jce,je->jc", S, Cx - np.einsum("jcm,jm->jc", Mj, Bx))
    c = Bx + np.einsum("jcm,jc->jm", Mj, g)
    E = X + (Qh[:, :, None] * g[:, None, :]).reshape(n, d * C) - c @ B.T
    return S, c, E


def _operator(B, S, c, Mc, Qh, D):
    """``A(Δ) = Q[Δ Σ c cᵀ − Σ_j P_j Δ c_j c_jᵀ]``."""
    n, d = Qh.shape
    C = S.shape[1]
    T = (D @ c.T).reshape(d, C, n)
    w = np.einsum("jce,je->jc", S, np.einsum("dcj,jd->jc", T, Qh))
    V = np.stack([Qh.T @ (w[:, e:e + 1] * c) for e in range(C)], axis=1)
    R = D @ Mc - V.reshape(d * C, -1)
    return R - B @ (B.T @ R)


def _gn_step(B, X, Qh, C, iters):
    """One Gauss–Newton step: ``(new B, relative residual before it)``."""
    S, c, E = point_corrections(B, X, Qh, C)
    Mc = c.T @ c
    Minv = np.linalg.inv(Mc)
    R = E.T @ c
    R -= B @ (B.T @ R)
    D = np.zeros_like(B)
    Zp = R @ Minv
    Pd, rz = Zp.copy(), float(np.sum(R * Zp))
    for _ in range(iters):
        AP = _operator(B, S, c, Mc, Qh, Pd)
        a = rz / float(np.sum(Pd * AP))
        D += a * Pd
        R -= a * AP
        Zp = R @ Minv
        rz, rz_old = float(np.sum(R * Zp)), rz
        Pd = Zp + rz / rz_old * Pd
    return np.linalg.qr(B + D)[0], float(np.sqrt(np.sum(E * E) / np.sum(X * X)))


def probe_span(X: np.ndarray, Q: np.ndarray, C: int, k: int, steps: int = STEPS):
    """``(B, residuals)``: an orthonormal basis (dC × k) of the span ``S_U`` from the points' ``x_j`` (rows of X) and
    ``q_j`` (rows of Q), from their top k singular vectors, and the relative residual before each step; stops below
    :data:`SETTLED` or where a step below :data:`STALL` gains less than ×2 (the differences' error: d = 32 3.3e-9,
    d = 64 6.6e-9)."""
    Qh = Q / np.linalg.norm(Q, axis=1, keepdims=True)
    B = np.linalg.svd(X.T, full_matrices=False)[0][:, :k]
    residuals = []
    for _ in range(steps):
        B_new, res = _gn_step(B, X, Qh, C, CG)
        if res < SETTLED or (res < STALL and residuals and res > 0.5 * residuals[-1]):  # the differences' error
            residuals.append(res)
            break
        residuals.append(res)
        B = B_new
    _, _, E = point_corrections(B, X, Qh, C)
    residuals.append(float(np.sqrt(np.sum(E * E) / np.sum(X * X))))
    return B, residuals
