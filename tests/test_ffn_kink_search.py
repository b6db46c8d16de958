"""The kink search on float64 answers: a kink inside a meeting point's short stencil is pinned from four more
answers (and a close pair is not), a kink found next to an interval's end is bracketed 1000-fold per round
(zoom), and a biased net's search line lies at norm √d so its kinks spread along it."""

import numpy as np
import pytest

from attnprobe.errors import RecoveryError
from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.ffn.kinks import Stencil, meeting_point
from attnprobe.learners.ffn.pinning import pin_candidate, pin_kink
from attnprobe.oracles import Oracle
from attnprobe.targets import random_relu_net


def _stencil(f, t, delta):
    return Stencil(t, f(t), f(t - delta), f(t + delta), delta)


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_kink_within_rounding_of_an_end_is_bracketed_at_the_gap(side):
    """The end stencil straddles the kink, 1e-9 from the end: zoom splits at the 0.1 % gap on that side (the
    bisection without it halves the interval)."""
    k = 1e-9 if side == "left" else 1 - 1e-9
    f = lambda t: t + 2 * max(0.0, t - k)  # noqa: E731
    L, R = _stencil(f, 0.0, 1e-4), _stencil(f, 1.0, 1e-4)
    t, meeting = meeting_point(L, R, zoom=True)
    assert not meeting and t == pytest.approx(1e-3 if side == "left" else 1 - 1e-3)
    assert meeting_point(L, R) == (0.5, False)
    # a kink well inside the interval is still met exactly, with or without zoom
    g = lambda t: t + 2 * max(0.0, t - 0.3)  # noqa: E731
    L, R = _stencil(g, 0.0, 1e-4), _stencil(g, 1.0, 1e-4)
    assert meeting_point(L, R, zoom=True)[0] == pytest.approx(0.3) and meeting_point(L, R)[1]


TOL_F = 64 * np.finfo(float).eps  # the search's value tolerance for answers of size 1


def _pin(f, t_m, delta=1e-4):
    """The pinned stencil of split point ``t_m`` on [0, 1] (None when not pinned), asking ``f`` as the search does."""
    L, M, R = _stencil(f, 0.0, 1e-6), _stencil(f, t_m, delta), _stencil(f, 1.0, 1e-6)
    cand = pin_candidate(L, M, R, TOL_F)
    return None if cand is None else pin_kink(M, cand, [f(t) for t in cand.points()])


@pytest.mark.parametrize("offset", [0.3, -0.3, 1e-6, -1e-6])
def test_a_kink_inside_a_meeting_points_stencil_is_pinned_to_rounding(offset):
    """The kink 0.3 δ or 1e-6 δ to either side of the split point (the meeting point lands on a kink to ~1e-10,
    on either side of it): the pinned stencil sits on the kink to rounding, with the two pieces' slopes."""
    k = 0.4 + offset * 1e-4
    f = lambda t: 0.7 + 0.5 * t + 1.5 * max(0.0, t - k)  # noqa: E731
    X = _pin(f, 0.4)
    assert X is not None
    assert X.t == pytest.approx(k, abs=1e-13)
    assert X.f == pytest.approx(f(k), abs=1e-14)
    assert X.slope_out_left == pytest.approx(0.5, abs=1e-9) and X.slope_out_right == pytest.approx(2.0, abs=1e-9)


@pytest.mark.parametrize("kinks", [(0.2, 0.5), (-0.6, -0.1), (0.05, 0.9), (-0.5, 0.5), (3e-4, 6e-4)])
@pytest.mark.parametrize("changes", [(1.5, 1.0), (1.5, -0.9), (-1.0, 2.0)])
def test_two_kinks_inside_the_stencil_are_not_pinned(kinks, changes):
    """Two neurons crossing the line within one stencil (positions in units of δ around the split point, slope
    changes of either sign; the last pair lies within ε of the guess, between the answers beside it, where the two
    outer lines may meet outside the gap): no single kink explains the answers, so nothing is pinned."""
    k1, k2 = (0.4 + u * 1e-4 for u in kinks)
    f = lambda t: 0.5 * t + changes[0] * max(0.0, t - k1) + changes[1] * max(0.0, t - k2)  # noqa: E731
    assert _pin(f, 0.4) is None


