"""The FFN of a post-norm (BERT) block seen through its second LayerNorm, ``y = n2(u)`` with ``u = h + F(h)``,
``h = w1 ⊙ z + b1`` and ``z`` the centred, unit-rms n1 input (docs/block.md, "Post-norm blocks", stage ``ffn``).

- :func:`ffn_points`: single tokens ``x`` of rms 1 give ``z = P(K x + c)/rms`` (the first-norm input map,
  :func:`.post_norm.first_norm_input`; n1's ε neglected: ~ε/var ≈ 1e-12) and ``q = (y − b2)/w2`` (n2's weight and
  bias read first, :func:`.post_norm.output_norm`): ``q = P u/r`` with ``r = rms(P u)`` unknown per row.
- :func:`second_layer`: given the first layer (``A = W1 diag(w1)``, ``a = W1 b1 + b1_F``, the neurons on ``z``), the
  rest is linear: ``r_j q_j + γ_j 1 = L z_j + e + W2 σ(A z_j + a)`` with ``L`` the residual's ``diag(w1)`` (fitted
  as any d × d map), so every output (in a basis ``B`` of the centred space) is a least-squares fit on the same
  columns ``[σ(A Z + a), 1, Z]`` (hat matrix ``H``) of ``r ⊙ (Q B)_k``; the rows' scales ``r`` are the null vector
  of ``M = (I − H) ∘ (Q Qᵀ)`` (the Hadamard product: ``Σ_k diag(q_k)(I − H)diag(q_k)``; ``Q`` centred, so
  ``Q B Bᵀ Qᵀ = Q Qᵀ``), fixed up to the overall scale (the post-norm scale gauge,
  :func:`~attnprobe.models.block.rescale_post_norm`). Then ``w1`` is the diagonal nearest ``P L P`` and the block is
  assembled with ``b1 = 0`` (the FFN's first bias absorbs n1's). The null space's second-smallest eigenvalue says
  whether the first layer given explains the answers (a wrong one leaves no null vector).

The first layer itself — the neurons — is not read here: every derivative of ``q`` mixes in ``r``'s
(docs/block.md, "The route the structure gives"), and a fit from random neurons stalls (d = 8, m = 16: 2.5e-2 …
3.6e-2 relative after 150 Levenberg–Marquardt steps, four starts; prototypes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import eigh

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.block.post_norm import FirstNormInput, centred_unit, single_tokens
from attnprobe.models.smooth_ffn import SmoothFFN, activation

#: points per column of the second layer's design (``m + d + 1`` columns; more points than columns fix ``r``)
POINTS_PER_COLUMN = 2


def ffn_points(answer_rows, affine: FirstNormInput, n2: tuple, rng, points: int) -> tuple[np.ndarray, np.ndarray]:
    """``(Z, Q)`` (points × d): the centred unit n1 inputs of ``points`` random single tokens of rms 1 and their
    answers read through n2 ``(w2, b2)``: ``q = (y − b2)/w2``, the centred unit ``u`` of each row."""
    d = affine.K.shape[0]
    X = rng.standard_normal((points, d))
    X /= np.sqrt(np.mean(X * X, axis=1, keepdims=True))
    w2, b2 = n2
    Y = single_tokens(answer_rows, X)
    return centred_unit(X @ affine.K.T + affine.c), (Y - b2) / w2


@dataclass(frozen=True)
class SecondLayer:
    """The FFN stage given the first layer: ``w1`` (n1's weight; its bias 0), ``ffn`` (the FFN on
    ``h = w1 ⊙ z``), ``scales`` (each point's ``r``, mean 1), ``null`` (``M``'s smallest eigenvalue over its largest:
    0 when the first layer explains the answers), ``gap`` (the second-smallest over the largest: how well ``r`` is
    fixed), ``misfit`` (the assembled map's largest error on the points, relative to the largest ``|q|``)."""

    w1: np.ndarray
    ffn: SmoothFFN
    scales: np.ndarray
    null: float
    gap: float
    misfit: float


def second_layer(Z: np.ndarray, Q: np.ndarray, A: np.ndarray, a: np.ndarray, act: str = "gelu") -> SecondLayer:
    """The rows' scales, n1's weight, the FFN's second layer and the joint bias from ``(Z, Q)`` (:func:`ffn_points`)
    given the first layer ``A`` (m × d, on ``z``) and ``a`` (m,) (module docstring). Refused in one line when there
    are fewer points than ``m + d + 2``."""
    n, d = Z.shape
    m = A.shape[0]
    if n < m + d + 2:
        raise UnidentifiableError(f"stage ffn: {n} points for {m + d + 1} columns of the second layer: give "
                                  f"at least {m + d + 2}")
    Phi = activation(act).f(Z @ A.T + a)
    X = np.hstack([Phi, np.ones((n, 1)), Z])
    U = np.linalg.qr(X)[0]
    M = (np.eye(n) - U @ U.T) * (Q @ Q.T)
    vals, vecs = eigh(M, subset_by_index=[0, 1])
    top = float(np.linalg.norm(Q, ord="fro") ** 2 / n)  # M's scale: its trace over n
    r = vecs[:, 0] * np.sign(vecs[:, 0].sum())
    r = r / r.mean()
    coef = np.linalg.lstsq(X, r[:, None] * Q, rcond=None)[0]  # (m + 1 + d) × d
    W2, e, L = coef[:m].T, coef[m], coef[m + 1:].T
    P = np.eye(d) - 1.0 / d
    # P diag(w) P = P L P (L is seen only on centred z and up to 1aᵀ): least squares in w
    PLP = P @ L @ P
    basis = np.einsum("ik,jk->kij", P, P).reshape(d, d * d)
    w1 = np.linalg.lstsq(basis.T, PLP.ravel(), rcond=None)[0]
    ffn = SmoothFFN(A / w1, a, P @ W2, P @ e, act)
    fit = centred_unit(w1 * Z + ffn.forward(w1 * Z))
    misfit = float(np.max(np.abs(fit - Q)) / np.max(np.abs(Q)))
    return SecondLayer(w1, ffn, r, float(vals[0] / top), float(vals[1] / top), misfit)
