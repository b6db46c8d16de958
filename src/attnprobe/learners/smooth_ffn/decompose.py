"""The neurons' fixed factors ``w2_i ⊗ (U w1_i)`` from the derivative arrays (:mod:`.derivatives`).

* Width: the first derivatives at n points, flattened to a ``(K·C) × n`` matrix, are ``A diag(μ) S'ᵀ`` with
  ``A`` the m factors and ``S'_{ji} = σ'(a_i(x_j))``: rank m when ``K·C ≥ m`` and ``n ≥ m`` — the hidden width is
  the place where the singular values drop to the differences' noise.
* Factors (Jennrich's simultaneous diagonalisation): the second derivatives form a three-way array
  ``T[(k, c), e, j] = Σ_i A_(kc),i (V w1_i)_e σ''(a_i(x_j))`` whose first and third modes have full column rank;
  reduced to m × m slices ``S_e``, the eigenvectors of ``S_a S_b⁻¹`` (two random mixtures of the slices) are A's
  columns. Two neurons whose eigenvalues nearly meet are ill-separated in one mixture, so several mixtures are
  diagonalised and each neuron keeps the one where its eigenvalue stands farthest from the others.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import UnidentifiableError

#: singular values must drop by at least this factor at the hidden width
MIN_GAP = 100.0
#: random mixtures of the slices diagonalised (each neuron keeps its best-separated one)
MIXTURES = 4


def hidden_width(M: np.ndarray) -> tuple[int | None, float]:
    """The rank of ``M`` read at its largest drop of singular values: ``(m, drop)``; ``m`` is None when the
    values never drop by :data:`MIN_GAP` (the matrix is too small to show the width, or the answers too noisy)."""
    s = np.linalg.svd(M, compute_uv=False)
    s = s[s > 0]
    if s.size < 2:
        return None, 1.0
    ratios = s[:-1] / s[1:]
    k = int(np.argmax(ratios))
    drop = float(ratios[k])
    return (k + 1 if drop >= MIN_GAP else None), drop


def factors(T: np.ndarray, m: int, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """A's m unit columns (``(K·C) × m``) from the second-derivative array ``T`` of shape ``(K·C, E, n)``."""
    KC, E, n = T.shape
    if E < 2:
        raise UnidentifiableError("the factors need at least two second directions")
    M1 = T.reshape(KC, E * n)
    P = _top_left(M1, m)
    Q = _top_left(np.transpose(T, (2, 1, 0)).reshape(n, E * KC), m)
    S = np.einsum("ai,aen,nj->eij", P, T, Q)
    best, sep_best = None, None
    for t in range(MIXTURES):
        a, b = rng.standard_normal(E), rng.standard_normal(E)
        Sa, Sb = np.tensordot(a, S, 1), np.tensordot(b, S, 1)
        try:
            lam, vec = np.linalg.eig(np.linalg.solve(Sb.T, Sa.T).T)
        except np.linalg.LinAlgError:
            continue
        vec = np.real(vec)
        vec /= np.linalg.norm(vec, axis=0)
        lam = np.real(lam)
        sep = _separation(lam)
        if best is None:
            best, sep_best = vec, sep
            continue
        match = np.argmax(np.abs(best.T @ vec), axis=1)  # this mixture's vector of each kept neuron
        better = sep[match] > sep_best
        best[:, better] = vec[:, match[better]]
        sep_best = np.where(better, sep[match], sep_best)
    if best is None:
        raise UnidentifiableError("the second-derivative slices are singular: no mixture could be diagonalised")
    A = P @ best
    A /= np.linalg.norm(A, axis=0)
    return A, {"worst_separation": float(sep_best.min()), "median_separation": float(np.median(sep_best))}


def _top_left(M: np.ndarray, m: int) -> np.ndarray:
    """The top-m left singular vectors of M."""
    U, _, _ = np.linalg.svd(M, full_matrices=False)
    return U[:, :m]


def _separation(lam: np.ndarray) -> np.ndarray:
    """Distance of each eigenvalue to its nearest other, relative to the eigenvalues' spread."""
    order = np.argsort(lam)
    s = lam[order]
    gaps = np.diff(s)
    near = np.minimum(np.r_[np.inf, gaps], np.r_[gaps, np.inf])
    out = np.empty_like(lam)
    out[order] = near / max(float(np.median(np.abs(lam - np.median(lam)))), 1e-300)
    return out


def split_factors(A: np.ndarray, K: int, C: int) -> tuple[np.ndarray, np.ndarray]:
    """Each column of A as ``w2_i ⊗ z_i`` (its best rank-one fit): unit output directions ``(K, m)`` and the
    direction-mode vectors ``z_i ∝ U w1_i`` ``(C, m)``."""
    m = A.shape[1]
    R = A.T.reshape(m, K, C)
    u, s, vt = np.linalg.svd(R, full_matrices=False)
    return u[:, :, 0].T, (vt[:, 0, :] * s[:, :1]).T