def test_a_pair_closer_than_eps_is_refused_when_its_outer_lines_meet_outside_the_gap():
    """Kinks 3e-10 and 6e-10 past the split point, slope changes +1.5 and −0.9: every answer lies on one of the two
    outer pieces, but those meet 1.5e-10 before the split point, left of an answer of the left piece: refused.
    (A pair of one sign that close meets inside the gap and is taken for one kink, as a search bracketing it to
    its minimal width of 1e-9 would also do.)"""
    k1, k2 = 0.4 + 3e-10, 0.4 + 6e-10
    f = lambda t: 0.5 * t + 1.5 * max(0.0, t - k1) - 0.9 * max(0.0, t - k2)  # noqa: E731
    assert _pin(f, 0.4) is None


def test_a_wide_stencil_or_a_straight_one_is_not_pinned():
    """A midpoint split's wide stencil (δ = w/16) may hold several kinks unseen; a stencil without a slope change
    holds none: neither is pinned."""
    f = lambda t: 0.5 * t + 1.5 * max(0.0, t - 0.41)  # noqa: E731
    assert _pin(f, 0.4, delta=1 / 16) is None
    assert _pin(f, 0.2) is None
    assert _pin(f, 0.41) is not None


def test_an_end_without_a_kink_in_its_stencil_is_met_one_stencil_away():
    """Float64 answers (``tol_f`` given): a wide midpoint stencil (δ = 1/16) whose two slopes agree holds no kink,
    so the lines meet at a kink 1.5 δ from it (without ``tol_f`` only beyond 2 δ: bisection). An end whose stencil
    straddles a kink (0.71 δ, a second one at 1.61 δ) is not clean: the lines' meeting 1.5 δ out is no kink and is
    not used."""
    tol_f, delta = 64 * np.finfo(float).eps, 1 / 16
    f = lambda t: 0.3 + 0.5 * t + 1.5 * max(0.0, t - 1.5 * delta)  # noqa: E731
    L, R = _stencil(f, 0.0, delta), _stencil(f, 1.0, 1e-4)
    t, meeting = meeting_point(L, R, True, tol_f)
    assert meeting and t == pytest.approx(1.5 * delta, abs=1e-12)
    assert meeting_point(L, R, True) == (0.5, False)
    g = lambda t: 0.3 + 0.5 * t - 0.33 * max(0.0, t - 0.71 * delta) - 1.68 * max(0.0, t - 1.61 * delta)  # noqa: E731
    L, R = _stencil(g, 0.0, delta), _stencil(g, 1.0, 1e-4)
    assert meeting_point(L, R, True, tol_f) == (0.5, False)


def test_no_kink_is_looked_for_inside_a_clean_end():
    """Two kinks (0.3, 0.6) whose outer lines meet 5e-5 before the right end: without ``tol_f`` that is taken for a
    kink inside the end's stencil and zoomed at (a split 0.1 % from the end, wasted); with it the end's two equal
    slopes show no kink there, and the interval is left to bisection."""
    c2 = -1.7500937617202148  # the right piece's slope change that puts the outer lines' meeting at 1 − 5e-5
    f = lambda t: 0.5 * t + max(0.0, t - 0.3) + c2 * max(0.0, t - 0.6)  # noqa: E731
    L, R = _stencil(f, 0.0, 1e-4), _stencil(f, 1.0, 1e-4)
    assert meeting_point(L, R, True) == (pytest.approx(0.999), False)
    assert meeting_point(L, R, True, 64 * np.finfo(float).eps) == (0.5, False)


