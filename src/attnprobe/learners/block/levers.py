"""Measured levers of a block learner (docs/block.md, "The learner"), as library pieces: each is checked against the
truth in ``tests/test_block_levers.py`` and measured in ``benchmarks/block_levers.py``.

- :func:`driven_out`: a pre-norm block with its last row driven out to ``t·u`` answers, in the limit ``t → ∞``,
  ``A_N(n1(X̃)) + F(n2(u))``: the attention at the last position plus a function of the last token alone.
- :func:`ffn_on_sphere`: with k zero keys before the driven-out token (bias-free attention: a zero key has logit 0
  and value 0 at every offset), the attention's share is ``Σ_h β_h(k) V_h n1(u)`` with ``β_h = 1/(1 + k e^{−s_h})``,
  analytic in ``1/k``; extrapolated to ``k = ∞`` it leaves ``F(n2(u))``: the FFN on the norm's sphere, alone. Then
  ``L(X) − F(n2(x_N))`` is the attention at the last position, absolute: the block splits into its sublayers.
- :func:`value_map`: the attention's value map (times the first norm's weight) from single tokens, the FFN's
  share taken off.
- :func:`output_layernorm`: a post-norm block's output LayerNorm (weight up to the sign gauge, bias exactly) from
  its answers' rows alone, no queries of its own.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import ConfigError

#: the steps ``s = 1/t`` of :func:`driven_out` (float64 answers: rounding ``1e-16·t`` against the extrapolation's
#: ``s⁵`` truncation)
STEPS = (1e-3, 2e-3, 3e-3, 4e-3, 5e-3)


def driven_out(answer_rows, X: np.ndarray, steps=STEPS) -> np.ndarray:
    """``L(X) = lim_{t→∞} y_N(X with last row t·x_N) − t·x_N`` (B, d), by polynomial extrapolation in ``s = 1/t``
    to ``s = 0`` (``len(steps)`` sequences per row of ``X``). In a pre-norm block ``y_N − t x_N =
    A_N(n1(X̃)) + F(n2(x_N + s·A_N))`` is analytic in s. ``answer_rows`` maps ``(B, N, d)`` to every row."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 3:
        raise ConfigError(f"X must have shape (B, N, d); got {X.shape}", param="X")
    steps = np.asarray(steps, dtype=np.float64)
    if steps.ndim != 1 or len(steps) < 2 or np.any(steps <= 0) or len(set(steps.tolist())) != len(steps):
        raise ConfigError("steps must be at least two distinct positive numbers", param="steps")
    B = X.shape[0]
    batch = np.repeat(X[None], len(steps), axis=0)  # (S, B, N, d)
    batch[:, :, -1] = X[None, :, -1] / steps[:, None, None]
    rows = np.asarray(answer_rows(batch.reshape((-1,) + X.shape[1:])), dtype=np.float64)
    G = rows.reshape((len(steps), B) + X.shape[1:])[:, :, -1] - batch[:, :, -1]
    weights = np.linalg.solve(np.vander(steps, len(steps), increasing=True).T, np.eye(len(steps))[0])
    return np.tensordot(weights, G, axes=1)


#: zero-key counts of :func:`ffn_on_sphere` (self logits of order one: ``e^{s}/k`` ≤ 0.02 at k = 200)
ZERO_KEYS = (200, 400, 600, 800, 1000)


def rational_keys(heads: int) -> tuple[int, ...]:
    """Zero-key counts of the rational limit: ``max(19, 2·heads + 3)`` counts spread over 100 … 1000 (19 is
    ``range(100, 1001, 50)``)."""
    return tuple(int(k) for k in np.unique(np.round(np.linspace(100, 1000, max(19, 2 * heads + 3)))))


def ffn_on_sphere(answer_rows, U: np.ndarray, zero_keys=None, steps=STEPS, heads: int | None = None) -> np.ndarray:
    """``F(n2(u))`` for the rows of ``U`` (B, d) of a pre-norm block whose attention has no key or value biases:
    :func:`driven_out` on ``[0]·k + [u]`` for each ``k`` in ``zero_keys`` (``len(zero_keys)·len(steps)`` sequences
    per row, of length up to ``max(zero_keys) + 1``), taken to ``k = ∞``. Without ``heads``: polynomially in
    ``1/k`` (:data:`ZERO_KEYS`; its error grows like ``(e^{s_h}/k)^5`` with the self logits ``s_h``: 4e-6 at
    d = 128, measured). With ``heads`` = H: the exact form ``F + Σ_h c_h/(1 + k e^{−s_h})``, a rational function of
    ``1/k`` of degree H over H with one denominator for every coordinate, fitted by :func:`rational_limit`
    (:func:`rational_keys`; 1.5e-11 at d = 128, measured)."""
    U = np.asarray(U, dtype=np.float64)
    if U.ndim != 2:
        raise ConfigError(f"U must have shape (B, d); got {U.shape}", param="U")
    if zero_keys is None:
        zero_keys = ZERO_KEYS if heads is None else rational_keys(heads)
    ks = np.asarray(zero_keys, dtype=np.float64)
    need = 2 if heads is None else 2 * heads + 2
    if ks.ndim != 1 or len(ks) < need or np.any(ks < 1) or len(set(ks.tolist())) != len(ks):
        raise ConfigError(f"zero_keys must be at least {need} distinct counts ≥ 1", param="zero_keys")
    B, d = U.shape
    L = np.stack([driven_out(answer_rows, np.concatenate([np.zeros((B, int(k), d)), U[:, None]], axis=1), steps)
                  for k in ks])
    if heads is not None:
        return np.stack([rational_limit(ks.min() / ks, L[:, b], heads) for b in range(B)])
    weights = np.linalg.solve(np.vander(1.0 / ks, len(ks), increasing=True).T, np.eye(len(ks))[0])
    return np.tensordot(weights, L, axes=1)


