"""The rank-one factors ``w ⊗ α`` of the post-norm neurons stage's probe span, every one (docs/block.md, "Post-norm
blocks", stage ``neurons``: "The factors' coverage").

The span ``S`` (orthonormal basis B, dC × k, rows ``(x, c)`` of a d × C matrix flattened) holds the m factors
``w̃_i ⊗ Uᵀa_i`` and the linear part. ``w ⊗ α`` (unit α) lies in S exactly where the largest eigenvalue of
``K(α) = Σ α_c α_e B_c B_eᵀ`` is 1 (``‖M(α)ᵀw‖ ≤ ‖w αᵀ‖`` with ``M(α) = Σ α_c B_c``). Newton in α on that
eigenvalue lands unevenly: crowded (nearly parallel) α_i attract few starts. **Deflation by the pencil**: with
the factors found spanning F ⊂ S and ``S' = S ⊖ F`` (basis B', ``K'(α)`` its K), the pencil
``(K'(α), |α|² I − K(α) + K'(α))`` — the second is ``‖Q_F(w αᵀ)‖²``, ``K'`` is ``‖P_{S'}(w αᵀ)‖²`` — has its largest
eigenvalue ``ν(α) ≤ 1`` with equality exactly at the factors **not** found: at a found factor both forms vanish on
its w (the quotient stays below 1 around it), at an unfound one ``w αᵀ ∈ S`` and its part off F is in S'. So each
batch of starts sees only the factors still missing. Newton on α's sphere with the exact Hessian of the pencil's
eigenvalue (``ν`` is homogeneous of degree 0: the Riemannian Hessian is the projected one).

:func:`probe_factors` returns every factor it finds; :func:`factors_complete` checks that a found set is the whole
span: m factors and the linear part ``P diag(w) U`` (one null vector) spanning S, each within the precision.
"""

from __future__ import annotations

import numpy as np

#: Newton steps per start, the eigenvalue's distance from 1 that accepts a factor, the farthest-from-found pool
ITERATIONS, CONVERGED, POOL = 16, 1e-13, 2048
#: the cosine (of both α and w) that makes two factors the same
SAME = 1 - 1e-8


def probe_gram(B: np.ndarray, d: int, C: int) -> np.ndarray:
    """``G[c, e] = B_c B_eᵀ`` (C × C × d × d) for the basis B (dC × k)."""
    B3 = B.reshape(d, C, -1)
    G = np.empty((C, C, d, d))
    for c in range(C):
        for e in range(c, C):
            G[c, e] = B3[:, c, :] @ B3[:, e, :].T
            G[e, c] = G[c, e].T
    return G


