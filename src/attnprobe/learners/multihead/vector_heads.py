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


def mean_index(z: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The link of a progression ``[b; b + δ; …; b + (N−1)δ]`` (N = ``length``): the mean of j under
    ``softmax_j(j z)``, j = 0..N−1, and its derivative (the variance of j). ``length`` 2 is the sigmoid."""
    if length == 2:
        s = sigmoid(z)
        return s, s * (1.0 - s)
    j = np.arange(length, dtype=np.float64)
    a = z[..., None] * j
    a -= a.max(axis=-1, keepdims=True)
    p = np.exp(a)
    p /= p.sum(axis=-1, keepdims=True)
    mu = p @ j
    return mu, np.maximum(p @ (j * j) - mu * mu, 0.0)


@dataclass
class DeltaFit:
    """One δ separated: ``w (K, H)`` the heads' value vectors ``V_h δ``, ``theta (H, q+1)`` their logit
    parameters on the design, ``residual`` the relative misfit of the answers."""

    w: np.ndarray
    theta: np.ndarray
    residual: float


def fit_delta(R: np.ndarray, T: np.ndarray, m: np.ndarray, theta0: np.ndarray, *, max_nfev: int = 60,
              length: int = 2) -> DeltaFit:
    """Variable projection: logit parameters θ (H, q+1) minimising ``‖R − W S(θ)‖`` with ``W 1 = m``
    (Levenberg–Marquardt on Kaufman's Jacobian).

    ``R (K, n)``: residuals at the design points ``T (n, q)``; ``m = M δ``. ``length``: the link is
    :func:`mean_index` of that length (2: the sigmoid of two-row queries; N: the rows of a progression).
    """
    return fit_deltas(R[None], T, m[None], theta0[None], max_nfev=max_nfev, length=length)[0]


def fit_deltas(R: np.ndarray, T: np.ndarray, m: np.ndarray, theta0: np.ndarray, *,
               max_nfev: int = 60, length: int = 2) -> list[DeltaFit]:
    """:func:`fit_delta` for F differences at once, on the same design ``T``: ``R (F, K, n)``, ``m (F, K)``,
    ``theta0 (F, H, q+1)``. Each fit runs its own Levenberg–Marquardt iterations; they share every array
    operation, so the fits of a batch cost about what one costs."""
    F, H = theta0.shape[:2]
    T1 = np.concatenate([T, np.ones((T.shape[0], 1))], axis=1)
    scale = np.maximum(np.linalg.norm(R, axis=(1, 2)), 1e-300)
    # everything a fit touches lies in the span of [R, m]: work in an orthonormal basis of it (lossless)
    U = np.linalg.qr(np.concatenate([R, m[:, :, None]], axis=2))[0]
    Ut = U.transpose(0, 2, 1)
    fit = VariableProjection(Ut @ R, (Ut @ m[:, :, None])[:, :, 0], T1, scale, H, length)
    x = _levenberg_marquardt(fit, theta0.reshape(F, -1).astype(np.float64), max_nfev)
    _, _, w, res = fit.parts(x, np.arange(F))
    misfit = np.linalg.norm(R - U @ (Ut @ R), axis=(1, 2))  # zero up to rounding; kept for honesty
    out = np.hypot(np.linalg.norm(res, axis=(1, 2)), misfit) / scale
    return [DeltaFit(U[f] @ w[f], x[f].reshape(H, -1), float(out[f])) for f in range(F)]


class VariableProjection:
    """The variable-projection problems of a batch of fits: the residuals of fits ``idx`` at their logit
    parameters ``x (len(idx), H·(q+1))`` and the normal equations of Kaufman's Jacobian; ``R (F, K, n)``,
    ``m (F, K)`` in the fits' own bases."""

    def __init__(self, R, m, T1, scale, H, length=2):
        self.R, self.m, self.T1, self.scale, self.H, self.length = R, m, T1, scale, H, int(length)

    def parts(self, x, idx):
        """``(S, Q_D, w, residual)``: attention weights and their derivatives (f, 2, H, n), an orthonormal basis
        of the row space of ``D = S[:-1] − S[-1]`` (f, n, H−1), the value vectors (f, K, H) by least squares
        with ``Σ_h w_h = m`` and the residual ``R − w S`` (f, K, n)."""
        H, L = self.H, self.T1.shape[1]
        S, dS = mean_index(x.reshape(len(idx), H, L) @ self.T1.T, self.length)
        D = S[:, :-1] - S[:, -1:]
        m = self.m[idx]
        Y = self.R[idx] - m[:, :, None] * S[:, -1][:, None, :]
        Dt = D.transpose(0, 2, 1)
        A = np.zeros(Y.shape[:2] + (H - 1,))
        Qd = np.zeros(Dt.shape)
        if H > 1:
            Qd, Rd = np.linalg.qr(Dt)
            diag = np.abs(np.diagonal(Rd, axis1=1, axis2=2))
            good = diag.min(axis=1) > 1e-10 * diag.max(axis=1)
            if good.any():
                A[good] = np.linalg.solve(Rd[good], Qd[good].transpose(0, 2, 1) @ Y[good].transpose(0, 2, 1)
                                          ).transpose(0, 2, 1)
            for f in np.flatnonzero(~good):  # D (nearly) rank-deficient: the least-squares solution of least norm
                A[f] = np.linalg.lstsq(Dt[f], Y[f].T, rcond=None)[0].T
        w = np.concatenate([A, (m - A.sum(axis=2))[:, :, None]], axis=2)
        return np.stack([S, dS], axis=1), Qd, w, Y - A @ D

    def residual(self, res, idx):
        return res.reshape(len(idx), -1) / self.scale[idx, None]

    def normal_equations(self, S, Qd, w, r, idx):
        """``JᵀJ`` (f, p, p) and ``Jᵀr`` (f, p) of Kaufman's Jacobian ``J[(k, j), (h, l)] = −w_kh G_hjl / scale``
        (G: ``∂s_h/∂θ_h`` with the row space of D projected out), from its factors without forming J:
        ``JᵀJ = (wᵀw)_hh' (Σ_j G_hjl G_h'jl') / scale²`` and ``Jᵀr = −Σ_j (wᵀr)_hj G_hjl / scale``."""
        f, H, n, L = len(idx), self.H, S.shape[3], self.T1.shape[1]
        G = S[:, 1][:, :, :, None] * self.T1  # (f, H, n, L): ∂s_h/∂θ_h
        G -= Qd[:, None] @ (Qd.transpose(0, 2, 1)[:, None] @ G)  # project out the row space of D
        scale = self.scale[idx]
        Gn = G.transpose(0, 2, 1, 3).reshape(f, n, H * L)
        GG = (Gn.transpose(0, 2, 1) @ Gn).reshape(f, H, L, H, L)
        ww = w.transpose(0, 2, 1) @ w  # (f, H, H)
        A = (GG * ww[:, :, None, :, None]).reshape(f, H * L, H * L) / scale[:, None, None] ** 2
        wr = w.transpose(0, 2, 1) @ r.reshape(f, w.shape[1], n)  # (f, H, n)
        g = (wr[:, :, None, :] @ G)[:, :, 0, :].reshape(f, H * L) / -scale[:, None]
        return A, g


def rank_distance(Rs: np.ndarray, H: int) -> np.ndarray:
    """The relative distance of each residual block ``Rs (F, K, n)`` from rank H: ``Σ_h w_h s_hᵀ`` has rank H, so
    what lies beyond is the answers' rounding (a lower bound of any fit's misfit, which a correct fit exceeds only
    by its few degrees of freedom and a wrong minimum by far)."""
    sv = np.linalg.svd(Rs, compute_uv=False)
    return np.sqrt(np.sum(sv[:, H:] ** 2, axis=1) / np.maximum(np.sum(sv**2, axis=1), 1e-300))


def damped_steps(M: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """The steps ``M_f⁻¹ rhs_f`` of a batch of damped normal equations ``M (F, p, p)``, ``rhs (F, p)``; a fit whose
    matrix is singular (a head whose logits do not vary over the design) gets a zero step, which the caller rejects
    (more damping, then the fit stops and its misfit judges it), instead of the whole batch failing."""
    try:
        return np.linalg.solve(M, rhs[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        out = np.zeros_like(rhs)
        for i in range(len(M)):
            try:
                out[i] = np.linalg.solve(M[i], rhs[i])
            except np.linalg.LinAlgError:
                pass
        return out


def _levenberg_marquardt(fit: VariableProjection, x: np.ndarray, max_iter: int) -> np.ndarray:
    """Minimise every fit's ``‖residual‖`` (Levenberg–Marquardt with Nielsen's damping update, each fit with its
    own damping); a fit stops when a step no longer changes its misfit by a relative 1e-12 or after ``max_iter``
    iterations. ``x (F, p)``: the starting parameters, one row per fit. Each round every running
    fit tries one step (a rejected one again with more damping), all in one batch."""
    F = len(x)
    every = np.arange(F)
    S, Qd, w, res = fit.parts(x, every)
    r = fit.residual(res, every)
    cost = np.einsum("fi,fi->f", r, r)
    lam, nu = np.full(F, 1e-3), np.full(F, 2.0)
    active, iters = np.full(F, max_iter > 0), np.zeros(F, int)
    A, g = fit.normal_equations(S, Qd, w, r, every)
    eye = np.eye(A.shape[1])
    while active.any():
        f = np.flatnonzero(active)
        diag = np.maximum(np.diagonal(A[f], axis1=1, axis2=2), 1e-300)
        step = damped_steps(A[f] + lam[f, None, None] * (diag[:, :, None] * eye), -g[f])
        x_new = x[f] + step
        S_n, Qd_n, w_n, res_n = fit.parts(x_new, f)
        r_new = fit.residual(res_n, f)
        cost_new = np.einsum("fi,fi->f", r_new, r_new)
        ok = cost_new < cost[f]
        fr = f[~ok]  # rejected: more damping; done when the step changed the misfit by no more than a relative
        lam[fr] *= nu[fr]  # 1e-12 (as an accepted step that small would be), or when the damping passes 1e12
        nu[fr] *= 2.0
        active[fr[(lam[fr] > 1e12) | (cost_new[~ok] - cost[fr] <= 1e-12 * cost[fr])]] = False
        if ok.any():
            fo = f[ok]
            done = (cost[fo] - cost_new[ok] <= 1e-12 * cost[fo]) | (
                np.linalg.norm(step[ok], axis=1) <= 1e-14 * (1 + np.linalg.norm(x[fo], axis=1)))
            x[fo], r[fo], cost[fo] = x_new[ok], r_new[ok], cost_new[ok]
            S[fo], Qd[fo], w[fo] = S_n[ok], Qd_n[ok], w_n[ok]
            lam[fo], nu[fo] = np.maximum(lam[fo] / 3.0, 1e-12), 2.0
            iters[fo] += 1
            active[fo[done | (iters[fo] >= max_iter)]] = False
            go = fo[active[fo]]  # the next step of these starts from their new Jacobian
            if len(go):
                A[go], g[go] = fit.normal_equations(S[go], Qd[go], w[go], r[go], go)
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


def inverse_mean_index(s: np.ndarray, length: int) -> np.ndarray:
    """z with ``mean_index(z, length)[0] = s`` (s clipped into (0, length − 1)); bisection, to float64 rounding."""
    if length == 2:
        return np.log(s / (1 - s))
    lo, hi = np.full(s.shape, -60.0), np.full(s.shape, 60.0)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        above = mean_index(mid, length)[0] > s
        hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
    return 0.5 * (lo + hi)


def theta_from_values(w: np.ndarray, R: np.ndarray, T: np.ndarray, clip: float = 1e-6,
                      length: int = 2) -> np.ndarray:
    """Logit parameters from known value vectors: attention weights by least squares, logits (the inverse of the
    link :func:`mean_index`), affine fit weighted by the link's slope at each point (an error in an attention
    weight moves its logit by 1/slope: near saturation the inverted logits are noise, and an unweighted fit started
    the long float32 MiniLM differences of a wider design in another minimum, where weighted it starts every one
    in the right one)."""
    S = np.linalg.lstsq(w, R, rcond=None)[0]  # (H, n)
    top = length - 1
    S = np.clip(S, clip * top, top * (1 - clip))
    L = inverse_mean_index(S, length)
    T1 = np.concatenate([T, np.ones((T.shape[0], 1))], axis=1)
    slope = np.sqrt(mean_index(L, length)[1])  # (H, n)
    return np.stack([np.linalg.lstsq(T1 * slope[h][:, None], L[h] * slope[h], rcond=None)[0]
                     for h in range(len(L))])