def rational_limit(x: np.ndarray, L: np.ndarray, degree: int) -> np.ndarray:
    """The value at ``x = 0`` of the rational function ``P(x)/Q(x)`` (degree ``degree`` over ``degree``, ``Q(0) = 1``,
    one ``Q`` for all columns) fitted to the rows ``L (n, d)`` at nodes ``x (n,)`` by the linearised least squares
    ``L·Q = P`` (each column's ``P`` projected out: ``degree`` unknowns for ``Q``, then ``P`` per column)."""
    V = np.vander(np.asarray(x, dtype=np.float64), degree + 1, increasing=True)
    basis = np.linalg.qr(V)[0]
    rows = [(V[:, 1:] * L[:, [c]], L[:, c]) for c in range(L.shape[1])]
    A = np.concatenate([a - basis @ (basis.T @ a) for a, _ in rows])
    b = -np.concatenate([v - basis @ (basis.T @ v) for _, v in rows])
    q = np.linalg.lstsq(A, b, rcond=None)[0]
    return np.linalg.lstsq(V, L * (1 + V[:, 1:] @ q)[:, None], rcond=None)[0][0]


def value_map(answer_rows, d: int, zero_keys=ZERO_KEYS, steps=STEPS, seed: int = 0) -> np.ndarray:
    """``M diag(w1)`` (d × d) of a pre-norm block with bias-free attention: ``M = Σ_h V_h`` the attention's value
    map and ``w1`` the first norm's weight (only their product is identifiable). A single token ``q`` of unit norm
    is normalised to ``√d w1 ⊙ q`` and attends to itself, so ``L([q]) − F(n2(q)) = √d M diag(w1) q``; the tokens
    are the columns of a random orthogonal Q (a coordinate token would have a self-logit d times larger, beyond
    what ``zero_keys`` can outnumber). ``d·len(steps)·(len(zero_keys) + 1)`` sequences."""
    Q = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))[0]
    own = driven_out(answer_rows, Q.T[:, None, :], steps)
    return (own - ffn_on_sphere(answer_rows, Q.T, zero_keys, steps)).T @ Q.T / math.sqrt(d)


def output_layernorm(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(w, b)`` of the LayerNorm that produced ``rows`` (n × d, n > d + 2 rows of varied inputs), ``w`` up to one
    sign for all coordinates (the post-norm sign gauge), ``b`` exactly, ε neglected.

    ``y = w ⊙ z + b`` with ``Σ z = 0`` and ``Σ z² = d``: the null vector ``(â, ŝ)`` of ``[Y, −1]`` is
    ``(1/w, Σ b/w)`` up to a scale λ; ``Σ_k (λ â_k y_k − β_k)² = d`` (``β = b/w``) is linear in
    ``(λ², λ â β, Σ β²)`` up to the direction ``â`` (fixed by ``Σ β = λ ŝ``) and a scale c of the whole fitted
    identity (it is affine in y on the rows), fixed by ``r = Σ β²``."""
    Y = np.asarray(rows, dtype=np.float64)
    n, d = Y.shape if Y.ndim == 2 else (0, 0)
    if Y.ndim != 2 or n < d + 3:
        raise ConfigError(f"rows must be an (n, d) array with n ≥ d + 3; got {Y.shape}", param="rows")
    sv, Vt = np.linalg.svd(np.hstack([Y, -np.ones((n, 1))]), full_matrices=False)[1:]
    if sv[-1] > 1e-8 * sv[0] or sv[-2] < 1e-6 * sv[0]:
        raise ConfigError("the rows do not lie on exactly one hyperplane: not the output of a LayerNorm over "
                          "varied inputs", param="rows")
    a, s = Vt[-1, :d], Vt[-1, d]
    A = np.hstack([((a * Y) ** 2).sum(1, keepdims=True), -2 * Y, np.ones((n, 1))])
    sol = np.linalg.lstsq(A, np.full(n, float(d)), rcond=None)[0]
    lam = math.sqrt(abs(sol[0]))
    beta = sol[1:d + 1] / (lam * a)
    shift = (lam * s - beta.sum()) / d  # along â: q + μ â, r + 2 μ ŝ with μ = λ·shift
    beta, r = beta + shift, sol[-1] + 2 * lam * shift * s
    c = 1 + (beta @ beta - r) / d  # the solution found is c·(the truth's) + (0, 0, d(1 − c))
    lam, beta = lam / math.sqrt(c), beta / math.sqrt(c)
    w = 1 / (lam * a)
    return w, beta * w
