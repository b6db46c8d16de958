"""The vector learner's numerical kernels: a batch of variable-projection fits is each fit alone, the normal
equations from the Jacobian's factors are those of the Jacobian itself, and the logits' least squares keeps the
least-norm answer when its matrix is rank-deficient."""

import numpy as np
import pytest

from attnprobe.learners.multihead.vector_heads import VariableProjection, fit_delta, fit_deltas, sigmoid
from attnprobe.learners.multihead.vector_logits import least_squares
from vector_layers import progression_problem


def _problem(rng, T=None, K=30, H=4, n=20, q=3, start_off=0.05):
    """Residuals of H sigmoid heads on a design ``T`` of n points; the true θ and a start near it."""
    T = rng.standard_normal((n, q)) / np.sqrt(q) if T is None else T
    T1 = np.concatenate([T, np.ones((len(T), 1))], axis=1)
    theta = rng.standard_normal((H, T.shape[1] + 1))
    w = rng.standard_normal((K, H))
    R = w @ sigmoid(theta @ T1.T)
    return R, T, w.sum(axis=1), theta, theta + start_off * rng.standard_normal(theta.shape)


@pytest.mark.parametrize("seed", range(4))
def test_a_fit_recovers_the_heads_of_a_sigmoid_network(seed):
    R, T, m, theta, start = _problem(np.random.default_rng(seed))
    fit = fit_delta(R, T, m, start)
    assert fit.residual < 1e-10
    np.testing.assert_allclose(fit.theta, theta, rtol=1e-6, atol=1e-6)


