"""The post-norm neurons stage for wide layers, through C probe directions (docs/block.md, "Post-norm blocks", stage
``neurons``: "The span by Gauss–Newton, and each step past it"): the probe span (:mod:`.post_norm_probe_span`), every
factor ``ŵ_i ⊗ α̂_i`` (:mod:`.post_norm_factors`), the directions past the probes, each neuron's curve.

- :func:`probe_directions`: for each further block ``U_b`` of centred directions, points orthogonal to U and
  ``U_b``; each point's U-Jacobian (corrected by ``q̂ ⊗ g``) has coordinates ``ĉ_ij`` on the unit factors and
  ``ĉ_ℓj`` on the span's direction ℓ orthogonal to them, and then
  ``x^b_j + q̂_j g_jᵀ = Σ_i ĉ_ij ŵ_i θ_iᵀ + ĉ_ℓj Λ`` is linear in ``θ_i = U_bᵀa_i/|Uᵀa_i|`` (signed as α̂_i), Λ and
  the ``g_j``: one least squares a block. The full direction ``â_i = U α̂_i + Σ_b U_b θ_i^b`` (on the centred space).
- :func:`probe_curves`: the probe points' coordinates on ``[factors, P diag(w) U]`` give per neuron
  ``κ_i σ'(s_i t + c_i)`` (``t = â_i·z_j``; ``r_j`` cancels in the ratio to the linear part's), fitted as
  :func:`.post_norm_neurons.derivative_curve`: ``A_i = s_i â_i``, ``a_i = c_i``.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.block.post_norm import centred_unit, single_tokens
from attnprobe.learners.block.post_norm_factors import factors_complete, linear_part, probe_factors
from attnprobe.learners.block.post_norm_neurons import derivative_curve
from attnprobe.learners.block.post_norm_probe_span import STEP, point_corrections, probe_points, probe_span

#: probe directions (MiniLM: C = 8; the rank-one elements are only the factors when ``dC > m + d + C``), Newton
#: starts of the factor search per neuron at most, and the span's precision the completeness check allows
PROBES, STARTS_PER_FACTOR, COMPLETE = 8, 4, 1e-6
#: the ``1 − ν`` that accepts a factor: within COMPLETE of the span, as the completeness check then holds it (MiniLM
#: layer 2 from its answers: the true factors 6.8e-8 median, 3.7e-7 worst off the span read; at 1e-13, the exact
#: span's, the 6 farthest were never accepted — 1,530 after 2,016 starts —, at (COMPLETE/2)² the last 2, whose
#: deflated pencil, beside found neighbours at |cos| 0.96, stays 2.6e-13 and 3.2e-13 below 1 at their true α)
ACCEPT = COMPLETE ** 2


def probes(d: int, m: int) -> int:
    """The probe count C: :data:`PROBES`, more where ``dC ≤ 1.5(m + d + C)`` (the rank-one family's bound with room;
    MiniLM's C = 8, where its factors were measured well conditioned: 6.1e-2), at most ``(d − 1)/2`` to start
    with (the points, orthogonal to the probes, need room: d = 12 with C = 8 found no factor)."""
    C = min(PROBES, (d - 1) // 2)
    while d * C <= 1.5 * (m + d + C) and C < d - 2:
        C += 1
    return C


def _factor_basis(W, A):
    """The unit factors ``ŵ_i ⊗ α̂_i`` as columns (dC × m)."""
    return np.einsum("bx,bc->xcb", W, A).reshape(W.shape[1] * A.shape[1], -1)


def _direction_block(ask, U, Ub, span, rng, points):
    """θ (m × C_b) for the block ``U_b`` (module docstring) from ``points·(2(C + C_b) + 1)`` single tokens;
    ``ask`` = (answer_rows, affine, n2), ``span`` = (B, W, A, ℓ): each point's coordinates on the factors and ℓ
    through the span B (its corrections eliminated), then ``g_j`` eliminated by projecting off ``q̂_j``; the least
    squares by its normal equations (condition ~261 at MiniLM's size, measured in research) refined once."""
    answer_rows, affine, n2 = ask
    B, W, A, ell = span
    d, C = U.shape
    Cb, m = Ub.shape[1], len(W)
    UU = np.hstack([U, Ub])
    Z = rng.standard_normal((points, d)) @ (np.eye(d) - 1.0 / d)
    Z = centred_unit(Z - (Z @ UU) @ UU.T)
    V = np.concatenate([Z[:, None], Z[:, None] + STEP * UU.T, Z[:, None] - STEP * UU.T], axis=1).reshape(-1, d)
    w2, b2 = n2
    Y = ((single_tokens(answer_rows, affine.token(V)) - b2) / w2).reshape(points, 2 * (C + Cb) + 1, d)
    Xs = (Y[:, 1:C + Cb + 1] - Y[:, C + Cb + 1:]).transpose(0, 2, 1) / (2 * STEP)      # points × d × (C + C_b)
    Qh = Y[:, 0] / np.linalg.norm(Y[:, 0], axis=1, keepdims=True)
    basis = np.hstack([_factor_basis(W, A), ell[:, None]])
    _, c, _ = point_corrections(B, Xs[:, :, :C].reshape(points, d * C), Qh, C)
    coef = np.linalg.solve(B.T @ basis, c.T)                                    # (m + 1) × points
    M = np.concatenate([W.T[None] * coef[:m].T[:, None, :],
                        coef[m][:, None, None] * np.eye(d)[None]], axis=2)      # points × d × (m + d)
    R = Xs[:, :, C:]
    M -= Qh[:, :, None] * np.einsum("jx,jxk->jk", Qh, M)[:, None, :]          # g_j eliminated: off q̂_j
    R = R - Qh[:, :, None] * np.einsum("jx,jxk->jk", Qh, R)[:, None, :]
    M, R = M.reshape(points * d, -1), R.reshape(points * d, -1)
    G = cho_factor(M.T @ M)  # normal equations, one refinement step (MiniLM: a QR solve took 46 s a block, this 6)
    x = cho_solve(G, M.T @ R)
    return (x + cho_solve(G, M.T @ (R - M @ x)))[:m]


def direction_blocks(ask, U, factors, B, rng, *, start: int = 0, D=None):
    """Yields ``(next, D, queries)`` after each block of the centred directions past U (:func:`probe_directions`,
    resumable: ``start`` the first block's offset, ``D`` the directions so far, m × d transposed as d × m)."""
    W, A = factors
    d, C = U.shape
    m = len(W)
    P = np.eye(d) - 1.0 / d
    rest = np.linalg.svd(P - U @ U.T)[0][:, :d - 1 - C]                     # centred, orthogonal to U
    F = _factor_basis(W, A)
    ell = B @ np.linalg.svd(B.T @ F, full_matrices=True)[0][:, m]
    _, _, points, _ = probe_plan(d, m)  # 3(m + d)/d + 4 points left a mostly-off neuron 2.8e-2 off at d = 64
    Cb = max(1, min(C, (d - 1 - C) // 2))  # the points, orthogonal to U and U_b, keep half of the rest free
    D = U @ A.T if D is None else D
    for lo in range(start, rest.shape[1], Cb):
        Ub = rest[:, lo:lo + Cb]
        D = D + Ub @ _direction_block(ask, U, Ub, (B, W, A, ell), rng, points).T
        yield lo + Cb, D, points * (2 * (C + Ub.shape[1]) + 1)


def probe_directions(ask, U, factors, B, rng):
    """``(D, queries)``: the neurons' full directions ``â_i`` (m × d, on the centred space) from the unit factors
    ``(W, A)`` of the span B, block by block of the centred directions past U; ``ask`` = (answer_rows, affine,
    n2)."""
    D, queries = U @ factors[1].T, 0
    for _, D, q in direction_blocks(ask, U, factors, B, rng):
        queries += q
    return D.T, queries


def probe_curves(B, points, U, factors, D, act: str = "gelu"):
    """``(A1, a1, misfit)``: the first layer on z (m × d, m) from the probe points ``(Z, Q, X)``, the unit
    factors ``(W, A)`` and full directions D (module docstring); ``misfit``: the worst curve's."""
    Z, Q, X = points
    W, A = factors
    C = U.shape[1]
    lin, _ = linear_part(B, U)
    basis = np.hstack([_factor_basis(W, A), lin.reshape(-1, 1)])
    _, c, _ = point_corrections(B, X, Q / np.linalg.norm(Q, axis=1, keepdims=True), C)
    coef = np.linalg.solve(B.T @ basis, c.T)
    if np.min(np.abs(coef[-1])) <= 0:
        raise UnidentifiableError("stage neurons: the linear part vanishes at a point")
    ratio = coef[:-1] / coef[-1]
    A1, a1, misfit = [], [], 0.0
    for i, direction in enumerate(D):
        (kappa, s, c0), mis = derivative_curve(Z @ direction, ratio[i], act)
        A1.append(s * direction)
        a1.append(c0)
        misfit = max(misfit, mis)
    return np.array(A1), np.array(a1), misfit


def probe_plan(d: int, m: int) -> tuple[int, int, int, int]:
    """``(C, points, direction points a block, single tokens)`` of :func:`probe_neurons` at width d, FFN m."""
    C = probes(d, m)
    n = 16 * (m + 1) // C + 16
    Cb = max(1, min(C, (d - 1 - C) // 2))
    per_block = 8 * (m + d) // d + 8
    blocks = [min(Cb, d - 1 - C - lo) for lo in range(0, d - 1 - C, Cb)]
    return C, n, per_block, n * (2 * C + 1) + sum(per_block * (2 * (C + b) + 1) for b in blocks)


def probe_neurons(answer_rows, affine, n2, m: int, rng, store=None):
    """Stage neurons through probes: ``(A, a, details)`` (the first layer on z), refused in one line when the
    factors found are not the whole span (:func:`.post_norm_factors.factors_complete`). ``store``: a
    :class:`.post_norm_store.StageStore` keeping the span, the factors, the directions and the curves (``span``,
    ``factors``, ``directions``, ``neurons``) as they are read, the factor search and the directions resumed from
    their last batch and block (:class:`.post_norm_store.Paused` at its deadline)."""
    d = affine.K.shape[0]
    C, n, _, _ = probe_plan(d, m)
    got = store.get("span") if store is not None else None
    if got is None:
        P = np.eye(d) - 1.0 / d
        U = np.linalg.qr(P @ rng.standard_normal((d, C)))[0]
        Z, Q, X = probe_points(answer_rows, affine, n2, U, rng, n)
        B, residuals = probe_span(X, Q, C, m + 1)
        got = dict(U=U, Z=Z, Q=Q, X=X, B=B, residuals=np.array(residuals))
        if store is not None:
            store.put("span", **got)
    U, B = got["U"], got["B"]
    W, A = all_factors(B, U, m, rng, store)
    ok, detail = factors_complete(B, W, A, U, tol=COMPLETE)
    if not ok:
        raise UnidentifiableError(f"stage neurons: the probe span's factors are not complete ({detail['factors']} "
                                  f"of m = {m}; off the span {detail['off_span']:.1e}, linear part "
                                  f"{detail['linear_residual']:.1e}, smallest singular "
                                  f"{detail['smallest_singular']:.1e})")
    D, queries = _directions((answer_rows, affine, n2), U, (W, A), B, rng, store)
    curves = store.get("neurons") if store is not None else None
    if curves is None:
        curves = dict(zip(("A", "a", "misfit"), probe_curves(B, (got["Z"], got["Q"], got["X"]), U, (W, A), D)))
        if store is not None:
            store.put("neurons", **curves)
    details = {"probes": C, "points": n, "span_residual": float(got["residuals"][-1]),
               "gauss_newton_steps": len(got["residuals"]) - 1, "queries": n * (2 * C + 1) + queries,
               "curve_misfit": float(curves["misfit"])}
    return curves["A"], curves["a"], details


def all_factors(B, U, m, rng, store):
    """Every factor by the deflated pencil (at most :data:`STARTS_PER_FACTOR`·m starts), resumed from ``store``'s
    ``factors`` and saved after each batch."""
    d, C = U.shape
    most = STARTS_PER_FACTOR * m
    if store is None:
        return probe_factors(B, d, C, m, rng, most, converged=ACCEPT)
    got = store.get("factors") or {"W": np.zeros((0, d)), "A": np.zeros((0, C)), "starts": 0}
    W, A, done = got["W"], got["A"], int(got["starts"])
    if len(W) >= m or done >= most:
        return W, A

    def log(starts, W, A):
        store.put("factors", W=W, A=A, starts=done + starts)
        store.pause_if_due(f"stage neurons: {len(W)} of m = {m} factors after {done + starts} starts")

    return probe_factors(B, d, C, m, rng, most - done, found=(W, A), log=log, converged=ACCEPT)


def _directions(ask, U, factors, B, rng, store):
    """:func:`probe_directions`, resumed from ``store``'s ``directions`` and saved after each block."""
    if store is None:
        return probe_directions(ask, U, factors, B, rng)
    d, C = U.shape
    got = store.get("directions") or {"D": U @ factors[1].T, "next": 0, "queries": 0}
    D, queries = got["D"], int(got["queries"])
    if int(got["next"]) < d - 1 - C:
        for nxt, D, q in direction_blocks(ask, U, factors, B, rng, start=int(got["next"]), D=D):
            queries += q
            store.put("directions", D=D, next=nxt, queries=queries)
            if nxt < d - 1 - C:
                store.pause_if_due(f"stage neurons: the directions past the probes up to {C + nxt} of {d - 1}")
    return D.T, queries
