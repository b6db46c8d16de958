"""The smooth FFN learner (GELU, tanh-GELU, SiLU) behind ``--method ffn``, its model and its dispatch."""

import json

import numpy as np
import pytest

from attnprobe.cli import main
from attnprobe.errors import ConfigError
from attnprobe.learners import registry
from attnprobe.learners.core.estimate import estimate_queries
from attnprobe.learners.smooth_ffn import extract_smooth_ffn
from attnprobe.learners.smooth_ffn.dispatch import extract_ffn_any
from attnprobe.models import load_model, save_model
from attnprobe.models.smooth_ffn import ACTIVATIONS, SmoothFFN, neuron_match
from attnprobe.oracles import Oracle
from attnprobe.targets import random_relu_net, random_smooth_ffn


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_derivatives_match_finite_differences(name):
    act = ACTIVATIONS[name]
    z = np.linspace(-6, 6, 101)
    h = 1e-5
    assert np.allclose(act.d1(z), (act.f(z + h) - act.f(z - h)) / (2 * h), atol=1e-8)
    assert np.allclose(act.d2(z), (act.d1(z + h) - act.d1(z - h)) / (2 * h), atol=1e-8)


def test_activations_are_the_named_functions():
    torch = pytest.importorskip("torch")

    z = torch.linspace(-5, 5, 41, dtype=torch.float64)
    ref = {"gelu": torch.nn.functional.gelu(z), "gelu_tanh": torch.nn.functional.gelu(z, approximate="tanh"),
           "silu": torch.nn.functional.silu(z)}
    for name, want in ref.items():
        assert np.allclose(ACTIVATIONS[name].f(z.numpy()), want.numpy(), atol=1e-14)


def test_model_forward_save_load(tmp_path):
    model = random_smooth_ffn(5, 12, 3, activation="silu", seed=2)
    X = np.random.default_rng(0).standard_normal((7, 1, 5))
    want = model.W2 @ ACTIVATIONS["silu"].f(model.W1 @ X[:, 0].T + model.b1[:, None]) + model.b2[:, None]
    assert np.allclose(model(X), want.T)
    loaded = load_model(save_model(model, tmp_path / "m.npz"))
    assert isinstance(loaded, SmoothFFN) and loaded.activation == "silu"
    assert np.array_equal(loaded(X), model(X))
    with pytest.raises(ConfigError, match="W2 must be K×m"):
        SmoothFFN(model.W1, model.b1, model.W2[:, :3], model.b2)
    with pytest.raises(ConfigError, match="length-1"):
        model(np.zeros((2, 3, 5)))


@pytest.mark.parametrize("activation, bias", [("gelu", True), ("silu", False), ("gelu_tanh", True)])
def test_recovers_wider_than_inputs_and_outputs(activation, bias):
    """m = 12 > d = 5 and > K = 4: every neuron up to order, the activation and the width read off the answers."""
    truth = random_smooth_ffn(5, 12, 4, activation=activation, bias=bias, seed=3)
    oracle = Oracle(truth, 5, precision="float64")
    res = extract_ffn_any(oracle, seed=1, bias=bias)
    assert res.model.kind == "smooth_ffn"
    assert res.details["activation"] == activation and res.details["hidden"] == 12
    assert res.passed and res.check.error < 1e-9
    match = neuron_match(truth, res.model)
    assert match["matched_one_to_one"]
    assert match["first_layer_error"] < 1e-8 and match["second_layer_error"] < 1e-8
    assert sum(res.queries_by_phase.values()) == res.queries == oracle.queries - res.check.queries
    if not bias:
        assert np.all(res.model.b1 == 0) and np.all(res.model.b2 == 0)


def test_estimate_is_the_plan_when_width_and_activation_are_given():
    truth = random_smooth_ffn(4, 8, 3, seed=5)
    oracle = Oracle(truth, 4, precision="float64")
    res = extract_smooth_ffn(oracle, seed=0, activation="gelu", hidden=8)
    est = estimate_queries("ffn", 4, hidden=8, outputs=3, activation="gelu")
    assert est.queries == res.queries + res.check.queries
    assert res.passed


def test_float32_answers_within_1e3():
    truth = random_smooth_ffn(6, 12, 6, seed=4, dtype="float32")
    oracle = Oracle(truth, 6, precision="float32")
    res = extract_ffn_any(oracle, seed=0)
    X = np.random.default_rng(1).standard_normal((200, 6))
    y = truth.with_dtype("float64").forward(X)
    err = np.linalg.norm(res.model.forward(X) - y) / np.linalg.norm(y - y.mean(axis=0))
    assert res.passed and err < 1e-3
    assert res.details["activation"] in ("gelu", "gelu_tanh")  # float32 rounding hides their 1e-3 difference