def test_a_batch_of_fits_is_each_fit_alone():
    rng = np.random.default_rng(7)
    T = rng.standard_normal((20, 3)) / np.sqrt(3)
    problems = [_problem(rng, T) for _ in range(6)]
    starts = [p[4] for p in problems]
    starts[2] = starts[2] + 0.3  # one far start: it takes more iterations than the others
    batch = fit_deltas(np.stack([p[0] for p in problems]), T, np.stack([p[2] for p in problems]), np.stack(starts))
    for p, s, b in zip(problems, starts, batch):
        alone = fit_delta(p[0], T, p[2], s)
        np.testing.assert_allclose(b.theta, alone.theta, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(b.w, alone.w, rtol=1e-9, atol=1e-12)
        assert b.residual == pytest.approx(alone.residual, rel=1e-6, abs=1e-14)
    assert max(b.residual for b in batch) < 1e-10


def test_the_normal_equations_are_those_of_the_jacobian():
    rng = np.random.default_rng(3)
    F, K, H, n, L = 3, 7, 4, 9, 3
    T1 = np.concatenate([rng.standard_normal((n, L - 1)), np.ones((n, 1))], axis=1)
    proj = VariableProjection(rng.standard_normal((F, K, n)), rng.standard_normal((F, K)), T1,
                       rng.uniform(0.5, 2.0, F), H)
    idx = np.arange(F)
    x = rng.standard_normal((F, H * L))
    S, Qd, w, res = proj.parts(x, idx)
    r = proj.residual(res, idx)
    A, g = proj.normal_equations(S, Qd, w, r, idx)
    for f in range(F):  # Kaufman's Jacobian written out entry by entry
        s = S[f, 0]  # the sigmoid; S[f, 1] is its derivative
        np.testing.assert_allclose(S[f, 1], s * (1 - s), rtol=1e-12)
        G = (s * (1 - s))[:, :, None] * T1[None]
        G = G - np.einsum("nk,hkl->hnl", Qd[f], np.einsum("nk,hnl->hkl", Qd[f], G))
        J = (-np.einsum("kh,hnl->knhl", w[f], G) / proj.scale[f]).reshape(K * n, H * L)
        np.testing.assert_allclose(A[f], J.T @ J, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(g[f], J.T @ r[f], rtol=1e-10, atol=1e-12)


def test_least_squares_by_qr_and_its_least_norm_fallback():
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((40, 6)), rng.standard_normal((40, 3))
    np.testing.assert_allclose(least_squares(A, B), np.linalg.lstsq(A, B, rcond=None)[0], rtol=1e-10)
    A[:, 5] = A[:, 4]  # rank-deficient: QR would divide by a zero pivot
    np.testing.assert_allclose(least_squares(A, B), np.linalg.lstsq(A, B, rcond=None)[0], rtol=1e-10)


@pytest.mark.parametrize("seed", range(20))
def test_relabelling_is_the_optimal_assignment(seed):
    from scipy.optimize import linear_sum_assignment

    from attnprobe.learners.multihead.vector import relabel
    from attnprobe.learners.multihead.vector_heads import DeltaFit

    rng = np.random.default_rng(seed)
    H = 6
    ref = rng.standard_normal((4, H))
    perm = rng.permutation(H)
    # near the reference in a shuffled order, or far from it (several heads nearest to the same reference head)
    got = ref[:, perm] + (0.05 if seed % 2 else 3.0) * rng.standard_normal((4, H))
    fit = relabel(DeltaFit(got.copy(), got.T.copy(), 0.0), ref, None)
    cost = np.linalg.norm(got[:, :, None] - ref[:, None, :], axis=0)
    rows, cols = linear_sum_assignment(cost)
    np.testing.assert_array_equal(fit.w, got[:, rows[np.argsort(cols)]])


@pytest.mark.parametrize("length", [2, 3, 6])
def test_the_progression_link_is_the_mean_index_and_its_derivative(length):
    from attnprobe.learners.multihead.vector_heads import mean_index

    z = np.linspace(-30, 30, 41)
    mu, dmu = mean_index(z, length)
    j = np.arange(length)
    p = np.exp(np.outer(z, j) - np.max(np.outer(z, j), axis=1, keepdims=True))
    np.testing.assert_allclose(mu, (p @ j) / p.sum(axis=1), rtol=1e-12, atol=1e-12)
    h = 1e-6
    np.testing.assert_allclose(dmu, (mean_index(z + h, length)[0] - mean_index(z - h, length)[0]) / (2 * h),
                               rtol=1e-5, atol=1e-8)
    assert np.all(np.diff(mu) > 0) or np.all(np.diff(mu) >= 0) and mu[0] >= 0 and mu[-1] <= length - 1


def test_a_progression_fit_separates_heads_from_rows():
    """Rows k of ``[b; b + δ; …; b + (N−1)δ]`` answer ``Σ_h μ_N(θ_hᵀ[t; k; 1]) w_h``: recovered exactly."""
    from attnprobe.learners.multihead.vector_heads import fit_delta

    rng = np.random.default_rng(5)
    N = 5
    T, theta, w, R = progression_problem(rng, K=12, H=3, q=3, N=N, n=4)
    fit = fit_delta(R, T, w.sum(axis=1), theta + 0.05 * rng.standard_normal(theta.shape), length=N)
    assert fit.residual < 1e-12
    np.testing.assert_allclose(fit.theta, theta, atol=1e-9)
    np.testing.assert_allclose(fit.w, w, atol=1e-9)


def test_a_singular_fit_gets_a_zero_step_and_the_batch_goes_on():
    """One head whose logits do not vary makes its damped normal matrix singular: that fit's step is zero (rejected
    by the caller), the other fits' steps are exact (a batched solve used to raise LinAlgError for all)."""
    from attnprobe.learners.multihead.vector_heads import damped_steps

    rng = np.random.default_rng(0)
    M = rng.standard_normal((3, 4, 4))
    M = M @ M.transpose(0, 2, 1) + 4 * np.eye(4)
    M[1] = np.outer(np.arange(4.0), np.arange(4.0))  # rank one
    rhs = rng.standard_normal((3, 4))
    steps = damped_steps(M, rhs)
    assert np.array_equal(steps[1], np.zeros(4))
    for i in (0, 2):
        assert np.allclose(M[i] @ steps[i], rhs[i], rtol=0, atol=1e-12)
