"""Heads that share keys and values (grouped-query / multi-query attention), read from a recovered layer.

In a GQA layer, query heads h of one group share the key and value projections ``K_g``, ``W_V,g``: every
``W_h = K_gᵀQ_h/√d_h`` has its columns in the row space of ``K_g`` and every ``V_h = W_O,h W_V,g`` its rows in
the row space of ``W_V,g``. So heads whose ``W_h`` column spaces and ``V_h`` row spaces agree form a group, and
the group is stored once: a shared key basis ``E_g`` (d × r) and value basis ``F_g`` (r × d), and per head
``W_h = E_g A_h`` and ``V_h = B_h F_g``.
"""

from __future__ import annotations

import numpy as np

from attnprobe.learners.multihead.vector_logits import gap_rank


def _basis(A: np.ndarray, rows: bool) -> np.ndarray:
    """An orthonormal basis (columns) of the column space of ``A`` (its row space when ``rows``), its rank at the
    largest gap of the singular values."""
    U, sv, Vt = np.linalg.svd(A, full_matrices=False)
    r = gap_rank(sv, min(A.shape))
    return Vt[:r].T if rows else U[:, :r]


def _same_space(P: np.ndarray, Q: np.ndarray, tol: float) -> bool:
    """Whether two orthonormal bases span the same subspace (the sine of the largest principal angle ≤ tol)."""
    if P.shape[1] != Q.shape[1] or P.shape[1] >= P.shape[0]:  # (the whole space is shared by any two heads)
        return False
    return float(np.linalg.norm(P - Q @ (Q.T @ P), 2)) <= tol


def head_groups(W: np.ndarray, V: np.ndarray, tol: float = 1e-4) -> list[list[int]]:
    """Groups of heads (lists of head indices, in order) whose ``W_h`` column spaces and ``V_h`` row spaces agree
    to ``tol`` (a sine of principal angles): heads sharing keys and values. Every head is in one group."""
    keys = [_basis(Wh, rows=False) for Wh in W]
    values = [_basis(Vh, rows=True) for Vh in V]
    groups: list[list[int]] = []
    for h in range(len(W)):
        for g in groups:
            if _same_space(keys[g[0]], keys[h], tol) and _same_space(values[g[0]], values[h], tol):
                g.append(h)
                break
        else:
            groups.append([h])
    return groups


def grouped_numbers(W: np.ndarray, V: np.ndarray, groups: list[list[int]]) -> dict:
    """Numbers stored by the dense layout (``W (H, d, d)``, ``V (H, K, d)``) against the grouped one (per group a
    key basis d × r and a value basis r × d; per head ``A_h`` r × d and ``B_h`` K × r; biases not counted)."""
    H, d, _ = W.shape
    K = V.shape[1]
    grouped = 0
    for g in groups:
        rk = _basis(W[g[0]], rows=False).shape[1]
        rv = _basis(V[g[0]], rows=True).shape[1]
        grouped += d * rk + rv * d + len(g) * (rk * d + K * rv)
    return {"dense": int(H * (d * d + K * d)), "grouped": int(grouped)}