def test_the_search_costs_a_bounded_number_of_queries_per_kink():
    """Without the zoom an end placed on a kink was bisected ~25 times (35–45 queries per kink at d = 8, m = 32);
    with it, kinks still ended at the minimal width (3–10 per run) and cost 16–21 queries each. With kinks pinned
    inside their meeting point's stencil none does, and every seed stays well below that; every neuron found."""
    per_kink, tight = [], 0
    for seed in range(4):
        net = random_relu_net(8, 32, seed=1032 + seed, bias=True)
        o = Oracle(net, 8)
        res = extract_ffn(o, seed=seed)
        assert res.details["neurons_found"] == 32 and res.check.passed
        per_kink.append(res.queries_by_phase["kink_search"] / 32)
        tight += res.details["kinks_at_min_width"]
    assert max(per_kink) < 18, per_kink
    assert np.mean(per_kink) < 15.5, per_kink
    assert tight <= 2


def test_the_search_line_of_a_biased_net_spreads_its_kinks():
    """On float64 answers a biased net is searched along a line at norm √d: its kinks (where the hyperplanes
    ``aᵀx + b = 0`` cross the line) do not crowd near the line's far ends, where the regions are thin and each is
    measured twice. On the unit line a third of them lay within 5 % of the far ends at d = 784."""
    from attnprobe.learners.ffn.line import line_scale, segments

    def near_far_ends(net, scale, seed):
        N = np.vstack([net.A, net.b[None, :]])
        near = []
        for i, seg in enumerate(segments(net.A.shape[0], True, np.random.default_rng(seed), 1e6, scale)):
            t = -(seg.base @ N) / (seg.direction @ N)
            near.append(np.abs(t[np.abs(t) < 1] - (-1 if i == 0 else 1)) < 0.05)  # far ends: t = −1, then +1
        return float(np.mean(np.concatenate(near)))

    assert line_scale(784, True, False) == pytest.approx(28.0) and line_scale(784, False, False) == 1.0
    assert line_scale(784, True, True) == 1.0  # float32 answers keep the unit line
    for seed in range(3):
        net = random_relu_net(784, 64, seed=seed, bias=True)
        assert near_far_ends(net, line_scale(784, True, False), seed) < 0.1
        assert near_far_ends(net, 1.0, seed) > 0.25


def test_answers_noisier_than_their_precision_stop_the_search_with_a_clear_error():
    """A ReLU network whose float64 answers carry 1e-9 relative noise: every chord stays bent and the intervals
    double each round (without a bound the search ran until memory gave out). It stops at MAX_OPEN intervals with
    a RecoveryError that names the cause, well inside a generous budget; declared float32 the same answers are
    learned."""
    rng = np.random.default_rng(0)
    net = random_relu_net(8, 8, seed=3)
    noisy = lambda X: net(X) * (1 + 1e-9 * rng.standard_normal(X.shape[0]))  # noqa: E731
    o = Oracle(noisy, 8, budget=2_000_000)
    with pytest.raises(RecoveryError, match="not piecewise linear to within their precision"):
        extract_ffn(o, seed=0)
    assert o.queries < 200_000
    o = Oracle(noisy, 8, precision="float32")
    assert extract_ffn(o, seed=0).check.passed



def test_float32_answers_far_noisier_than_float32_stop_at_the_minimal_width_bound():
    """Declared float32, answers with 1e-4 relative noise: the intervals shrink to the minimal width (1024 float32
    roundings) instead of doubling without end, and each ends there as a "kink". Without a bound the search took
    ~680k queries and the gradients, orientations and polish of ~1e5 such kinks then ran for minutes and out of
    memory. It stops at MAX_TIGHT with a RecoveryError that names the cause."""
    from attnprobe.learners.ffn.kinks import MAX_TIGHT

    rng = np.random.default_rng(0)
    net = random_relu_net(8, 32, seed=3).with_dtype("float32")
    noisy = lambda X: net(X) * (1 + 1e-4 * rng.standard_normal(X.shape[0]))  # noqa: E731
    o = Oracle(noisy, 8, precision="float32", budget=2_000_000)
    with pytest.raises(RecoveryError, match=f"more than {MAX_TIGHT} intervals at its minimal width"):
        extract_ffn(o, seed=0)
    assert o.queries < 200_000
