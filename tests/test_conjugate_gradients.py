"""The one conjugate-gradient solver of the fits (learners/core/conjugate_gradients.py)."""

import numpy as np
import pytest

from attnprobe.learners.core.conjugate_gradients import conjugate_gradients


def _system(n=40, cond=1e4, seed=0):
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    A = Q @ np.diag(np.geomspace(1, cond, n)) @ Q.T
    return A, rng.standard_normal(n)


def test_it_solves_a_positive_definite_system_in_n_steps_and_stops_at_its_tolerance():
    A, b = _system()
    x = conjugate_gradients(lambda v: A @ v, b, 200)
    assert np.linalg.norm(A @ x - b) <= 1e-8 * np.linalg.norm(b)
    few = conjugate_gradients(lambda v: A @ v, b, 5)
    assert np.linalg.norm(A @ few - b) > 1e-3 * np.linalg.norm(b)  # five steps are not enough at condition 1e4


def test_a_good_preconditioner_converges_in_few_steps_and_a_start_is_used():
    A, b = _system()
    Ainv = np.linalg.inv(A)
    x = conjugate_gradients(lambda v: A @ v, b, 2, precondition=lambda r: Ainv @ r)
    assert np.linalg.norm(A @ x - b) <= 1e-8 * np.linalg.norm(b)
    exact = np.linalg.solve(A, b)
    assert np.allclose(conjugate_gradients(lambda v: A @ v, b, 0, x=exact), exact)


def test_arrays_of_any_shape_and_torch_tensors():
    torch = pytest.importorskip("torch")
    A, b = _system(n=12, cond=10)
    x = conjugate_gradients(lambda v: (A @ v.ravel()).reshape(3, 4), b.reshape(3, 4), 50)
    assert np.allclose(A @ x.ravel(), b, atol=1e-9)
    At, bt = torch.as_tensor(A), torch.as_tensor(b)
    xt = conjugate_gradients(lambda v: At @ v, bt, 50)
    assert isinstance(xt, torch.Tensor) and np.allclose(xt.numpy(), x.ravel(), atol=1e-9)


def test_no_division_by_zero_at_a_singular_or_zero_system():
    A = np.diag([1.0, 2.0, 0.0])
    x = conjugate_gradients(lambda v: A @ v, np.array([1.0, 2.0, 0.0]), 10)
    assert np.allclose(x, [1.0, 1.0, 0.0])
    assert np.array_equal(conjugate_gradients(lambda v: A @ v, np.zeros(3), 10), np.zeros(3))
    assert np.all(np.isfinite(conjugate_gradients(lambda v: 0 * v, np.ones(3), 10)))
