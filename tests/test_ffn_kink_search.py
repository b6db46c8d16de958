"""The kink search on float64 answers: a kink found next to an interval's end is bracketed 1000-fold per round
(zoom), and a biased net's search line lies at norm √d so its kinks spread along it."""

import numpy as np
import pytest

from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.ffn.kinks import Stencil, meeting_point
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


def test_the_search_costs_a_bounded_number_of_queries_per_kink():
    """Without the zoom an end placed on a kink was bisected ~25 times (35–45 queries per kink at d = 8, m = 32,
    varying with where the kinks fell); with it every seed stays well below that, and every neuron is found."""
    per_kink = []
    for seed in range(4):
        net = random_relu_net(8, 32, seed=1032 + seed, bias=True)
        o = Oracle(net, 8)
        res = extract_ffn(o, seed=seed)
        assert res.details["neurons_found"] == 32 and res.check.passed
        per_kink.append(res.queries_by_phase["kink_search"] / 32)
    assert max(per_kink) < 26, per_kink
    assert np.mean(per_kink) < 22, per_kink


def test_the_search_line_of_a_biased_net_spreads_its_kinks():
    """On float64 answers a biased net is searched along a line at norm √d: its kinks (where the hyperplanes
    ``aᵀx + b = 0`` cross the line) do not crowd near the line's far ends, where the regions are thin and each is
    measured twice. On the unit line a third of them lay within 5 % of the far ends at d = 784."""
    from attnprobe.learners.ffn.learner import _line_scale, _segments

    def near_far_ends(net, scale, seed):
        N = np.vstack([net.A, net.b[None, :]])
        near = []
        for i, seg in enumerate(_segments(net.A.shape[0], True, np.random.default_rng(seed), 1e6, scale)):
            t = -(seg.base @ N) / (seg.direction @ N)
            near.append(np.abs(t[np.abs(t) < 1] - (-1 if i == 0 else 1)) < 0.05)  # far ends: t = −1, then +1
        return float(np.mean(np.concatenate(near)))

    assert _line_scale(784, True, False) == pytest.approx(28.0) and _line_scale(784, False, False) == 1.0
    assert _line_scale(784, True, True) == 1.0  # float32 answers keep the unit line
    for seed in range(3):
        net = random_relu_net(784, 64, seed=seed, bias=True)
        assert near_far_ends(net, _line_scale(784, True, False), seed) < 0.1
        assert near_far_ends(net, 1.0, seed) > 0.25
