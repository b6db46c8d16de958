"""The tokens' scale for small logits (learners/positional/token_scale.py): the scaled view is the same layer with
larger logits, the logits' size is read from two-token answers, and the coarse start of a layer at small weights
(``transformers``' default initializer_range at small widths) lands where one at 1/√d weights does."""

import dataclasses
import math

import numpy as np
import pytest

from attnprobe.errors import RecoveryError
from attnprobe.learners.positional.token_scale import (CALIBRATED_LOGIT, SMALL_LOGIT, ScaledTokens,
                                                       logit_difference, pair_sequences, token_scale, unscale)
from attnprobe.oracles.base import Oracle
from attnprobe.targets import random_rope_attention


def _small(d=16, t=0.1, seed=3):
    m = random_rope_attention(d, 2, 1, seed=seed)
    bo = np.random.default_rng(seed).standard_normal(d)
    return dataclasses.replace(m, Wq=m.Wq * t, Wk=m.Wk * t, bo=bo)


@pytest.mark.parametrize("biases", [False, True])
def test_the_scaled_view_is_the_layer_with_logits_s_squared_larger_and_unscale_inverts_it(biases):
    m, s = _small(), 7.0
    if biases:  # q/k biases stay, the value bias shrinks with the tokens (Qwen2)
        r = np.random.default_rng(4)
        m = dataclasses.replace(m, bq=r.standard_normal(m.bq.shape), bk=r.standard_normal(m.bk.shape),
                                bv=r.standard_normal(m.bv.shape))
    X = np.random.default_rng(0).standard_normal((5, 6, 16))
    view = ScaledTokens(Oracle(m, 16), s)
    learned = dataclasses.replace(m, Wq=m.Wq * s, Wk=m.Wk * s, bv=m.bv / s, bo=m.bo / s)  # what a route learns
    assert np.allclose(view(X), learned(X), rtol=1e-12, atol=1e-12)
    assert np.allclose(unscale(learned, s)(X), m(X), rtol=1e-12, atol=1e-12)
    assert view.d == 16 and view.queries == 5  # the oracle's own width and count (sequences)


@pytest.mark.parametrize("t", [0.03, 0.1])
def test_the_logits_size_is_read_and_brought_to_the_calibrated_size(t):
    m = _small(t=t)
    oracle = Oracle(m, 16)
    M, c = m.value_maps().sum(axis=0), m.bo
    rho = math.sqrt(16)
    s, flat = token_scale(oracle, M, c, np.random.default_rng(1), rho)
    assert flat < SMALL_LOGIT and s > 1
    half = logit_difference(oracle, M, c, pair_sequences(np.random.default_rng(2), 16, rho / 2))
    assert 3 < flat / half < 5  # logits quadratic in the tokens
    view = ScaledTokens(oracle, s)
    read = logit_difference(view, M, c / s, pair_sequences(np.random.default_rng(3), 16, rho))
    assert 0.5 * CALIBRATED_LOGIT < read < 2 * CALIBRATED_LOGIT


def test_a_layer_at_1_over_root_d_weights_is_not_rescaled():
    m = random_rope_attention(16, 2, 1, seed=3)
    oracle = Oracle(m, 16)
    s, flat = token_scale(oracle, m.value_maps().sum(axis=0), m.bo, np.random.default_rng(1), 4.0)
    assert s == 1.0 and flat >= SMALL_LOGIT


def test_the_coarse_start_of_a_layer_at_small_weights_lands_as_at_1_over_root_d(monkeypatch):
    """d = 16, 2/1 heads, W_Q and W_K at a tenth of 1/√d (median logit difference ~0.01 at tokens of norm √d),
    float32 answers: with the tokens scaled up the start is as close as a 1/√d layer's; without it (the scale-up
    switched off) the heads do not separate."""
    from attnprobe.learners.positional import token_scale as ts
    from attnprobe.learners.positional.coarse import coarse_queries, coarse_start
    from attnprobe.models.compare import function_error_over_lengths

    truth = _small(t=0.1)
    oracle = Oracle(truth.with_dtype("float32"), 16, precision="float32")
    model, measured = coarse_start(oracle, 2, np.random.default_rng(0), base=10000.0)
    assert measured["tokens_scaled_up"] > 3
    assert oracle.queries == coarse_queries(16, 2)
    assert function_error_over_lengths(model, truth, np.random.default_rng(1), (2, 17, 64)) < 1e-2
    monkeypatch.setattr(ts, "SMALL_LOGIT", 0.0)  # the scale-up switched off
    try:  # refused here ("the heads did not separate"); on another CPU's rounding at least far off
        flat, _ = coarse_start(Oracle(truth.with_dtype("float32"), 16, precision="float32"), 2,
                               np.random.default_rng(0), base=10000.0)
    except RecoveryError:
        return
    assert function_error_over_lengths(flat, truth, np.random.default_rng(1), (2, 17, 64)) > 1e-2


class _Folder:
    """A layer as a Hugging Face oracle declares it: its heads, no q/k biases, and its config's rotation."""

    position_term, qk_biases, heads = "rope", False, 2

    def __init__(self, model, declare: bool):
        self.model = model
        if declare:
            self.rotary_frequencies = np.asarray(model.inv_freq)

    def __call__(self, X):
        return self.model(X)


def test_a_declared_rotation_is_the_start_and_is_held_through_the_polish():
    """A folder's config names its rotation (public, as its heads): the coarse route starts from it and its polish
    plan holds it, where without it the frequencies start from base 1e4 and the polish fits them (d = 16, 2/1 heads
    at a tenth of 1/√d, base 500: the lowest frequencies are weakly determined by the answers)."""
    from attnprobe.learners.positional.coarse import extract_coarse_positional
    from attnprobe.models.compare import function_error_over_lengths
    from attnprobe.models.positional import rope_frequencies

    truth = dataclasses.replace(_small(t=0.1), inv_freq=rope_frequencies(8, 500.0))
    errors = {}
    for declare in (True, False):
        oracle = Oracle(_Folder(truth.with_dtype("float32"), declare), 16, precision="float32")
        res = extract_coarse_positional(oracle, heads=None, seed=0, check=False)
        plan = res.details["polish_plan"]
        assert plan["frequencies"] is not declare
        assert res.details["frequencies"] == ("declared" if declare else "from base")
        errors[declare] = function_error_over_lengths(res.model, truth, np.random.default_rng(1), (2, 17, 64))
        if declare:
            assert np.array_equal(res.model.inv_freq, truth.inv_freq)
        else:
            assert np.allclose(res.model.inv_freq, rope_frequencies(8, 10000.0))
    assert errors[True] < 1e-2 < errors[False]


@pytest.mark.slow
def test_the_route_polishes_with_a_declared_rotation_held():
    """The positional route end to end on an oracle declaring its rotation: the polish keeps the declared
    frequencies (the plan's flag reaches the hook) and the result passes its check."""
    from attnprobe.learners.positional.route import extract_any_positional
    from attnprobe.models.positional import rope_frequencies

    truth = dataclasses.replace(_small(t=0.1), inv_freq=rope_frequencies(8, 500.0))
    oracle = Oracle(_Folder(truth.with_dtype("float32"), True), 16, precision="float32")
    res = extract_any_positional(oracle, seed=0, polish="always", polish_sequences=200)
    assert res.details["polish"]["ran"] and np.array_equal(res.model.inv_freq, truth.inv_freq)
    assert res.check.passed