def test_relu_answers_go_to_the_relu_learner():
    truth = random_relu_net(6, 10, bias=True, outputs=3, seed=1)
    oracle = Oracle(truth, 6, precision="float64")
    res = extract_ffn_any(oracle, seed=0)
    assert res.model.kind == "relu_net" and res.passed
    assert res.details["activation_test"]["smooth"] is False
    assert res.queries_by_phase["activation_test"] > 0
    assert sum(res.queries_by_phase.values()) == res.queries == oracle.queries - res.check.queries


def test_wrong_activation_given_fails_the_check():
    """A SiLU FFN learned as GELU cannot pass: the check is not a formality."""
    truth = random_smooth_ffn(5, 8, 5, activation="silu", seed=6)
    res = extract_smooth_ffn(Oracle(truth, 5, precision="float64"), seed=0, activation="gelu", polish_rounds=1)
    assert not res.passed


def test_registry_and_cli(tmp_path, capsys):
    assert "activation" in registry.learner("ffn").option_names
    target, out = tmp_path / "t.npz", tmp_path / "r.npz"
    assert main(["target", "smooth-ffn", "--d", "4", "--m", "8", "--outputs", "3", "--activation", "silu",
                 "--out", str(target)]) == 0
    assert main(["extract", "--target", str(target), "--method", "ffn", "--activation", "silu", "--hidden", "8",
                 "--out", str(out), "--quiet"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["kind"] == "smooth_ffn" and summary["passed"]
    X = np.random.default_rng(2).standard_normal((20, 1, 4))
    assert np.allclose(load_model(out)(X), load_model(target)(X), atol=1e-9)


def test_wide_ffns_get_a_capped_polish_and_extrapolated_derivatives():
    """MiniLM's 384 → 1536 → 384: the default polish would cost ~2e14 flops; one capped round instead, and the
    factors' differences extrapolated (twice their queries); small FFNs keep the full polish."""
    from attnprobe.learners.smooth_ffn.learner import GN_ITERATIONS, GN_ROUNDS, POLISH_WORK, plan, polish_settings

    assert polish_settings(16, 16, 48) == (1, GN_ROUNDS, GN_ITERATIONS)
    rich, rounds, iters = polish_settings(384, 384, 1536)
    assert (rich, rounds) == (2, 1) and 1 <= iters < GN_ITERATIONS
    N = plan(384, 384, 1536)["answers"]
    assert 4.0 * N * 1536 * (385 + 2 * 384) * iters <= POLISH_WORK
    assert plan(384, 384, 1536)["factors"] == 2 * plan(384, 384, 1536, richardson=1)["factors"]


def test_richardson_differences_start_closer():
    """Without the polish, the derivative-based start of extrapolated differences is closer to the answers."""
    truth = random_smooth_ffn(6, 12, 6, seed=8)
    starts = []
    for levels in (1, 2):
        oracle = Oracle(truth, 6, precision="float64")
        res = extract_smooth_ffn(oracle, seed=0, activation="gelu", hidden=12, polish_rounds=0, richardson=levels)
        starts.append(res.details["polish_residuals"][0])
        assert res.queries_by_phase["factors"] == levels * plan_factors(6, 6, 12)
    assert starts[1] < starts[0] / 10


def plan_factors(d, K, m):
    from attnprobe.learners.smooth_ffn.learner import plan

    return plan(d, K, m, richardson=1)["factors"]


@pytest.mark.parametrize("gated", [False, True])
def test_low_precision_forward_rounds_in_float32(gated):
    """Both smooth models emulate a float32 forward pass through one shared forward (ActivationFFN.forward,
    affine_in): the answers are float32 numbers, within float32 rounding of the float64 function, and not equal to
    it."""
    from attnprobe.targets import random_gated_ffn

    make = random_gated_ffn if gated else random_smooth_ffn
    truth = make(16, 32, 8, seed=3, dtype="float32")
    X = np.random.default_rng(0).standard_normal((200, 16))
    y32, y64 = truth.forward(X), truth.with_dtype("float64").forward(X)
    assert np.array_equal(y32.astype(np.float32).astype(np.float64), y32)
    err = np.abs(y32 - y64).max() / np.abs(y64).max()
    assert 0 < err < 64 * np.finfo(np.float32).eps


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_chosen_on_a_subsample_then_fitted_on_all_points(name):
    """pick_activation compares the candidates on SELECT_POINTS points, then fits the winner on all of them: on
    exact curves μ σ'(λ t + b) at more points than the subsample it names the true σ and recovers (λ, b, μ)."""
    from attnprobe.learners.smooth_ffn.neurons import SELECT_POINTS, fit_curves, pick_activation

    rng = np.random.default_rng(5)
    m, n = 12, 3 * SELECT_POINTS
    lam, b, mu = rng.uniform(0.5, 2, m) * rng.choice([-1, 1], m), rng.uniform(-1, 1, m), rng.uniform(0.5, 2, m)
    t = rng.standard_normal((m, n))
    p = mu[:, None] * ACTIVATIONS[name].d1(lam[:, None] * t + b[:, None])
    found, fit, scores = pick_activation(p, t, True, rng, tuple(ACTIVATIONS))
    assert found == name and set(scores) == set(ACTIVATIONS)
    for key, truth in (("lam", lam), ("b", b), ("mu", mu)):
        assert np.max(np.abs(fit[key] - truth)) < 1e-8
    assert fit["res"].shape == (m,) and np.max(fit["res"]) < 1e-10
    # with noise the winner's fit is the least-squares fit over all points, not over the subsample
    noisy = p + 1e-5 * rng.standard_normal(p.shape)
    found, fit, _ = pick_activation(noisy, t, True, rng, tuple(ACTIVATIONS))
    full = fit_curves(noisy, t, ACTIVATIONS[name], True, rng)
    assert found == name and np.max(np.abs(fit["lam"] - full["lam"])) < 1e-9


def test_float32_answers_use_extrapolated_differences_from_a_larger_step():
    """On float32 answers a plain second difference carries ~1e-2 error at its best step; three-level Richardson
    from the step chosen for it is an order of magnitude closer to the exact second derivatives."""
    from attnprobe.learners.smooth_ffn.derivatives import (Asker, choose_extrapolated_step, choose_step, richardson,
                                                           second_derivatives)

    truth = random_smooth_ffn(32, 64, 32, seed=3, dtype="float32")
    ask = Asker(Oracle(truth, 32, precision="float32"))
    rng = np.random.default_rng(0)
    h, _ = choose_step(ask, 32, rng, 1.0)
    h_rich, rich_error = choose_extrapolated_step(ask, 32, rng, 1.0)
    assert h_rich > h and rich_error < 1e-2
    X = rng.standard_normal((10, 32))
    U, V = (u / np.linalg.norm(u, axis=1, keepdims=True) for u in rng.standard_normal((2, 2, 32)))
    exact = np.einsum("ni,ci,ei,ki->kcen", ACTIVATIONS["gelu"].d2(X @ truth.W1.T + truth.b1), U @ truth.W1.T,
                      V @ truth.W1.T, truth.W2)

    def error(T):
        return np.linalg.norm(T - exact) / np.linalg.norm(exact)

    plain = error(second_derivatives(ask, X, U, V, h))
    extrapolated = error(richardson(lambda s: second_derivatives(ask, X, U, V, s), h_rich, 3))
    assert extrapolated < plain / 10


def test_float32_answers_of_a_wider_ffn_within_1e3_and_the_estimate_is_the_plan():
    """16 → 48 → 16 GELU answered in float32 (failed its check with plain differences: fresh error 0.24): the
    extrapolated start lets the polish reach the answers' rounding; the estimate counts the extra step queries."""
    truth = random_smooth_ffn(16, 48, 16, seed=64, dtype="float32")
    oracle = Oracle(truth, 16, precision="float32")
    res = extract_smooth_ffn(oracle, seed=0, activation="gelu", hidden=48)
    X = np.random.default_rng(1).standard_normal((500, 16))
    y = truth.with_dtype("float64").forward(X)
    assert res.passed and np.abs(res.model.forward(X) - y).max() / np.abs(y).max() < 1e-3
    assert res.details["coarse_answers"] and res.details["richardson"] == 3
    assert res.check.error <= res.check.tolerance <= 2e-3  # the check bounds the error claimed at float32
    est = estimate_queries("ffn", 16, hidden=48, outputs=16, activation="gelu", precision="float32")
    assert est.queries == res.queries + res.check.queries


def test_gauss_newton_halves_a_step_that_overshoots(monkeypatch):
    """A step twice too long (the Gauss–Newton step doubled) lands as far beyond the answers as the start was
    short of them: the polish keeps its half instead of giving up."""
    from attnprobe.learners.smooth_ffn import polish

    truth = random_smooth_ffn(5, 8, 5, seed=9)
    X = np.random.default_rng(3).standard_normal((200, 5))
    Y = truth.forward(X)
    rng = np.random.default_rng(4)
    start = tuple(p + 1e-4 * rng.standard_normal(p.shape) for p in (truth.W1, truth.b1, truth.W2, truth.b2))
    exact_step = polish._step

    def doubled(*args, **kwargs):
        *parts, used = exact_step(*args, **kwargs)
        return (*(2.0 * p for p in parts), used)

    monkeypatch.setattr(polish, "_step", doubled)
    act = ACTIVATIONS["gelu"]
    _, history, _ = polish.gauss_newton(X, Y, start, act, True, rounds=6, iterations=300)
    assert history[-1] < 1e-8 * history[0]
