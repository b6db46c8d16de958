"""The smooth FFN polish with its Jacobian products in float32 (wide FFNs on float32 answers)."""

import numpy as np
import pytest

from attnprobe.learners.smooth_ffn import polish
from attnprobe.models.smooth_ffn import ACTIVATIONS
from attnprobe.targets import random_smooth_ffn


@pytest.mark.parametrize("block_work", [polish.BLOCK_WORK, 0.0])  # Cholesky blocks, and unit columns
def test_float32_products_polish_down_to_the_float32_answers(monkeypatch, block_work):
    """From a start 1 % off, Gauss–Newton with float32 products fits float32-rounded answers of a GELU net to
    their rounding: the function is then within 1e-5 of the float64 truth on fresh rows (as with float64
    products), where the start was ~1e-2 off."""
    monkeypatch.setattr(polish, "BLOCK_WORK", block_work)
    truth = random_smooth_ffn(8, 24, 8, activation="gelu", seed=5)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 8))
    Y = truth.forward(X).astype(np.float32).astype(np.float64)
    start = tuple(p * (1 + 1e-2 * rng.standard_normal(p.shape)) for p in (truth.W1, truth.b1, truth.W2, truth.b2))
    Xf = rng.standard_normal((500, 8))
    yf = truth.forward(Xf)
    act = ACTIVATIONS["gelu"]

    def fresh(params):
        return np.abs(polish.forward(Xf, *params, act) - yf).max() / np.abs(yf).max()

    params, history, _ = polish.gauss_newton(X, Y, start, act, True, rounds=8, iterations=200, single=True)
    assert fresh(start) > 1e-3
    assert fresh(params) < 1e-5
    assert history[-1] < 1e-3 * history[0]


def test_wide_ffns_on_float32_answers_get_short_float32_rounds():
    """Past the polish budget on float32 answers: :data:`COARSE_GN_ROUNDS` short rounds with float32 products
    (three Richardson levels); float64 answers and small FFNs keep float64 products."""
    from attnprobe.learners.smooth_ffn.learner import (COARSE_GN_ITERATIONS, COARSE_GN_ROUNDS, GN_ITERATIONS,
                                                       GN_ROUNDS, polish_settings, single_products)

    assert polish_settings(384, 384, 1536, coarse=True) == (3, COARSE_GN_ROUNDS, COARSE_GN_ITERATIONS)
    assert polish_settings(384, 384, 1536, rounds=2, coarse=True)[1] == 2  # given settings win
    assert polish_settings(16, 16, 48, coarse=True) == (3, GN_ROUNDS, GN_ITERATIONS)
    assert single_products(384, 384, 1536, True)
    assert not single_products(384, 384, 1536, False) and not single_products(16, 16, 48, True)


def test_weak_rounds_double_the_next_rounds_iterations(monkeypatch):
    """A kept step that leaves more than half the residual (here: every step cut to 30 %) doubles the next step's
    LSMR iterations up to ``grow_to``; strong steps keep theirs."""
    truth = random_smooth_ffn(5, 8, 5, seed=9)
    X = np.random.default_rng(3).standard_normal((200, 5))
    Y = truth.forward(X)
    rng = np.random.default_rng(4)
    start = tuple(p + 1e-3 * rng.standard_normal(p.shape) for p in (truth.W1, truth.b1, truth.W2, truth.b2))
    exact_step, asked = polish._step, []

    def weak(*args, iterations, **kwargs):
        asked.append(iterations)
        *parts, used = exact_step(*args, iterations=300, **kwargs)
        return (*(0.3 * p for p in parts), used)

    act = ACTIVATIONS["gelu"]
    monkeypatch.setattr(polish, "_step", weak)
    polish.gauss_newton(X, Y, start, act, True, rounds=4, iterations=5, grow_to=20)
    assert asked == [5, 10, 20, 20]
    asked.clear()
    monkeypatch.setattr(polish, "_step", lambda *a, iterations, **k: (asked.append(iterations),
                                                                       exact_step(*a, iterations=300, **k))[1])
    polish.gauss_newton(X, Y, start, act, True, rounds=2, iterations=5, grow_to=20)
    assert asked == [5, 5]


def test_learner_takes_the_float32_rounds_past_the_budget_and_passes(monkeypatch):
    """With the polish budget shrunk so a 6-12-6 GELU net counts as wide, the learner on float32 answers polishes
    in the short float32 rounds (``details``: at most :data:`COARSE_GN_ROUNDS` steps, 20 iterations first) and
    still comes within 1e-3 of the float64 function on fresh rows, its check passed."""
    from attnprobe.learners.smooth_ffn import extract_smooth_ffn, learner
    from attnprobe.oracles import Oracle

    monkeypatch.setattr(learner, "POLISH_WORK", 1.0)
    truth = random_smooth_ffn(6, 12, 6, seed=4, dtype="float32")
    res = extract_smooth_ffn(Oracle(truth, 6, precision="float32"), activation="gelu", hidden=12)
    used = res.details["polish_iterations"]
    assert used[0] == learner.COARSE_GN_ITERATIONS  # the default route's first round runs 300 here
    assert len(used) <= learner.COARSE_GN_ROUNDS and max(used) <= learner.COARSE_GN_MAX_ITERATIONS
    X = np.random.default_rng(1).standard_normal((500, 6))
    y = truth.with_dtype("float64").forward(X)
    assert np.abs(res.model.forward(X) - y).max() / np.abs(y).max() < 1e-3
    assert res.passed
