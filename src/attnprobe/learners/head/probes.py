"""Probe matrices for the column-wise solve of Thm 4.1: the paper's basis and Gaussian probes, and
well-conditioned orthogonal probes whose inner product with v is the same for every probe."""

from __future__ import annotations

import numpy as np
import scipy.linalg

from attnprobe.models.attention import AttentionHead


def first_order_queries(d: int, bias: bool = True) -> int:
    """Queries of Thm 4.1's first-order phases: the values ``[e_i]`` (d) and, with biases, ``[0]`` for ``c`` and
    the query-bias pass ``[a; 0]`` (d + 1 more): ``2d + 1``, or ``d`` for the paper's model."""
    return 2 * d + 1 if bias else d


def paper_bound(d: int) -> int:
    """Thm 4.1's query count for the paper's bias-free model: ``d + d²`` (its number of unknowns)."""
    return AttentionHead.unknowns(d, bias=False)


def random_orthogonal(d: int, rng: np.random.Generator) -> np.ndarray:
    """Haar-random orthogonal d×d matrix (QR of a Gaussian matrix with the sign fix). scipy's QR calls the same
    LAPACK routines as ``numpy.linalg.qr`` (the same numbers, bit for bit) without numpy's copies: 0.6× the time
    at d = 384."""
    Z = rng.standard_normal((d, d))
    Q, R = scipy.linalg.qr(Z, mode="economic", overwrite_a=True, check_finite=False)
    # C order, as numpy's QR gives it: later products take other BLAS paths (other last bits) on Fortran order
    return np.multiply(Q, np.sign(np.where(np.diag(R) == 0, 1.0, np.diag(R))), order="C")


def householder_vector(x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """Unit w with ``(I − 2wwᵀ) x = y`` for unit vectors x, y (None if they coincide: the identity)."""
    w = x - y
    n = np.linalg.norm(w)
    return w / n if n > 1e-15 else None


def equal_projection_orthogonal(v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random orthogonal Q whose rows all have the same |q_ℓᵀv| = ‖v‖/√d.

    Thm 4.1 needs ``u_ℓᵀv ≠ 0`` for each probe; making every ``|u_ℓᵀv|`` equal to its largest possible
    common value keeps every sigmoid inversion equally well conditioned (no probe is nearly orthogonal to v).
    ``Q = H2 R H1`` (R Haar-random, H1 v̂ = h, H2 R h = h) is formed by two rank-one updates of R, O(d²).
    """
    d = v.shape[0]
    h = np.ones(d) / np.sqrt(d)
    w1 = householder_vector(v / np.linalg.norm(v), h)  # H1 v̂ = h
    Q = random_orthogonal(d, rng)
    w2 = householder_vector(Q @ h, h)  # H2 R h = h: a random rotation that keeps h
    if w1 is not None:  # R H1 = R − 2 (R w1) w1ᵀ
        Q -= np.outer(2.0 * (Q @ w1), w1)
    if w2 is not None:  # H2 X = X − 2 w2 (w2ᵀ X)
        Q -= np.outer(w2, 2.0 * (w2 @ Q))
    return Q


def basis_probes(v: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """The paper's deterministic probes: ``e_ℓ``, or ``e_ℓ + e_p`` where ``v_ℓ = 0`` (p = argmax |v|)."""
    d = v.shape[0]
    A = np.eye(d)
    p = int(np.argmax(np.abs(v)))
    A[zero, p] += 1.0
    return A