def _form(G: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``Σ α_c α_e G[c, e]`` for a batch of α (b × C): b × d × d."""
    C, d = G.shape[0], G.shape[2]
    return (np.einsum("bc,be->bce", a, a).reshape(len(a), C * C) @ G.reshape(C * C, d * d)).reshape(-1, d, d)


def pencil_top(G: np.ndarray, Gd: np.ndarray | None, a: np.ndarray):
    """``(ν, V, lam)``: the pencil ``(K', |α|²I − K + K')`` at each α of the batch (K from G, K' from Gd; ``Gd``
    None: no factor found, the pencil is ``(K, |α|²I)``), eigenvalues ascending and B-orthonormal eigenvectors
    (b × d × d); rows whose second form is not positive definite get ν = −inf."""
    K = _form(G, a)
    n2 = np.sum(a * a, axis=1)[:, None, None]
    d = K.shape[1]
    if Gd is None:
        lam, V = np.linalg.eigh(K / n2)
        return lam[:, -1], V / np.sqrt(n2), lam
    Kd = _form(Gd, a)
    D = n2 * np.eye(d) - K + Kd
    lam = np.full((len(a), d), -np.inf)
    V = np.zeros_like(K)
    for b in range(len(a)):
        try:
            L = np.linalg.cholesky(D[b])
        except np.linalg.LinAlgError:
            continue
        Li = np.linalg.inv(L)
        lam[b], Vt = np.linalg.eigh(Li @ Kd[b] @ Li.T)
        V[b] = Li.T @ Vt
    return lam[:, -1], V, lam


def newton_step(G: np.ndarray, Gd: np.ndarray | None, a: np.ndarray, V: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """One Newton step on α's sphere for the pencil's largest eigenvalue (exact Hessian: first- and second-order
    perturbation of a symmetric pencil), a gradient step where the Hessian is not negative definite; steps capped at
    0.3. ``a`` unit (b × C); returns the new unit α's."""
    C = a.shape[1]
    v1, l1 = V[:, :, -1], lam[:, -1]
    Gp = G if Gd is None else Gd
    P1 = np.einsum("cexy,by->bcex", Gp, v1, optimize=True)                   # K'_{ce} v
    P2 = np.einsum("ceyx,by->bcex", Gp, v1, optimize=True)                   # K'_{ce}ᵀ v
    Av = np.einsum("be,bcex->bcx", a, P1 + P2)                                 # A_c v
    Avv = 2 * np.einsum("bcex,bx->bce", P1, v1)                               # vᵀ A_ce v
    if Gd is None:
        Dv = 2 * a[:, :, None] * v1[:, None, :]                                # D = |α|² I
        Dvv = 2 * np.eye(C)[None] * np.sum(v1 * v1, axis=1)[:, None, None]
    else:
        Q1 = np.einsum("cexy,by->bcex", G, v1, optimize=True) - P1            # H_{ce} v, H = G − G'
        Q2 = np.einsum("ceyx,by->bcex", G, v1, optimize=True) - P2
        Dv = 2 * a[:, :, None] * v1[:, None, :] - np.einsum("be,bcex->bcx", a, Q1 + Q2)
        Dvv = 2 * np.eye(C)[None] * np.sum(v1 * v1, axis=1)[:, None, None] - 2 * np.einsum("bcex,bx->bce", Q1, v1)
    R = Av - l1[:, None, None] * Dv                                           # (A_c − ν D_c) v
    g = np.einsum("bcx,bx->bc", R, v1)
    dD = np.einsum("bcx,bx->bc", Dv, v1)
    W = np.einsum("bcx,bxl->bcl", R, V[:, :, :-1]) / np.sqrt(np.maximum(l1[:, None, None] - lam[:, None, :-1],
                                                                         1e-300))
    H = (Avv - l1[:, None, None] * Dvv - g[:, :, None] * dD[:, None, :] - dD[:, :, None] * g[:, None, :]
         + 2 * np.einsum("bcl,bel->bce", W, W))
    out = a.copy()
    for b in range(len(a)):
        Pt = np.eye(C) - np.outer(a[b], a[b])
        gt = Pt @ g[b]
        ev, EV = np.linalg.eigh(Pt @ H[b] @ Pt)
        keep = np.abs(EV.T @ a[b]) < 0.5
        if np.all(ev[keep] < 0):
            step = -EV[:, keep] @ ((EV[:, keep].T @ gt) / ev[keep])
        else:
            step = 0.1 * gt / max(float(np.linalg.norm(gt)), 1e-300)
        nrm = float(np.linalg.norm(step))
        out[b] = a[b] + (step * 0.3 / nrm if nrm > 0.3 else step)
        out[b] /= np.linalg.norm(out[b])
    return out


def deflated_gram(B: np.ndarray, W: np.ndarray, A: np.ndarray, G: np.ndarray) -> np.ndarray | None:
    """``G'`` of ``S' = S ⊖ span{w_i ⊗ α_i}`` (None when nothing is found): from S' 's basis, or as ``G`` less the
    found span's Gram where that is the smaller (fewer than half found)."""
    if not len(W):
        return None
    d, C = W.shape[1], A.shape[1]
    F = np.einsum("bx,bc->xcb", W, A).reshape(d * C, -1)
    if 2 * len(W) < B.shape[1]:
        return G - probe_gram(np.linalg.qr(F)[0], d, C)
    Ub = np.linalg.svd(B.T @ F, full_matrices=True)[0]
    return probe_gram(B @ Ub[:, len(W):], d, C)


def probe_factors(B: np.ndarray, d: int, C: int, m: int, rng, starts: int, *, batch: int = 16, found=None,
                  deflate: bool = True, log=None, converged: float = CONVERGED):
    """``(W, A)``: unit factors ``w_i ⊗ α_i`` of the span B (rows, n ≤ m of each), from at most ``starts`` Newton
    starts in batches, each start the candidate (of :data:`POOL` random unit α) farthest from the α's found; with
    ``deflate`` each batch runs on the pencil of the span off the factors found so far (module docstring), without
    it on ``K(α)`` (the plain search). ``found``: ``(W, A)`` to resume from; ``converged``: the ``1 − ν`` that
    accepts a factor (a span read to δ holds its factors only to ~δ: ``1 − ν ≈ δ²``)."""
    W, A = (np.zeros((0, d)), np.zeros((0, C))) if found is None else (np.asarray(found[0]), np.asarray(found[1]))
    G = probe_gram(B, d, C)
    for lo in range(0, starts, batch):
        if len(W) >= m:
            break
        Gd = deflated_gram(B, W, A, G) if deflate else None
        cand = rng.standard_normal((POOL, C))
        cand /= np.linalg.norm(cand, axis=1, keepdims=True)
        if len(A):
            cand = cand[np.argsort(np.max(np.abs(cand @ A.T), axis=1))]
        a = cand[:batch]
        for _ in range(ITERATIONS):
            nu, V, lam = pencil_top(G, Gd, a)
            ok = np.isfinite(nu)
            if np.all(1 - nu[ok] < converged):
                break
            a[ok] = newton_step(G, Gd, a[ok], V[ok], lam[ok])
        nu, V, lam = pencil_top(G, Gd, a)
        ok = 1 - nu < converged
        if ok.any():  # one more step where converged: quadratic, so the factor ends at the rounding
            a[ok] = newton_step(G, Gd, a[ok], V[ok], lam[ok])
            nu, V, lam = pencil_top(G, Gd, a)
        W, A = _accept(W, A, a, V[:, :, -1], nu, converged)
        if log is not None:
            log(lo + batch, W, A)
    return W, A


def _accept(W, A, a, v, nu, converged):
    """The converged starts (``ν`` within ``converged`` of 1: the factor within ~√converged of the span, checked
    at the end by :func:`factors_complete`) that are new, unit, appended to ``(W, A)``."""
    for b in np.flatnonzero(1 - nu < converged):
        w = v[b] / np.linalg.norm(v[b])
        if len(W) and np.any((np.abs(A @ a[b]) > SAME) & (np.abs(W @ w) > SAME)):
            continue
        W, A = np.vstack([W, w]), np.vstack([A, a[b]])
    return W, A


def polish_factors(B: np.ndarray, d: int, C: int, A: np.ndarray, *, steps: int = 2, chunk: int = 64):
    """``(W, A)``: factors found elsewhere (their α's, e.g. the plain search's at a looser tolerance) taken to the
    rounding by ``steps`` Newton steps on ``K(α)`` each (quadratic: every factor is a maximum), w from ``K(α)``."""
    G = probe_gram(B, d, C)
    A = np.array(A, dtype=float)
    W = np.empty((len(A), d))
    for lo in range(0, len(A), chunk):
        a = A[lo:lo + chunk]
        for _ in range(steps):
            _, V, lam = pencil_top(G, None, a)
            a = newton_step(G, None, a, V, lam)
        _, V, _ = pencil_top(G, None, a)
        A[lo:lo + chunk], W[lo:lo + chunk] = a, V[:, :, -1] / np.linalg.norm(V[:, :, -1], axis=1, keepdims=True)
    return W, A


def linear_part(B: np.ndarray, U: np.ndarray):
    """``(P diag(w) U, residual)``: the span's element of that form (n1's weight w up to scale, the smallest right
    singular vector of the diagonal elements' part off the span) and its relative residual."""
    d, C = U.shape
    P = np.eye(d) - 1.0 / d
    Gm = np.einsum("ki,ic->kci", P, U).reshape(d * C, d)                   # columns vec(P e_i e_iᵀ U)
    _, s, Vt = np.linalg.svd(Gm - B @ (B.T @ Gm), full_matrices=False)
    return (P * Vt[-1]) @ U, float(s[-1] / s[0])


def factors_complete(B: np.ndarray, W: np.ndarray, A: np.ndarray, U: np.ndarray, tol: float = 1e-8):
    """``(complete, detail)``: whether the m = k − 1 factors found and the linear part ``P diag(w) U`` (the span's
    element of that form, one null vector) make the whole span: each factor within ``tol`` of the span, the linear
    part's residual within ``tol``, and together of full rank k (smallest singular value of the unit columns above
    ``tol``). ``detail`` names the three numbers."""
    d, C = U.shape
    k = B.shape[1]
    F = np.einsum("bx,bc->xcb", W, A).reshape(d * C, -1)
    off = float(np.max(np.linalg.norm(F - B @ (B.T @ F), axis=0))) if len(W) else 0.0
    lin, lin_res = linear_part(B, U)
    cols = np.hstack([F, lin.reshape(-1, 1) / np.linalg.norm(lin)])
    smallest = float(np.linalg.svd(B.T @ cols, compute_uv=False)[-1]) if cols.shape[1] == k else 0.0
    ok = len(W) == k - 1 and off < tol and lin_res < tol and smallest > tol
    return ok, {"factors": len(W), "off_span": off, "linear_residual": lin_res, "smallest_singular": smallest}
