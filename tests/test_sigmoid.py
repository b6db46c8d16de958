"""The one two-row sigmoid inversion (eq. 1) and its error models: what it returns is within the error it states."""

import numpy as np
from hypothesis import given, settings, strategies as st

from attnprobe.learners.head.sigmoid import AdditiveError, RoundingError, invert_two_row, measure_logits
from attnprobe.oracles import Oracle
from attnprobe.targets import random_head

logit_values = st.floats(-12.0, 12.0)
value = st.floats(-1e3, 1e3).filter(lambda x: abs(x) > 1e-3)


def _alpha(t):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-t))


@settings(max_examples=200, deadline=None)
@given(t=logit_values, y0=value, y1=value, seed=st.integers(0, 2**31))
def test_rounded_answers_give_the_logit_within_its_stated_noise(t, y0, y1, seed):
    if abs(y1 - y0) < 1e-2 * max(abs(y0), abs(y1)):
        return
    eps = 2.0**-23
    rng = np.random.default_rng(seed)
    y = _alpha(t) * y1 + (1 - _alpha(t)) * y0
    # every answer and value off by at most one rounding (half the spacing)
    yr, y0r, y1r = (x * (1 + 0.5 * eps * rng.uniform(-1, 1)) for x in (y, y0, y1))
    lg = invert_two_row(np.array([yr]), np.array([y0r]), np.array([y1r]), RoundingError(eps))
    if lg.saturated[0]:  # only a weight within a few roundings of 0 or 1 may be flagged
        assert min(_alpha(t), 1 - _alpha(t)) < 16 * eps * (abs(y) + abs(y0) + abs(y1)) / abs(y1 - y0)
        assert np.isnan(lg.values[0]) and lg.noise[0] == np.inf
        return
    assert not lg.outside[0]
    assert abs(lg.values[0] - t) <= 2 * lg.noise[0] + 1e-12  # first-order bound, with room for its second order


@settings(max_examples=200, deadline=None)
@given(t=logit_values, y0=value, y1=value, tau=st.floats(1e-9, 1e-2), seed=st.integers(0, 2**31))
def test_additive_error_bounds_the_weight(t, y0, y1, tau, seed):
    model = AdditiveError(tau, 2.0**-52)
    if abs(y1 - y0) < 100 * model(max(abs(y0), abs(y1))):
        return
    rng = np.random.default_rng(seed)
    y = _alpha(t) * y1 + (1 - _alpha(t)) * y0
    noisy = y + tau * rng.uniform(-1, 1)
    lg = invert_two_row(np.array([noisy]), np.array([y0]), np.array([y1]), model)
    assert abs(lg.p[0] - _alpha(t)) <= lg.err[0] * (1 + 1e-9)  # the error of α is what the model says
    # the worst case the model allows: the answer off by its bound, the two values by half theirs, against it
    s = np.sign(y1 - y0)
    worst = invert_two_row(np.array([y + s * model(y)]), np.array([y0 - s * 0.5 * model(y0)]),
                           np.array([y1 - s * 0.5 * model(y1)]), model)
    assert abs(worst.p[0] - _alpha(t)) <= worst.err[0] * 1.05
    if not lg.saturated[0]:
        assert 0 < lg.p[0] < 1 and np.isfinite(lg.raw[0])
    clipped = invert_two_row(np.array([noisy]), np.array([y0]), np.array([y1]), model, clip=True)
    assert np.isfinite(clipped.raw[0]) and 0 < clipped.p[0] < 1  # clipping always yields a logit


def test_answers_no_convex_combination_gives_are_flagged_outside():
    y0, y1 = np.array([1.0, 1.0]), np.array([2.0, 2.0])
    lg = invert_two_row(np.array([2.5, 0.5]), y0, y1, RoundingError(2.0**-52))
    assert lg.outside.all() and lg.saturated.all()


def test_measured_logits_of_a_head_are_its_bilinear_form():
    h = random_head(6, seed=2)
    o = Oracle(h, 6)
    rng = np.random.default_rng(0)
    A, b = 0.3 * rng.standard_normal((10, 6)), 0.3 * rng.standard_normal(6)
    lg = measure_logits(o, A, b, h.v, h.c)
    assert not lg.saturated.any() and o.queries == 10
    assert np.allclose(lg.values, A @ (h.W @ b + h.u), rtol=0, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(t=st.floats(-800.0, 800.0), y0=value, y1=value, eps_bits=st.sampled_from([52, 23, 10]))
def test_a_saturated_weight_proves_its_logit_at_least_beyond(t, y0, y1, eps_bits):
    """``beyond`` never overstates a saturated logit, so shrinking by beyond/target never undershoots the target."""
    if abs(y1 - y0) < 1e-2 * max(abs(y0), abs(y1)):
        return
    eps = 2.0**-eps_bits
    a = _alpha(t)
    y = np.array([a * y1 + (1 - a) * y0])
    y = y * (1 + 0.5 * eps)  # one rounding
    lg = invert_two_row(y, np.array([y0]), np.array([y1]), RoundingError(eps))
    if lg.saturated[0] and not lg.outside[0]:
        assert lg.beyond[0] <= abs(t) + 1e-9
    else:
        assert lg.beyond[0] == 0.0


def test_beyond_is_tight_near_the_saturation_threshold():
    """A sweep across the logits where weights start to saturate: beyond stays below |logit| but within a few
    units of it at the threshold (it is what sets how far a saturated probe shrinks)."""
    y0, y1 = np.array([0.3]), np.array([1.7])
    for bits in (52, 23, 10):
        eps = 2.0**-bits
        t = np.arange(1.0, 45.0, 0.01)
        a = _alpha(t)
        y = a * y1 + (1 - a) * y0
        lg = invert_two_row(y, np.broadcast_to(y0, y.shape), np.broadcast_to(y1, y.shape), RoundingError(eps))
        sat = lg.saturated
        assert sat.any() and not sat.all()
        assert np.all(lg.beyond[sat] <= t[sat])
        first = t[sat][0]  # the smallest saturated logit: beyond is close to it there
        assert first - lg.beyond[sat][0] < 3.0
