"""The logit maps' two ``d_h² × d_h²`` solves for wide heads (LLaMA-3's ``d_h = 128``: 16,384 unknowns per head and
offset), without forming them (docs/positional.md, "The start at LLaMA-3-8B's size"):

* the reduced logit matrix ``M(δ) = Uᵀ B_h(δ) V`` from ``ℓ_n ≈ q_nᵀ M k_n`` (:func:`~.coarse.logit_maps` (b)):
  conjugate gradients on the weighted normal equations, preconditioned by their Kronecker approximation
  ``(Σ w² q qᵀ) ⊗ (Σ w² k kᵀ) / Σ w²`` (exact in expectation for independent queries and keys); each product costs
  two ``(n, d_h) × (d_h, d_h)`` multiplications, where the dense design holds ``n·d_h²`` numbers (18.8 GB at
  ``d = 256``);
* the rotation's gauge ``A_K M(δ₀)⁻¹ M(δ) = R(δ − δ₀) A_K`` (:func:`~.coarse.logit_maps` (c)): ``R`` rotates pairs
  of coordinates, so the equations split by the pair's two rows of ``A_K`` — a ``2d_h``-unknown null space per
  pair (its scaled rotation: two dimensions) instead of one ``d_h² × d_h²`` system.
"""

from __future__ import annotations

import numpy as np

from attnprobe.learners.core.conjugate_gradients import conjugate_gradients
from attnprobe.models.positional import rotation_pairs

#: dense design matrices above this many bytes take the solves here (LLaMA d = 128, 8/2: 50 MB, dense)
WIDE_DESIGN_BYTES = 2**30
#: conjugate-gradient steps and relative residual of the reduced logit matrix
CG_STEPS, CG_TOL = 60, 1e-8


def wide(count: int, dh: int) -> bool:
    """Whether a logit stage of ``count`` sequences on heads of width ``dh`` takes these solves."""
    return 8 * count * dh * dh > WIDE_DESIGN_BYTES


def reduced_logit_matrix(zq: np.ndarray, kx: np.ndarray, y: np.ndarray, w: np.ndarray,
                         steps: int = CG_STEPS, tol: float = CG_TOL) -> np.ndarray:
    """``M (p, r)`` minimising ``Σ_n w_n² (zq_nᵀ M kx_n − y_n)²`` (``zq (n, p)``, ``kx (n, r)``): preconditioned
    conjugate gradients on the normal equations, started at the Kronecker approximation's solution."""
    w2 = w * w
    Sq = (zq * w2[:, None]).T @ zq
    Sk = (kx * w2[:, None]).T @ kx
    Sq /= w2.sum()
    Sq_inv, Sk_inv = np.linalg.pinv(Sq, hermitian=True), np.linalg.pinv(Sk, hermitian=True)

    def normal(M):
        return zq.T @ ((w2 * np.einsum("np,np->n", zq @ M, kx))[:, None] * kx)

    def precondition(R):
        return Sq_inv @ R @ Sk_inv

    b = zq.T @ ((w2 * y)[:, None] * kx)
    return conjugate_gradients(normal, b, steps, x=precondition(b), precondition=precondition, rtol=tol)


def rotation_gauge(P: list, R: list, rng: np.random.Generator, layout: str = "half") -> np.ndarray:
    """An invertible ``A (d_h, d_h)`` with ``A P_j = R_j A`` for every ``j`` (``P_j = M(δ₀)⁻¹ M(δ_j)``,
    ``R_j = R(δ_j − δ₀)``): per rotated pair, the least-squares null space (two dimensions: the pair's scaled
    rotation) of its two rows' equations, a random member of it."""
    dh = P[0].shape[0]
    a, b = rotation_pairs(dh, layout)
    A = np.zeros((dh, dh))
    eye = np.eye(dh)
    for i, j in zip(a, b):
        rows = [np.kron(Pj.T, np.eye(2)) - np.kron(eye, Rj[np.ix_([i, j], [i, j])]) for Pj, Rj in zip(P, R)]
        null = np.linalg.svd(np.concatenate(rows), full_matrices=False)[2][-2:]
        A[[i, j]] = (rng.standard_normal(2) @ null).reshape(dh, 2).T  # vec column-major of the (2, d_h) rows
    return A
