"""The neurons of a post-norm (BERT) block's FFN read through n2's per-row scale, from first derivatives on n1's
sphere (docs/block.md, "Post-norm blocks", stage ``neurons``).

With ``q(z) = P u(z)/r(z)`` (:func:`.post_norm_ffn.ffn_points`), ``u = w1 ⊙ z + e + W2 σ(A z + a)`` and
``r = rms(P u)``, the Jacobian of ``P u`` at ``z_j`` is ``J_j = P diag(w1) P + Σ_i σ'(a_i·z_j + a_i0) w̃_i a_iᵀ P``
(``w̃_i = P W2[:, i]``): every ``J_j`` lies in the fixed (m + 1)-dimensional span ``S`` of ``P diag(w1) P`` and the
rank-one ``w̃_i a_iᵀ``. The answers give, along n1's sphere (single tokens ``K⁻¹(v − c)``, central differences in
``v``, ``2d`` tokens a point), ``O_j = Dq(z_j) P_T`` (``P_T`` off 1 and ``z_j``) and
``r_j O_j = J_j − q_j g_jᵀ − k_j z_jᵀ`` (``q_j``'s share lost to the norm, ``z_j``'s column lost to the sphere):
each ``O_j`` is known up to ``2d − 1`` correction directions of its own.

- :func:`neuron_span`: alternating least squares — each point's corrections by least squares against the current
  span, then the span as the top ``m + 1`` singular vectors of the corrected ``O_j`` (the start: the raw ``O_j``'s).
  With the linear part kept in the span no direction is left free (the second-order version, with the linear part
  out, kept one: docs/block.md, "The route the structure gives").
- :func:`rank_one_elements`: the ``m`` rank-one elements of the span (alternating the nearest rank-one matrix and
  the projection back, from random starts): the neurons' directions ``a_i/|a_i|``.
- :func:`neuron_curves`: the element ``P diag(w) P`` of the span (n1's weight, up to scale: a null vector), each
  point's coefficients on ``[w̃_i a_iᵀ…, P diag(w) P]``, and per neuron the ratio to the linear part's,
  ``κ_i σ'(s_i t_ij + c_i)`` (``t_ij = â_i·z_j``), fitted for ``(κ_i, s_i, c_i)``: the first layer ``A = s â``,
  ``a = c`` that :func:`.post_norm_ffn.second_layer` completes.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.block.post_norm import FirstNormInput, single_tokens
from attnprobe.learners.block.post_norm import centred_unit
from attnprobe.models.smooth_ffn import activation

#: central-difference step in n1's input (rms 1)
STEP = 1e-5
#: sweeps of the span's alternating least squares at most, and the relative residual that ends them (the central
#: differences' error is ~1e-10)
SWEEPS, SETTLED = 400, 1e-9
#: random starts of the rank-one search per neuron, iterations per start, and how near rank one an element must be
STARTS_PER_NEURON, ONE_ITERATIONS, RANK_ONE = 8, 300, 1e-6
#: the (s, c) grid the per-neuron curve fits start from
SCALES, SHIFTS = (-2.0, -0.5, 0.5, 2.0), (-1.0, 0.0, 1.0)
#: the finer (s, c) grid screened by its best κ before one fit, and the fit above which the full grid is run
SCREEN, SCREENED = (tuple(sorted({f * x for f in (-1, 1) for x in (0.25, 0.5, 1.0, 2.0, 4.0)})),
                    (-4.0, -3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 4.0)), 1e-6


def sphere_jacobians(answer_rows, affine: FirstNormInput, n2: tuple, rng, points: int):
    """``(Z, Q, O)``: ``points`` random centred unit n1 inputs ``z_j``, their ``q_j`` and ``O_j = Dq(z_j) P_T``
    (d × d, central differences along every coordinate of n1's input at rms 1: ``2d + 1`` single tokens a point)."""
    d = affine.K.shape[0]
    Z = centred_unit(rng.standard_normal((points, d)))
    E = np.eye(d) * STEP
    V = np.concatenate([Z[:, None, :], Z[:, None, :] + E, Z[:, None, :] - E], axis=1).reshape(-1, d)
    w2, b2 = n2
    Y = (single_tokens(answer_rows, affine.token(V)) - b2) / w2
    Y = Y.reshape(points, 2 * d + 1, d)
    O = (Y[:, 1:d + 1] - Y[:, d + 1:]).transpose(0, 2, 1) / (2 * STEP)
    return Z, Y[:, 0], O


def _corrections(z: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Orthonormal basis of ``{q gᵀ P + k zᵀ}`` flattened (d² × (2d − 1))."""
    d = z.size
    P = np.eye(d) - 1.0 / d
    cols = np.concatenate([np.einsum("i,lj->lij", q, P).reshape(d, -1),
                           np.einsum("li,j->lij", P, z).reshape(d, -1)]).T
    U, s, _ = np.linalg.svd(cols, full_matrices=False)
    return U[:, s > 1e-10 * s[0]]


def neuron_span(Z: np.ndarray, Q: np.ndarray, O: np.ndarray, m: int, sweeps: int = SWEEPS):
    """``(B, corrected, residuals)``: an orthonormal basis (d² × (m + 1)) of the span ``S`` (module docstring), each
    point's ``O_j`` corrected into it (d² × n, ``J_j/r_j``) and the relative residual after each sweep."""
    n, d = Z.shape
    X = O.reshape(n, d * d).T
    C = [_corrections(Z[j], Q[j]) for j in range(n)]
    B = np.linalg.svd(X, full_matrices=False)[0][:, :m + 1]
    residuals, scale = [], float(np.sum(X * X))
    for _ in range(sweeps):
        Y, res = np.empty_like(X), 0.0
        eye = np.eye(m + 1)
        for j in range(n):  # min |Bα − x − Cβ| with B, C orthonormal: (I − MᵀM)α = Bᵀx − MᵀCᵀx, M = CᵀB
            x, Cj = X[:, j], C[j]
            M = Cj.T @ B
            alpha = np.linalg.solve(eye - M.T @ M, B.T @ x - M.T @ (Cj.T @ x))
            e = B @ alpha - x
            back = Cj @ (Cj.T @ e)
            Y[:, j] = x + back
            res += float(np.sum((e - back) ** 2))
        B = np.linalg.svd(Y, full_matrices=False)[0][:, :m + 1]
        residuals.append(float(np.sqrt(res / scale)))
        if residuals[-1] < SETTLED:
            break
    return B, Y, residuals


def rank_one_elements(B: np.ndarray, m: int, rng) -> np.ndarray:
    """The rank-one elements of the span ``B`` (d² × k), unit norm, at most ``m`` (rows of a (≤ m) × d² array):
    nearest rank-one matrix and projection back, alternately, from random starts."""
    d = int(round(np.sqrt(B.shape[0])))
    found, rows = [], []
    for _ in range(STARTS_PER_NEURON * m):
        x = B @ rng.standard_normal(B.shape[1])
        for _ in range(ONE_ITERATIONS):
            U, s, Vt = np.linalg.svd(x.reshape(d, d))
            x_new = B @ (B.T @ (s[0] * np.outer(U[:, 0], Vt[0])).ravel())
            done = np.linalg.norm(x_new - x) < 1e-14 * np.linalg.norm(x)
            x = x_new
            if done:
                break
        _, s, Vt = np.linalg.svd(x.reshape(d, d))
        if s[1] < RANK_ONE * s[0] and all(abs(Vt[0] @ f) < 1 - 1e-6 for f in rows):
            rows.append(Vt[0])
            found.append(x / np.linalg.norm(x))
            if len(found) == m:
                break
    return np.array(found)


def derivative_curve(t: np.ndarray, y: np.ndarray, act: str = "gelu"):
    """``(κ, s, c)`` with ``κ σ'(s t + c)`` nearest ``y`` (Levenberg–Marquardt with the exact Jacobian: the
    trust-region default with a numerical one took ~3 s a neuron on MiniLM), started from the :data:`SCREEN` grid's
    best (κ by least squares at each (s, c)); from every start of the (s, c) grid when that fit is above
    :data:`SCREENED` (the full grid alone: 0.67 s a neuron at 3,090 points)."""
    d1, d2 = activation(act).d1, activation(act).d2

    def jac(p):
        g2 = p[0] * d2(p[1] * t + p[2])
        return np.stack([d1(p[1] * t + p[2]), g2 * t, g2], axis=1)

    def fit(s0, c0):
        g = d1(s0 * t + c0)
        k0 = float(g @ y) / max(float(g @ g), 1e-300)
        return least_squares(lambda p: p[0] * d1(p[1] * t + p[2]) - y, [k0, s0, c0], jac=jac, method="lm",
                             xtol=1e-15, ftol=1e-15, gtol=1e-15)

    def screened(s0, c0):
        g = d1(s0 * t + c0)
        return float(y @ y) - float(g @ y) ** 2 / max(float(g @ g), 1e-300)

    norm = max(float(y @ y), 1e-300)
    best = fit(*min(((s0, c0) for s0 in SCREEN[0] for c0 in SCREEN[1]), key=lambda p: screened(*p)))
    if np.sqrt(2 * best.cost / norm) > SCREENED:
        for s0 in SCALES:
            for c0 in SHIFTS:
                sol = fit(s0, c0)
                if sol.cost < best.cost:
                    best = sol
    return best.x, float(np.sqrt(2 * best.cost / norm))


def neuron_curves(B: np.ndarray, corrected: np.ndarray, elements: np.ndarray, Z: np.ndarray, act: str = "gelu"):
    """``(A, a, misfit)``: the first layer on ``z`` (m × d, m) from the span's rank-one ``elements`` (module
    docstring); ``misfit``: the worst neuron's relative curve-fit residual."""
    d = Z.shape[1]
    P = np.eye(d) - 1.0 / d
    G = np.stack([np.outer(P[:, i], P[i]).ravel() for i in range(d)], 1)
    w = np.linalg.svd(G - B @ (B.T @ G), full_matrices=False)[2][-1]
    basis = np.hstack([elements.T, (P @ np.diag(w) @ P).reshape(-1, 1)])
    coef = np.linalg.lstsq(basis, corrected, rcond=None)[0]
    if np.min(np.abs(coef[-1])) <= 0:
        raise UnidentifiableError("stage neurons: the linear part vanishes at a point")
    ratio = coef[:-1] / coef[-1]
    A, a, misfit = [], [], 0.0
    for i, el in enumerate(elements):
        direction = np.linalg.svd(el.reshape(d, d))[2][0]
        (kappa, s, c), mis = derivative_curve(Z @ direction, ratio[i], act)
        A.append(s * direction)
        a.append(c)
        misfit = max(misfit, mis)
    return np.array(A), np.array(a), misfit
