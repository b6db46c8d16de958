"""The second layer by least squares, then Gauss–Newton on the answers themselves.

Given the first layer, ``y = W2 σ(W1 x + b1) + b2`` is linear in ``(W2, b2)``: one least-squares solve over the
answers. The derivative-based first layer carries the finite differences' error (~1e-8 relative); Gauss–Newton
steps on all parameters against the answers remove it. Each step solves the linearised problem with LSMR on a
matrix-free operator (``J δ`` and ``Jᵀ r`` cost two passes over the points), columns scaled to unit norm.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse.linalg import LinearOperator, lsmr

from attnprobe.models.smooth_ffn import Activation


def output_layer(X: np.ndarray, Y: np.ndarray, W1: np.ndarray, b1: np.ndarray, act: Activation,
                 bias: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(W2, b2)`` minimising ``‖Y − W2 σ(W1 X + b1) − b2‖`` (b2 = 0 when not ``bias``)."""
    H = act.f(X @ W1.T + b1)
    if bias:
        H = np.hstack([H, np.ones((H.shape[0], 1))])
    sol = np.linalg.lstsq(H, Y, rcond=None)[0]
    m = W1.shape[0]
    return sol[:m].T.copy(), (sol[m].copy() if bias else np.zeros(Y.shape[1]))


def forward(X, W1, b1, W2, b2, act: Activation) -> np.ndarray:
    return act.f(X @ W1.T + b1) @ W2.T + b2


def gauss_newton(X: np.ndarray, Y: np.ndarray, params: tuple, act: Activation, bias: bool, *, rounds: int,
                 iterations: int) -> tuple[tuple, list[float]]:
    """Up to ``rounds`` Gauss–Newton steps (each at most ``iterations`` LSMR iterations) on all parameters;
    a step is kept only when it lowers the residual. Returns the parameters and the relative residual after
    each kept step (the first entry is the start's)."""
    W1, b1, W2, b2 = params
    scale_y = max(float(np.linalg.norm(Y)), 1e-300)
    R = Y - forward(X, W1, b1, W2, b2, act)
    history = [float(np.linalg.norm(R)) / scale_y]
    for _ in range(rounds):
        step = _step(X, R, W1, b1, W2, act, bias, iterations)
        trial = (W1 + step[0], b1 + step[1], W2 + step[2], b2 + step[3])
        R_new = Y - forward(X, *trial, act)
        err = float(np.linalg.norm(R_new)) / scale_y
        if not err < history[-1]:
            break
        W1, b1, W2, b2 = trial
        R = R_new
        history.append(err)
        if err < 1e-15:
            break
    return (W1, b1, W2, b2), history


def _step(X, R, W1, b1, W2, act: Activation, bias: bool, iterations: int):
    N, d = X.shape
    m, K = W1.shape[0], W2.shape[0]
    A = X @ W1.T + b1
    S, S1 = act.f(A), act.d1(A)
    w2n = np.sum(W2 ** 2, axis=0)
    # column norms of the Jacobian: unit columns after scaling
    c_w1 = np.sqrt(np.maximum((S1 ** 2).T @ (X ** 2) * w2n[:, None], 1e-300))
    c_b1 = np.sqrt(np.maximum(np.sum(S1 ** 2, axis=0) * w2n, 1e-300))
    c_w2 = np.sqrt(np.maximum(np.tile(np.sum(S ** 2, axis=0), (K, 1)), 1e-300))
    c_b2 = np.full(K, np.sqrt(N))
    sizes = [m * d, m if bias else 0, K * m, K if bias else 0]
    cut = np.cumsum([0] + sizes)

    def unpack(v):
        dW1 = (v[cut[0]:cut[1]].reshape(m, d)) / c_w1
        db1 = v[cut[1]:cut[2]] / c_b1 if bias else np.zeros(m)
        dW2 = v[cut[2]:cut[3]].reshape(K, m) / c_w2
        db2 = v[cut[3]:cut[4]] / c_b2 if bias else np.zeros(K)
        return dW1, db1, dW2, db2

    def matvec(v):
        dW1, db1, dW2, db2 = unpack(np.asarray(v).ravel())
        return ((S1 * (X @ dW1.T + db1)) @ W2.T + S @ dW2.T + db2).ravel()

    def rmatvec(r):
        Rm = np.asarray(r).reshape(N, K)
        G = (Rm @ W2) * S1
        parts = [(G.T @ X / c_w1).ravel()]
        if bias:
            parts.append(G.sum(axis=0) / c_b1)
        parts.append((Rm.T @ S / c_w2).ravel())
        if bias:
            parts.append(Rm.sum(axis=0) / c_b2)
        return np.concatenate(parts)

    op = LinearOperator((N * K, int(cut[-1])), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)
    sol = lsmr(op, R.ravel(), atol=1e-8, btol=1e-8, maxiter=iterations)[0]
    return unpack(sol)
