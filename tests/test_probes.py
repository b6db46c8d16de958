"""Probe matrices of Thm 4.1's column-wise solve: Haar-random orthogonal matrices drawn as numpy's QR draws them,
and orthogonal probes whose every row has the same projection on v."""

import numpy as np
import pytest

from attnprobe.learners.head.probes import equal_projection_orthogonal, random_orthogonal


@pytest.mark.parametrize("d", [1, 2, 7, 64, 129])
def test_random_orthogonal_is_numpys_qr_draw_in_c_order(d):
    for seed in range(3):
        Q = random_orthogonal(d, np.random.default_rng(seed))
        Qn, R = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
        # the same numbers bit for bit, and C order: later products on Fortran order take other BLAS paths
        assert np.array_equal(Q, Qn * np.sign(np.diag(R)))
        assert Q.flags["C_CONTIGUOUS"]
        np.testing.assert_allclose(Q @ Q.T, np.eye(d), atol=1e-13)


@pytest.mark.parametrize("d", [2, 3, 16, 97])
def test_equal_projection_rows_all_project_equally_on_v(d):
    rng = np.random.default_rng(d)
    h = np.ones(d) / np.sqrt(d)
    e1 = np.eye(d)[0]
    for v in (rng.standard_normal(d) * 7.0, 3.0 * h, -h, e1, e1 + 1e-9 * rng.standard_normal(d)):
        Q = equal_projection_orthogonal(v, rng)
        np.testing.assert_allclose(Q @ Q.T, np.eye(d), atol=1e-13)
        np.testing.assert_allclose(Q @ (v / np.linalg.norm(v)), h, atol=1e-13)  # Q v̂ = h: every |q_ℓᵀv| = ‖v‖/√d


def test_equal_projection_probes_are_random_rotations():
    v = np.random.default_rng(0).standard_normal(32)
    Q1 = equal_projection_orthogonal(v, np.random.default_rng(1))
    Q2 = equal_projection_orthogonal(v, np.random.default_rng(2))
    # two draws share only the constraint Q v̂ = h: their rows are far apart
    assert np.max(np.abs(Q1 - Q2)) > 0.3
    assert np.array_equal(Q1, equal_projection_orthogonal(v, np.random.default_rng(1)))
