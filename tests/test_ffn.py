"""Bias-free ReLU networks and the critical-point FFN learner (the A_FFN of Sec. 4.1)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnprobe.errors import BudgetExceededError, ConfigError, UnidentifiableError
from attnprobe.learners.ffn import extract_ffn
from attnprobe.models import ReLUNet, load_model, neuron_errors, save_model
from attnprobe.oracles import Oracle
from attnprobe.targets import random_relu_net


def run(net, seed=0, **kw):
    o = Oracle(net, net.d)
    res = extract_ffn(o, seed=seed, **{"bias": False, **kw})
    return o, res


# ------------------------------------------------------------------------------------------------ model
def test_forward_matches_definition_and_reads_length_one_sequences():
    rng = np.random.default_rng(0)
    A, w = rng.standard_normal((5, 3)), rng.standard_normal(3)
    net = ReLUNet(A, w)
    x = rng.standard_normal((7, 5))
    want = np.array([w @ np.maximum(A.T @ xi, 0) for xi in x])
    np.testing.assert_allclose(net.forward(x), want, rtol=1e-14)
    np.testing.assert_allclose(net(x[:, None, :]), want, rtol=1e-14)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 100.0))
def test_positively_homogeneous(seed, lam):
    net = random_relu_net(6, 9, seed=seed % 1000)
    x = np.random.default_rng(seed).standard_normal((4, 6))
    np.testing.assert_allclose(net.forward(lam * x), lam * net.forward(x), rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_odd_part_is_linear_in_v(seed):
    net = random_relu_net(5, 11, seed=seed % 1000)
    x = np.random.default_rng(seed).standard_normal((4, 5))
    np.testing.assert_allclose(net.forward(x) - net.forward(-x), x @ (net.A @ net.w_o), rtol=1e-10, atol=1e-12)


def test_bad_inputs_raise_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="d×m"):
        ReLUNet(np.ones((3, 2)), np.ones(3))
    with pytest.raises(ConfigError, match="finite"):
        ReLUNet(np.full((3, 2), np.nan), np.ones(2))
    net = random_relu_net(3, 2)
    with pytest.raises(ConfigError, match="length-1"):
        net(np.ones((1, 2, 3)))
    path = save_model(net, tmp_path / "net.npz")
    back = load_model(path)
    assert back.kind == "relu_net"
    np.testing.assert_array_equal(back.A, net.A)


# ------------------------------------------------------------------------------------------------ learner
@pytest.mark.parametrize("d,m", [(8, 4), (8, 8), (16, 8), (16, 16)])
def test_exact_recovery_when_neurons_are_independent(d, m):
    net = random_relu_net(d, m, seed=d + m)
    o, res = run(net)
    assert res.check.error <= 1e-9
    err = neuron_errors(net.A, net.w_o, res.model.A, res.model.w_o)
    assert err["recovered_neurons"] == m and err["matched_one_to_one"]
    assert err["direction_error"] <= 1e-8 and err["weight_error"] <= 1e-8
    assert res.details["orientation_exact"]
    # every query is counted: the breakdown adds up and the check is counted apart
    assert sum(res.queries_by_phase.values()) == res.queries
    assert o.queries == res.queries + res.check.queries


def test_more_neurons_than_inputs_orientations_from_the_0_1_program():
    net = random_relu_net(8, 32, seed=1)
    o, res = run(net)
    assert res.check.error <= 1e-9
    assert res.details["orientation"].startswith("0/1 program")
    err = neuron_errors(net.A, net.w_o, res.model.A, res.model.w_o)
    assert err["recovered_neurons"] == 32 and err["direction_error"] <= 1e-7


def test_given_v_saves_the_odd_part_queries():
    """The odd part costs what the plan and the estimate charge for it (``odd_part_queries``: 2d), or nothing
    when v is given."""
    from attnprobe.learners.ffn.learner import odd_part_queries

    net = random_relu_net(8, 8, seed=4)
    _, a = run(net)
    _, b = run(net, v=net.A @ net.w_o)
    assert a.queries_by_phase["odd_part"] == odd_part_queries(8) == 16 and "odd_part" not in b.queries_by_phase
    assert b.check.error <= 1e-9


def test_dead_neurons_are_invisible_and_dropped():
    net = random_relu_net(8, 6, seed=5)
    A, w = net.A.copy(), net.w_o.copy()
    A[:, 0] = 0.0  # a = 0: never fires
    w[1] = 0.0  # w = 0: fires into nothing
    dead = ReLUNet(A, w)
    _, res = run(dead)
    assert res.model.m == 4
    assert res.check.error <= 1e-9
    err = neuron_errors(A, w, res.model.A, res.model.w_o)
    assert err["true_neurons"] == 4 and err["direction_error"] <= 1e-8


def test_positively_parallel_neurons_merge_into_one():
    net = random_relu_net(8, 5, seed=6)
    A, w = net.A.copy(), net.w_o.copy()
    A[:, 1] = 2.5 * A[:, 0]
    w[1] = abs(w[1]) * np.sign(w[0])  # same sign: one neuron of weight w0‖a0‖ + w1‖a1‖
    par = ReLUNet(A, w)
    _, res = run(par)
    assert res.model.m == 4
    assert res.check.error <= 1e-9
    err = neuron_errors(A, w, res.model.A, res.model.w_o)
    assert err["true_neurons"] == 4 and err["weight_error"] <= 1e-8


def test_antiparallel_neurons_give_an_equivalent_network_and_say_so():
    net = random_relu_net(8, 5, seed=7)
    A, w = net.A.copy(), net.w_o.copy()
    A[:, 1] = -A[:, 0]  # w0 ReLU(aᵀx) + w1 ReLU(−aᵀx): a hyperplane plus a linear part
    anti = ReLUNet(A, w)
    _, res = run(anti)
    assert res.check.error <= 1e-9
    assert not res.details["orientation_exact"]
    assert any("same function" in n for n in res.notes)


def test_all_dead_network_is_unidentifiable():
    net = ReLUNet(np.ones((4, 2)), np.zeros(2))
    with pytest.raises(UnidentifiableError, match="no neuron"):
        run(net)


def test_budget_is_refused_before_asking():
    net = random_relu_net(8, 8, seed=8)
    o = Oracle(net, 8, budget=20)
    with pytest.raises(BudgetExceededError):
        extract_ffn(o)
    assert o.queries == 0  # refused up front: the plan alone does not fit


def test_bad_options():
    o = Oracle(random_relu_net(4, 2), 4)
    with pytest.raises(ConfigError):
        extract_ffn(o, refine="sometimes")
    with pytest.raises(ConfigError):
        extract_ffn(o, probe_fraction=2.0)


def test_float32_answers_are_polished_to_float32_precision():
    net = random_relu_net(8, 8, seed=2, dtype="float32")
    o = Oracle(net, 8, precision="float32")
    res = extract_ffn(o, seed=0, bias=False)
    assert res.details["polished"]
    assert res.check.error <= 1e-5


# float32 answers with m ≥ 2d used to lose weak neurons: their kinks hid below a 64-rounding tolerance, next to
# strong kinks, or were merged away as finite-difference noise. Which kinks merge depends on the answers' last bits
# (another BLAS kernel's float32 rounding), so the claim is made over several seeds with a stated rate, and every
# result whose check passes must be right. Twice: as the learner runs (neurons the line missed found in the polish
# answers first), and with that step off, so that the repair and whole lines it falls back on are tested too. The
# step off at m = 4d is slow (~23 s, the most expensive default test): the fallback stays asserted at m <= 2d here
# and piece by piece in test_ffn_float32_repair.py. m = 4d with the learner as it runs (~11 s) is in `-m slow` too: the
# default run keeps the found-in-answers step end to end at m <= 2d and piece by piece (test_ffn_found_in_answers.py)
@pytest.mark.parametrize("d,m,seeds,least,found", [
    pytest.param(d, m, seeds, least, found, marks=[pytest.mark.slow] if m == 32 else [],
                 id=f"{d}-{m}-{seeds}-{least}-{'found-in-answers' if found else 'lines-only'}")
    for found in (True, False) for d, m, seeds, least in [(8, 16, 3, 3), (16, 16, 3, 3), (8, 32, 4, 2)]])
def test_float32_answers_keep_weak_neurons(d, m, seeds, least, found, monkeypatch):
    import attnprobe.learners.ffn.mending as ffn_mending

    if not found:
        monkeypatch.setattr(ffn_mending, "FOUND_MAX_WORK", 0.0)
    elif m == 4 * d:
        least = 3  # measured 4 of 4 under the Sandybridge, Haswell, SkylakeX and Zen kernels (2 of 4 without it)
    kept = 0
    for seed in range(seeds):
        net = random_relu_net(d, m, seed=seed, dtype="float32")
        o = Oracle(net, d, precision="float32")
        res = extract_ffn(o, seed=seed, bias=False)
        assert res.details["noise_factor"] == 8.0 and sum(res.queries_by_phase.values()) == res.queries
        X = np.random.default_rng(seed + 9).standard_normal((1000, d))
        fresh = np.linalg.norm(res.model.forward(X) - net.forward(X)) / np.linalg.norm(net.forward(X))
        if res.check.passed:  # "passed" is never wrong, whatever the rounding path
            assert fresh <= 3 * res.check.tolerance
        err = neuron_errors(net.A, net.w_o, res.model.A, res.model.w_o)
        kept += (res.check.error <= 1e-5 and fresh <= 1e-5 and err["within_1e-3"] == m and err["matched_one_to_one"])
    # measured (docs/benchmarks/ffn-float32.md, "FFN learner on float32 answers under other CPU rounding paths"):
    # every seed at m ≤ 2d, 2 of the 4 at m = 4d, under each OpenBLAS kernel and torch setting tried
    assert kept >= least, f"{kept} of {seeds} float32 networks learned with every neuron"


def test_refit_finds_a_weak_kink_next_to_a_strong_one():
    from attnprobe.learners.ffn.kinks import refit_pieces as _refit_pieces

    rng = np.random.default_rng(0)
    strong, weak = -0.0156, -0.0127  # slope jumps 0.76 and 0.0085, 2.9e-3 apart (a float32 case, seed 1)
    # answers as the search leaves them: spread out, and stencils crowding the strong kink
    t = np.sort(np.concatenate([rng.uniform(-1, 1, 60), strong + np.array([-1.2e-4, 1.2e-4, 1e-3, 1.5e-3])]))
    y = 1.4 + 0.3 * t + 0.76 * np.maximum(t - strong, 0) + 0.0085 * np.maximum(t - weak, 0)
    y += 2e-7 * rng.standard_normal(t.size)  # float32-like rounding
    kinks = _refit_pieces(t, y, [strong], tol=6.4e-6)
    assert len(kinks) == 2 and abs(kinks[1] - weak) < 1e-3
    # a straight piece gains nothing
    assert _refit_pieces(t, 1.4 + 0.3 * t + 2e-7 * rng.standard_normal(t.size), [], tol=6.4e-6) == []


def test_cell_signs_follow_the_kink_order_not_the_measuring_point():
    # FFN float64, d = 64, m = 256 (seed 1): a region 1.7e-7 wide sat within the recovered hyperplanes' error, its
    # cell was taken on the wrong side, every move off the line was undone and a 2.5e-7 gradient error stayed
    from attnprobe.learners.ffn.kinks import Segment as _Segment
    from attnprobe.learners.ffn.regions import cell_signs as _cell_signs

    seg = _Segment(np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0]))
    t1, t2 = 0.3, 0.3 + 1e-7
    n1 = np.array([-t1, 1.0, 0.0])  # n·x(t) = t − t1: crosses at t1, growing along the segment
    n2 = -np.array([-t2, 1.0, 0.0])  # crosses at t2, falling along the segment
    N = np.stack([n1, n2], axis=1) / np.linalg.norm(np.stack([n1, n2], axis=1), axis=0)
    regs = [(0, -1.0, t1), (0, t1, t2), (0, t2, 1.0)]
    x_mid = seg.base + 0.5 * (t1 + t2) * seg.direction
    truth = np.sign(x_mid @ N)
    wrong = truth.copy()
    wrong[0] = -wrong[0]  # what a 1e-7 error in the recovered hyperplane does to the sign at the point
    np.testing.assert_array_equal(_cell_signs(regs, [seg], 1, N, wrong), truth)
    np.testing.assert_array_equal(_cell_signs(regs, [seg], 0, N, np.zeros(2)), [-1.0, 1.0])
    np.testing.assert_array_equal(_cell_signs(regs, [seg], 2, N, np.zeros(2)), [1.0, -1.0])


@pytest.mark.slow
def test_thin_regions_at_d64_m256_stay_exact():
    # the benchmark's seed-1 net (python benchmarks/transformer.py --seeds 3): 1.6e-8 before the fix
    net = random_relu_net(64, 256, seed=1000 * 64 + 256 + 1)
    _, res = run(net, seed=1)
    assert res.check.error <= 1e-9


def test_more_lines_keep_neurons_seen_twice_and_drop_merged_kinks():
    """Two lines' jumps (K = 1, D = 6): line 0 merged neurons 3 and 4 into one kink (its jump is their sum) and
    missed nothing else; line 1 saw all five. The first candidate set holds each neuron once and not the merged
    kink; a jump one line alone saw that is no sum of two others is kept as a candidate of its own."""
    from attnprobe.learners.ffn.more_lines import candidate_sets, is_merged_pair

    rng = np.random.default_rng(0)
    n = rng.standard_normal((5, 1, 6))
    noise = lambda: 1e-6 * rng.standard_normal((1, 6))  # noqa: E731 - float32-like measurement error
    line0 = [n[0] + noise(), n[1] + noise(), -n[2] + noise(), n[3] + n[4] + noise()]
    line1 = [n[0] + noise(), n[1] + noise(), n[2] + noise(), n[3] + noise(), -n[4] + noise()]
    J = np.array(line0 + line1)
    line = np.array([0] * 4 + [1] * 5)
    sets, singles = candidate_sets(J, line)
    kept = J[sets[0]]
    N = kept[:, 0, :] / np.linalg.norm(kept[:, 0, :], axis=1, keepdims=True)
    truth = n[:, 0, :] / np.linalg.norm(n[:, 0, :], axis=1, keepdims=True)
    assert kept.shape[0] == 5 and np.all(np.max(np.abs(truth @ N.T), axis=1) > 1 - 1e-9)
    assert not singles[3] and singles[7] and singles[8]  # the merged kink is no single; neurons 3, 4 of line 1 are
    assert is_merged_pair(J[3], J[[7, 8]]) and not is_merged_pair(J[0], J[[7, 8]])
    assert not is_merged_pair(J[3], J[[7]])  # one other jump cannot make a pair


def test_float32_runs_are_reproducible_bit_for_bit():
    net = random_relu_net(8, 16, seed=0, dtype="float32")
    a, b = (extract_ffn(Oracle(net, 8, precision="float32"), seed=0, bias=False) for _ in range(2))
    assert a.queries_by_phase == b.queries_by_phase and a.details == b.details
    np.testing.assert_array_equal(a.model.A, b.model.A)
    np.testing.assert_array_equal(a.model.w_o, b.model.w_o)


@pytest.mark.parametrize("budget", [850, 1000, 1300])
def test_float32_runs_stay_within_any_budget(budget):
    """Further search lines are paid from what the budget leaves: the run ends within it (check included), says
    so when it had to stop looking, or refuses with the typed error; it never overspends."""
    net = random_relu_net(8, 16, seed=0, dtype="float32")
    o = Oracle(net, 8, precision="float32", budget=budget)
    try:
        res = extract_ffn(o, seed=0, bias=False)
    except BudgetExceededError:
        assert o.queries <= budget
        return
    assert o.queries == res.queries + res.check.queries <= budget
    assert sum(res.queries_by_phase.values()) == res.queries
    if res.details.get("more_lines", {}).get("stopped") == "budget":
        assert any("no room for another search line" in n for n in res.notes)
