"""Separating the heads of a vector-answer layer along one probe difference δ (docs/multihead-vector.md).

For two-row queries ``X = [b + δ; b]`` the answer minus its length-1 part is
``r(b) = f(X) − M b − c = Σ_h σ(δᵀ(W_h b + u_h)) V_h δ``: for a fixed δ a one-hidden-layer sigmoid network in
``b`` whose output weights are the heads' value vectors ``w_h = V_h δ`` and whose logits are affine in ``b``.
On a design ``b_j = b_0 + Z t_j`` the logits are ``θ_hᵀ[t_j; 1]``; variable projection fits the few logit
parameters θ (the ``w_h`` follow by least squares, with ``Σ_h w_h = M δ`` exact), started from Jennrich's
simultaneous diagonalisation of two finite-difference Jacobians (one δ) or from a neighbouring δ's θ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


@dataclass
class DeltaFit:
    """One δ separated: ``w (K, H)`` the heads' value vectors ``V_h δ``, ``theta (H, q+1)`` their logit
    parameters on the design, ``residual`` the relative misfit of the answers."""

    w: np.ndarray
    theta: np.ndarray
    residual: float


def _solve_values(theta: np.ndarray, T1: np.ndarray, R: np.ndarray, m: np.ndarray):
    """Given logit parameters, the value vectors by least squares with ``Σ_h w_h = m``; returns (w, misfit)."""
    S = sigmoid(theta @ T1.T)  # (H, n)
    D = S[:-1] - S[-1]
    Y = R - np.outer(m, S[-1])
    A = np.linalg.lstsq(D.T, Y.T, rcond=None)[0].T if D.size else np.zeros((R.shape[0], 0))
    w = np.concatenate([A, (m - A.sum(axis=1))[:, None]], axis=1)
    return w, Y - A @ D


def fit_delta(R: np.ndarray, T: np.ndarray, m: np.ndarray, theta0: np.ndarray, *, max_nfev: int = 60) -> DeltaFit:
    """Variable projection: logit parameters θ (H, q+1) minimising ``‖R − W S(θ)‖`` with ``W 1 = m``
    (Levenberg–Marquardt on Kaufman's Jacobian).

    ``R (K, n)``: residuals at the design points ``T (n, q)``; ``m = M δ``.
    """
    H = theta0.shape[0]
    T1 = np.concatenate([T, np.ones((T.shape[0], 1))], axis=1)
    scale = max(float(np.linalg.norm(R)), 1e-300)
    # everything the fit touches lies in the span of [R, m]: work in an orthonormal basis of it (lossless)
    U, _ = np.linalg.qr(np.concatenate([R, m[:, None]], axis=1))
    R_full, R, m = R, U.T @ R, U.T @ m
    cache = {}

    def parts(x):
        key = x.tobytes()
        if key not in cache:
            cache.clear()
            theta = x.reshape(H, -1)
            S = sigmoid(theta @ T1.T)
            D = S[:-1] - S[-1]
            Y = R - np.outer(m, S[-1])
            A = np.linalg.lstsq(D.T, Y.T, rcond=None)[0].T
            w = np.concatenate([A, (m - A.sum(axis=1))[:, None]], axis=1)
            cache[key] = (S, D, w, Y - A @ D)
        return cache[key]

    def fun(x):
        return (parts(x)[3] / scale).ravel()

    def jac(x):
        S, D, w, _ = parts(x)
        Qd = np.linalg.qr(D.T)[0]  # (n, H-1): the row space of D
        G = (S * (1 - S))[:, :, None] * T1[None]  # (H, n, q+1): ∂s_h/∂θ_h
        G = G - np.einsum("nk,hkl->hnl", Qd, np.einsum("nk,hnl->hkl", Qd, G))  # project out rowspace of D
        J = -np.einsum("kh,hnl->knhl", w, G) / scale
        return J.reshape(R.size, -1)

    x = _levenberg_marquardt(fun, jac, theta0.ravel(), max_nfev)
    theta = x.reshape(H, -1)
    w, res = _solve_values(theta, T1, R, m)
    misfit = np.linalg.norm(R_full - U @ (U.T @ R_full))  # zero up to rounding; kept for honesty
    return DeltaFit(U @ w, theta, float(np.hypot(np.linalg.norm(res), misfit) / scale))


def _levenberg_marquardt(fun, jac, x, max_iter):
    """Minimise ``‖fun(x)‖`` (Levenberg–Marquardt with Nielsen's damping update); stops when a step no longer
    reduces the misfit by a relative 1e-12 or after ``max_iter`` iterations."""
    r = fun(x)
    cost = float(r @ r)
    lam, nu = 1e-3, 2.0
    for _ in range(max_iter):
        J = jac(x)
        g = J.T @ r
        A = J.T @ J
        diag = np.maximum(np.diag(A), 1e-300)
        while True:
            step = np.linalg.solve(A + lam * np.diag(diag), -g)
            x_new = x + step
            r_new = fun(x_new)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                break
            lam *= nu
            nu *= 2.0
            if lam > 1e12:
                return x
        done = cost - cost_new <= 1e-12 * cost or np.linalg.norm(step) <= 1e-14 * (1 + np.linalg.norm(x))
        x, r, cost, lam, nu = x_new, r_new, cost_new, max(lam / 3.0, 1e-12), 2.0
        if done:
            break
    return x


def jennrich(J1: np.ndarray, J2: np.ndarray, U: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Value vectors ``w_h`` from two Jacobians ``J_i = W diag(σ'_h(b_i)) C`` (K × q, same C) sharing the columns
    ``W`` (K × H): the eigenvectors of ``J_1 J_2⁺`` restricted to their span ``U``, scaled so ``Σ_h w_h = m``."""
    A1, A2 = U.T @ J1, U.T @ J2
    T = A1 @ np.linalg.pinv(A2)
    vals, vecs = np.linalg.eig(T)
    vecs = np.real(vecs)
    W = U @ vecs
    alpha = np.linalg.lstsq(W, m, rcond=None)[0]
    return W * alpha


def theta_from_values(w: np.ndarray, R: np.ndarray, T: np.ndarray, clip: float = 1e-6) -> np.ndarray:
    """Logit parameters from known value vectors: attention weights by least squares, logits, affine fit."""
    S = np.linalg.lstsq(w, R, rcond=None)[0]  # (H, n)
    S = np.clip(S, clip, 1 - clip)
    L = np.log(S / (1 - S))
    T1 = np.concatenate([T, np.ones((T.shape[0], 1))], axis=1)
    return np.linalg.lstsq(T1, L.T, rcond=None)[0].T
