"""The second layer by least squares, then Gauss–Newton on the answers themselves.

Given the first layer, ``y = W2 σ(W1 x + b1) + b2`` is linear in ``(W2, b2)``: one least-squares solve over the
answers. The derivative-based first layer carries the finite differences' error (~1e-8 relative); Gauss–Newton
steps on all parameters against the answers remove it. Each step solves the linearised problem with LSMR on a
matrix-free operator (``J δ`` and ``Jᵀ r`` cost two passes over the points), columns scaled to unit norm.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular
from scipy.sparse.linalg import LinearOperator, lsmr

from attnprobe.models.smooth_ffn import Activation

#: largest ``N·m·(d+1)²`` for which each neuron's first-layer block gets its own Cholesky preconditioner
BLOCK_WORK = 4e9


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


#: a kept step that leaves more than this of the residual doubles the next one's iterations (``grow_to``; MiniLM
#: layer 2's whole FFN on float32 answers, round 5: 20 iterations left 0.87 of it, 40 left 0.77)
GROW_RATIO = 0.5
#: fractions of a Gauss–Newton step tried in turn until one lowers the residual
BACKTRACK = (1.0, 0.5, 0.25, 0.125)


def gauss_newton(X: np.ndarray, Y: np.ndarray, params: tuple, act: Activation, bias: bool, *, rounds: int,
                 iterations: int, single: bool = False, grow_to: int | None = None) -> tuple[tuple, list[float]]:
    """Up to ``rounds`` Gauss–Newton steps (each at most ``iterations`` LSMR iterations) on all parameters;
    a step (or, when it does not halve the residual, the best of it and its half, quarter, eighth:
    :data:`BACKTRACK`) is kept only when it lowers the residual. Returns the parameters, the relative residual
    after each kept step (the first entry is the start's) and the LSMR iterations of each step. ``single``: the
    steps' Jacobian products in float32 (:func:`lsmr_step`); the residuals stay float64. ``grow_to``: after a
    kept step that left more than :data:`GROW_RATIO` of the residual, the next step's iterations double, up to
    this many (the first steps' error is in well-conditioned directions, the later ones' less so)."""
    W1, b1, W2, b2 = params
    scale_y = max(float(np.linalg.norm(Y)), 1e-300)
    R = Y - forward(X, W1, b1, W2, b2, act)
    history = [float(np.linalg.norm(R)) / scale_y]
    used: list[int] = []
    for _ in range(rounds):
        step = _step(X, R, W1, b1, W2, act, bias=bias, iterations=iterations, single=single)
        used.append(step[4])
        err = np.inf
        for t in BACKTRACK:  # the full step, and when it does not halve the residual the shorter ones: the best
            candidate = (W1 + t * step[0], b1 + t * step[1], W2 + t * step[2], b2 + t * step[3])
            R_t = Y - forward(X, *candidate, act)
            err_t = float(np.linalg.norm(R_t)) / scale_y
            if not err_t < err:  # shorter is no better: stop shortening
                break
            trial, R_new, err = candidate, R_t, err_t
            if err < history[-1] / 2:
                break
        if not err < history[-1]:
            break
        W1, b1, W2, b2 = trial
        R = R_new
        if grow_to is not None and err > GROW_RATIO * history[-1]:
            iterations = min(grow_to, 2 * iterations)
        history.append(err)
        if err < 1e-15:
            break
    return (W1, b1, W2, b2), history, used


def _step(X, R, W1, b1, W2, act: Activation, *, bias: bool, iterations: int, single: bool = False):
    """One Gauss–Newton step on ``(W1, b1, W2, b2)`` (:func:`lsmr_step` with the rows' factors ``σ'(a_i)``)."""
    A = X @ W1.T + b1
    dP, dH, used = lsmr_step(X, R, act.f(A), act.d1(A), W2, bias=bias, iterations=iterations, single=single)
    d, m = X.shape[1], W1.shape[0]
    db1 = dP[:, d] if bias else np.zeros(m)
    db2 = dH[m] if bias else np.zeros(W2.shape[0])
    return dP[:, :d], db1, dH[:m].T, db2, used


def lsmr_step(X, R, H, F, W2, *, bias: bool, iterations: int, single: bool = False):
    """One Gauss–Newton step by LSMR for a model ``y = Σ_i W2[:, i] H_i(x) + b2`` whose first-layer rows
    ``p_r = (w_r, b_r)`` enter through ``∂y/∂p_r = W2[:, r] F_r(x) [x, 1]`` (``H`` (N, m) the hidden values,
    ``F`` (N, rows) the rows' factors, ``W2`` (K, rows) each row's output column). Preconditioned: the second
    layer's columns ``[H, 1]`` orthonormalised (QR), each row's block whitened by its own Cholesky factor (or scaled
    to unit columns when the blocks would cost more than :data:`BLOCK_WORK`). ``single``: the products (and the
    orthonormalisation, :func:`_orthonormal_columns`) in float32, about five times faster on this machine's
    BLAS; a step needs only a few right digits when the answers themselves are float32 (the residual it solves
    for stays float64). Returns the rows' steps
    ``(rows, d [+1])``, the second layer's step ``(m [+1], K)`` and the LSMR iterations."""
    N, d = X.shape
    m, K = F.shape[1], W2.shape[0]
    S1 = F
    H = np.hstack([H, np.ones((N, 1))]) if bias else H
    dt = np.float32 if single else np.float64
    Q, Rh = _orthonormal_columns(H.astype(dt))
    Xb = np.hstack([X, np.ones((N, 1))]) if bias else X
    p = Xb.shape[1]
    w2n = np.sum(W2 ** 2, axis=0)
    if N * m * p * p <= BLOCK_WORK:
        G = np.einsum("ni,na,nb->iab", S1 ** 2, Xb, Xb) * w2n[:, None, None]
        L = np.linalg.cholesky(G + 1e-300 * np.eye(p))  # G_i = L_i L_iᵀ; variables y_i = L_iᵀ δ_i
        Linv = np.linalg.inv(L)

        def to_w1(y):
            return np.einsum("iba,ib->ia", Linv, y)  # δ_i = L_i⁻ᵀ y_i

        def from_w1(g):
            return np.einsum("iab,ib->ia", Linv, g)  # L_i⁻¹ g_i
    else:
        col = np.sqrt(np.maximum((S1 ** 2).T @ (Xb ** 2) * w2n[:, None], 1e-300))

        def to_w1(y):
            return y / col

        def from_w1(g):
            return g / col
    n1 = m * p
    S1, Xb, W2 = (np.ascontiguousarray(a, dtype=dt) for a in (S1, Xb, W2))

    def matvec(v):
        v = np.asarray(v).ravel()
        dP = to_w1(v[:n1].reshape(m, p)).astype(dt)
        z = v[n1:].reshape(Q.shape[1], K).astype(dt)
        return ((S1 * (Xb @ dP.T)) @ W2.T + Q @ z).ravel().astype(np.float64)

    def rmatvec(r):
        Rm = np.asarray(r).reshape(N, K).astype(dt)
        g = (((Rm @ W2) * S1).T @ Xb).astype(np.float64)
        return np.concatenate([from_w1(g).ravel(), (Q.T @ Rm).ravel().astype(np.float64)])

    op = LinearOperator((N * K, n1 + Q.shape[1] * K), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)
    sol = lsmr(op, R.ravel(), atol=1e-7, btol=1e-7, maxiter=iterations)
    dP = to_w1(sol[0][:n1].reshape(m, p))
    dH = np.linalg.solve(Rh.astype(np.float64), sol[0][n1:].reshape(Q.shape[1], K))  # (hidden [+1]) × K
    return dP, dH, int(sol[2])


def _orthonormal_columns(H: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(Q, R)`` with ``H = Q R``, Q's columns orthonormal: by QR, or on float32 ``H`` by the Cholesky factor of
    the Gram matrix (``R = Lᵀ``, ``Q = H L⁻ᵀ``; the Gram formed in float32, factored in float64), six times faster
    than float32 QR on MiniLM's 12,308 × 1537 (1.9 s against 11.5 s; Q orthonormal to 4e-5 at cond(H) ≈ 210, enough
    for a preconditioner: ``Q z = H R⁻¹ z`` holds whatever Q's error); QR where the Gram is not positive definite."""
    if H.dtype == np.float32:
        try:
            L = np.linalg.cholesky((H.T @ H).astype(np.float64))
        except np.linalg.LinAlgError:
            return np.linalg.qr(H)
        Q = solve_triangular(L.astype(np.float32), H.T, lower=True).T
        return np.ascontiguousarray(Q), L.T
    return np.linalg.qr(H)
