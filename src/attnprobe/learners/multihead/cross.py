"""The components of ``p_h = W_h y + u_h`` along the other heads' value vectors, by switching heads off.

Isolation (``isolation.py``) gives ``P_h W_h`` and ``P_h u_h``; what is missing is ``C_hᵀ p_h(y)``, the
coordinates along ``span{v_g : g ≠ h}`` (basis ``C_h``): H−1 numbers per head and last token.

A probe ``w ⊥ span{v_g}`` has *known* logits in every head: ``wᵀp_g = wᵀP_g p_g`` (the rest of ``p_g`` lies in
the span of the value vectors). Choose w with ``wᵀp_g = −L`` for every ``g ≠ h`` (L ≫ 40) and ``wᵀp_h = 0``:
every other head is switched off (weight ``σ(−L + …) = 0`` to rounding) whatever the probe adds to w, and
``F_y(w + a) = σ(aᵀp_h)·aᵀv_h`` for any moderate a, in particular ``a ∈ span{v_g : g ≠ h}``. Inverting the
sigmoid at ``a = γ m_h`` and at ``a = γ m_h + ζ c_k`` (``m_h ∝ P_h v_h``, so ``aᵀv_h ≠ 0``; ``c_k`` the
columns of C_h) and differencing gives ``c_kᵀp_h(y)`` exactly; the logit error of ``w`` cancels.
``p_h(y)`` is affine in y and only depends on y through the row space of ``W_h`` (rank r), so ``r + 1`` last
tokens per head suffice (needs d ≥ 2H); they share an offset orthogonal to that row space, which does not move
``p_h`` but keeps the other heads' logits away from 0 (heads in orthogonal subspaces vanish on each other's
rows): ``(H − 1)(r + 1)`` unknowns, ``H (r + 1)`` probes per head, plus a repeat with 4L
that certifies the switch-off. The r + 1 tokens are the vertices of a simplex *in* the row space
(``s R_k`` and ``−s Σ_k R_k/√r``), never the offset alone: there ``p_h = u_h``, which vanishes for a layer
without query bias (BERT's initial weights) and leaves head h no logit to invert.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import RecoveryError, SaturationError
from attnprobe.learners.multihead.isolation import other_heads_basis
from attnprobe.learners.head.sigmoid import RoundingError, invert_two_row

SATURATED_LOGIT = 40.0


def row_basis(WP: np.ndarray, free: int, eps: float) -> np.ndarray:
    """Orthonormal rows spanning the row space of W_h, from ``P_h W_h`` (``free`` = dim S_h = d − H + 1).

    When ``P_h W_h`` has full rank on S_h, W_h may have rank up to d and the identity is returned."""
    d = WP.shape[1]
    _, s, Vt = np.linalg.svd(WP)
    r = int(np.sum(s > 1e3 * eps * d * (s[0] if s.size else 0.0)))
    if r >= free:
        return np.eye(d)
    return Vt[:r]


def _offset(R: np.ndarray, size: float, rng) -> np.ndarray:
    """A random vector of norm ``size`` orthogonal to the rows of R (0 when they span R^d)."""
    d = R.shape[1]
    if R.shape[0] >= d:
        return np.zeros(d)
    t = rng.standard_normal(d)
    t -= R.T @ (R @ t)
    return size * t / np.linalg.norm(t)


def bias_token(t: np.ndarray, R: np.ndarray, size: float) -> np.ndarray:
    """The last token that, with ``t + size·R_k``, fits the bias: ``t − size·Σ_k R_k/√r`` (the offset t alone
    when the row space is empty)."""
    r = R.shape[0]
    return t if r == 0 else t - size * R.sum(0) / np.sqrt(r)


def bias_component(T: np.ndarray, r: int) -> np.ndarray:
    """``C_hᵀu_h`` from the measured ``T_k = a + M_k`` (k < r) and ``T_r = a − Σ_k M_k/√r``:
    ``a = (Σ_k T_k + √r T_r)/(r + √r)``."""
    if r == 0:
        return T[0]
    q = np.sqrt(r)
    return (T[:r].sum(0) + q * T[r]) / (r + q)


def _switch_off_probe(N, pP, h, L):
    """``w = N t`` (N: basis of span{v}^⊥) with ``wᵀpP_g = −L_g`` (g ≠ h) and ``wᵀpP_h = 0`` (least norm)."""
    A = pP @ N  # (H, d − H)
    rhs = -L.copy()
    rhs[h] = 0.0
    t, *_ = np.linalg.lstsq(A, rhs, rcond=None)
    return N @ t


def cross_components(oracle, v, v_sum, c, WP, uP, *, bias, rng, max_retries=6):
    """``C_hᵀW_h`` and ``C_hᵀu_h`` for every head (module docstring). Returns ``(W_cross, u_cross, info)``
    with ``W_cross[h] = C_h C_hᵀ W_h`` and ``u_cross[h] = C_h C_hᵀ u_h``."""
    H, d = v.shape
    noise = oracle.noise  # declared noise, relative to answers of the size of c + yᵀΣv (‖y‖ ~ 1)
    eps = max(oracle.eps, noise.rel_eps + (noise.tolerance + 3 * noise.sigma) / max(abs(c) + np.linalg.norm(v_sum),
                                                                                    1e-300))
    start = oracle.queries
    free = d - H + 1
    N = np.linalg.svd(v)[2][H:].T  # basis of span{v}^⊥, d × (d − H)
    if N.shape[1] < H:
        raise SaturationError(f"switching heads off needs d ≥ 2H (d = {d}, H = {H}): a probe ⊥ every v_g with H "
                              "prescribed logits")
    W_cross = np.zeros((H, d, d))
    u_cross = np.zeros((H, d))
    worst_repeat = 0.0
    for h in range(H):
        C = other_heads_basis(v, h)
        Ph = np.eye(d) - C @ C.T
        m = Ph @ v[h]
        m /= np.linalg.norm(m)
        R = row_basis(WP[h], free, eps)
        r = R.shape[0]
        nrm = np.linalg.norm(WP[h]) / np.sqrt(max(r, 1))
        s_y = max(np.linalg.norm(uP[h]), 1.0) / max(nrm, 1e-300)
        # last tokens t + s_y R_k (and t − s_y Σ_k R_k/√r with a bias): t ⊥ the row space of W_h leaves p_h(y)
        # as at y = s_y R_k, but gives the other heads logits to switch off even when their W_g vanish on it
        # (orthogonal heads). The bias token stays in the row space: at t alone p_h = u_h, which may be 0
        t = _offset(R, s_y, rng)
        Y = t + s_y * R
        if bias:
            Y = np.concatenate([Y, bias_token(t, R, s_y)[None]])
        nY = Y.shape[0]
        # known parts of every head's p_g(y): (nY, H, d)
        pP = np.einsum("gij,yj->ygi", WP, Y) + uP[None]
        pnorm = np.linalg.norm(pP, axis=2)  # (nY, H)
        grow = np.sqrt(d / free)
        T = np.full((nY, H - 1), np.nan)
        signs = np.where(C.T @ v[h] >= 0, 1.0, -1.0)
        gamma = 1.0 / np.maximum(np.maximum(np.abs(pP[:, h] @ m), pnorm[:, h] / np.sqrt(d)), 1e-300)  # (nY,)
        zeta = np.sqrt(free) / np.maximum(pnorm[:, h], 1e-300)
        todo = np.arange(nY)
        for attempt in range(max_retries):
            if todo.size == 0:
                break
            # probes of every pending last token in one batch per boost: (len(todo) * H, 2, d)
            A = gamma[todo, None, None] * m[None, None] + np.concatenate(
                [np.zeros((todo.size, 1, d)), zeta[todo, None, None] * (signs[:, None] * C.T)[None]], axis=1)
            L = SATURATED_LOGIT + 3 * (gamma[todo] + zeta[todo])[:, None] * pnorm[todo] * grow  # (n, H)
            y0 = c + Y[todo] @ v_sum
            res = []
            for boost in (1.0, 4.0):
                w = np.stack([_switch_off_probe(N, pP[i], h, boost * L[j]) for j, i in enumerate(todo)])
                Z = A + w[:, None, :]
                X = np.empty((todo.size, H, 2, d))
                X[:, :, 0] = Y[todo, None] + Z
                X[:, :, 1] = Y[todo, None]
                ans = oracle(X.reshape(-1, 2, d)).reshape(todo.size, H)
                lg = invert_two_row(ans, np.broadcast_to(y0[:, None], ans.shape), y0[:, None] + Z @ v[h],
                                    RoundingError(eps))
                res.append(lg)
            a, b = res
            sat = np.any(a.saturated, axis=1) | np.any(b.saturated, axis=1)
            da, db = a.values[:, 1:] - a.values[:, :1], b.values[:, 1:] - b.values[:, :1]
            with np.errstate(invalid="ignore"):
                rep = np.max(np.abs(da - db) / (1 + np.abs(db)), axis=1) if H > 1 else np.zeros(todo.size)
            good = ~sat & (rep <= 1e6 * eps)
            T[todo[good]] = signs * db[good] / zeta[todo[good], None]
            if np.any(good):
                worst_repeat = max(worst_repeat, float(np.max(rep[good])))
            bad = todo[~good]
            zeta[bad] /= np.where(sat[~good], 8.0, 4.0)  # smaller probes: unsaturated, and move the others less
            gamma[bad] /= np.where(a.saturated[~good, 0], 2.0, 1.0)
            todo = bad
        if todo.size:
            raise RecoveryError(f"could not switch the other heads off around head {h} ({todo.size} last tokens "
                                "saturated or unstable after retries): the answers are less precise than their "
                                f"declared {oracle.precision} (undeclared rounding or noise?), or the heads' logits "
                                "are too large for the probe scales")
        if bias:
            a = bias_component(T, r)
            u_cross[h] = C @ a
            M = (T[:r] - a) / s_y
        else:
            M = T / s_y
        W_cross[h] = C @ (M.T @ R)
    return W_cross, u_cross, {"queries": oracle.queries - start, "switch_off_repeat": worst_repeat}
