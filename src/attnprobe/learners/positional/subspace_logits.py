"""RoPE heads' query and key maps once their row spaces are known (docs/positional.md, "The logit start at
LLaMA-3-8B's head shape: row spaces, then linear"): linear per offset, then the rotation's gauge.

With ``U_h`` (``d_h × d``, orthonormal rows) spanning ``W_Q,h``'s row space and ``V_g`` spanning ``W_K,g``'s, an
absolute logit at offset ``δ`` is ``ℓ = (U_h x_q)ᵀ M_h(δ) (V_g x_k)`` with ``M_h(δ) = Ãᵀ R(δ) A``, ``Ã = W_Q,h U_hᵀ``,
``A = W_K,g V_gᵀ``: LINEAR in ``M_h(δ)`` (``d_h²`` unknowns; :func:`~.wide_logits.reduced_logit_matrix`), whatever
the frequencies. ``M(δ₀)⁻¹ M(δ) = A⁻¹ R(δ − δ₀) A`` gives ``A`` (:func:`cluster_gauge`), and ``Ã`` is then a
least squares over every offset (:func:`query_side`). Pairs whose frequencies no measured offset tells apart
(``δ_max·Δθ`` below ``tol``: LLaMA-3's slow pairs, base 5e5) may be taken together, their rows an orthonormal basis
of the cluster's common solutions — measured worse than each pair on its own (the default), docs.
"""

from __future__ import annotations

import numpy as np

from attnprobe.learners.positional.wide_logits import reduced_logit_matrix
from attnprobe.models.positional import rotation_matrix, rotation_pairs

#: offsets whose reduced matrix is solved (key − query; not 0: a token against itself, ``u = U x`` and ``v = V x``
#: correlated, left the matrix 2.8e-2 off where the others were 1.1e-4, d = 256 float32 rows), and the frequency
#: separation (radians over the largest
#: offset) below which neighbouring pairs are taken together (none by default: clusters measured worse, docs)
OFFSETS, CLUSTER_TOL = (-1, -2, -3, -4, -6, -8, -12, -16, -24, -32), 0.0


def offset_matrices(data: dict, U: np.ndarray, V: np.ndarray, offsets=OFFSETS, steps: int = 60) -> np.ndarray:
    """``M (H, len(offsets), d_h, d_h)``: each head's reduced logit matrix at each offset from the samples of
    :func:`~.absolute_logits.absolute_logit_samples` (``U (H, d_h, d)``, ``V (G, d_h, d)`` orthonormal rows)."""
    H, dh, _ = U.shape
    per = H // V.shape[0]
    X = data["tokens"]
    out = np.empty((H, len(offsets), dh, dh))
    for h in range(H):
        uq, vk = X @ U[h].T, X @ V[h // per].T
        for o, delta in enumerate(offsets):
            i = np.flatnonzero((data["head"] == h) & (data["off"] == delta) & (data["w"] > 0))
            out[h, o] = reduced_logit_matrix(uq[data["qid"][i]], vk[data["kid"][i]], data["ell"][i],
                                             np.sqrt(data["w"][i]), steps=steps)
    return out


def clusters(theta: np.ndarray, span: float, tol: float = CLUSTER_TOL) -> list:
    """Runs of neighbouring pairs (indices into ``theta``, in ``theta``'s order) whose frequencies differ by less
    than ``tol/span`` from the next."""
    out = [[0]]
    for k in range(1, len(theta)):
        if abs(theta[k] - theta[k - 1]) * span < tol:
            out[-1].append(k)
        else:
            out.append([k])
    return out


def cluster_gauge(P: list, deltas: list, theta: np.ndarray, tol: float = CLUSTER_TOL,
                  layout: str = "half") -> np.ndarray:
    """``A (d_h, d_h)`` with ``A P_j ≈ R(δ_j) A`` (``P_j = M(δ₀)⁻¹ M(δ₀ + δ_j)``): per pair the two-dimensional
    least-squares null space of its rows' equations (its two right singular vectors, orthonormal rows); per cluster
    of ``c`` pairs (:func:`clusters`) the equations at the cluster's mean frequency, whose ``2c`` smallest singular
    vectors' rows span the cluster's rows (an orthonormal basis of them)."""
    dh = P[0].shape[0]
    a, b = rotation_pairs(dh, layout)
    A = np.zeros((dh, dh))
    eye = np.eye(dh)
    for group in clusters(theta, max(abs(x) for x in deltas), tol):
        mean = float(np.mean(theta[group]))
        rows = [np.kron(Pj.T, np.eye(2)) - np.kron(eye, rotation_matrix(dj * mean, np.ones(1), 2))
                for Pj, dj in zip(P, deltas)]
        null = np.linalg.svd(np.concatenate(rows), full_matrices=False)[2][-2 * len(group):]
        stacked = np.concatenate([v.reshape(dh, 2).T for v in null])  # (4c, d_h): each a pair's two rows
        basis = np.linalg.svd(stacked, full_matrices=False)[2][:2 * len(group)]
        if len(group) == 1:
            basis = null[-1].reshape(dh, 2).T
        for n, k in enumerate(group):
            A[[a[k], b[k]]] = basis[2 * n:2 * n + 2]
    return A


def query_side(M: np.ndarray, A: np.ndarray, deltas, theta: np.ndarray) -> np.ndarray:
    """``Ã`` minimising ``Σ_δ ‖Ãᵀ R(δ) A − M(δ)‖²`` (``M (len(deltas), d_h, d_h)``)."""
    dh = A.shape[0]
    RA = np.stack([rotation_matrix(float(dl), theta, dh) @ A for dl in deltas])
    lhs = np.einsum("oab,ocb->ac", RA, RA)
    rhs = np.einsum("oib,oab->ia", M, RA)
    return np.linalg.solve(lhs, rhs.T)  # rhs = Ãᵀ lhs → Ã = lhs⁻¹ rhsᵀ (lhs symmetric)


def key_side(M: list, At: list, deltas, theta: np.ndarray) -> np.ndarray:
    """``A`` minimising ``Σ_h Σ_δ ‖Ã_hᵀ R(δ) A − M_h(δ)‖²`` over a group's heads (``M`` and ``At`` per head)."""
    dh = At[0].shape[0]
    R = [rotation_matrix(float(dl), theta, dh) for dl in deltas]
    lhs = sum(Ro.T @ Ah @ Ah.T @ Ro for Mh, Ah in zip(M, At) for Ro in R)
    rhs = sum(Ro.T @ Ah @ Mh[o] for Mh, Ah in zip(M, At) for o, Ro in enumerate(R))
    return np.linalg.solve(lhs, rhs)


def maps_from_subspaces(M: np.ndarray, U: np.ndarray, V: np.ndarray, theta: np.ndarray, offsets=OFFSETS,
                        tol: float = CLUSTER_TOL, refine: int = 0):
    """``W_Q (H, d_h, d)`` (the score's scale in it) and ``W_K (G, d_h, d)`` from the reduced matrices ``M``
    (:func:`offset_matrices` at ``offsets``): ``A`` per group from every head's ``M(δ₀)⁻¹ M(δ) = A⁻¹ R(δ − δ₀) A``
    (``δ₀ = offsets[0]``), then
    each head's ``Ã`` (module docstring); ``refine``: that many alternating rounds of :func:`key_side` and
    :func:`query_side` after it (every pair at its own frequency; with offsets to −64 and reduced matrices within
    1e-4 they bring d = 256's start from 1.8e-3 to 1.05e-3 at N = 256, docs)."""
    H = M.shape[0]
    G = V.shape[0]
    per = H // G
    deltas = [o - offsets[0] for o in offsets[1:]]
    Wq, Wk = np.empty_like(U), np.empty_like(V)
    for g in range(G):
        P = [np.linalg.solve(M[h, 0], M[h, o]) for h in range(g * per, (g + 1) * per) for o in range(1, len(offsets))]
        A = cluster_gauge(P, deltas * per, theta, tol)
        heads = range(g * per, (g + 1) * per)
        At = [query_side(M[h], A, offsets, theta) for h in heads]
        for _ in range(refine):
            A = key_side([M[h] for h in heads], At, offsets, theta)
            At = [query_side(M[h], A, offsets, theta) for h in heads]
        Wk[g] = A @ V[g]
        for h, Ah in zip(heads, At):
            Wq[h] = Ah @ U[h]
    return Wq, Wk
