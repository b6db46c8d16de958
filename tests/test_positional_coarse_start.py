"""The averaged stages of the coarse-answer RoPE start (learners/positional/coarse.py, docs/positional.md "Coarse
answers"): each against the truth of a random RoPE layer, on float32 answers where the stage averages rounding, and
on float64 answers where the stage must be exact."""

import math

import numpy as np
import pytest

from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.positional.coarse import (COARSE_STEP, LOGIT_OFFSETS, SETTINGS, coarse_values, log_weights,
                                                  logit_maps, pair_derivative)
from attnprobe.learners.positional.heads import STEP, head_directions, match
from attnprobe.oracles.base import Oracle
from attnprobe.targets import random_rope_attention


def _direction_error(oracle, truth, jacobian, eta):
    rng = np.random.default_rng(0)
    z = rng.standard_normal(oracle.d)
    E = random_orthogonal(oracle.d, rng)[:12]
    W, _, _ = head_directions(oracle, z, E, settings=SETTINGS, eta=eta * math.sqrt(oracle.d), rank=truth.H,
                              noise=0.0, rng=rng, jacobian=jacobian)
    V = truth.value_maps()
    true = np.stack([V[h] @ z for h in range(truth.H)], axis=1)
    true /= np.linalg.norm(true, axis=0)
    return float(np.max(np.linalg.norm(match(true, W) - true, axis=0)))


def test_chebyshev_pair_probe_averages_float32_rounding():
    """On float32 answers the fitted slope gives each head's direction ``V_h z`` far closer than Richardson's three
    steps (measured 10× at d = 32 in benchmarks/positional_coarse_start.py)."""
    truth = random_rope_attention(32, 2, 1, seed=5)
    served = truth.with_dtype("float32")  # computed in float32, as a served module
    oracle = Oracle(served, 32, precision="float32")
    fitted = _direction_error(oracle, truth, pair_derivative, COARSE_STEP)
    from attnprobe.learners.positional.heads import pair_jacobian

    richardson = _direction_error(Oracle(served, 32, precision="float32"), truth, pair_jacobian, STEP)
    assert fitted < 3e-4 and fitted < richardson / 3


def test_pair_derivative_is_the_slope_on_float64_answers():
    truth = random_rope_attention(16, 2, 1, seed=2)
    oracle = Oracle(truth, 16)
    assert _direction_error(oracle, truth, pair_derivative, COARSE_STEP) < 1e-8


def test_values_averaged_on_float32_answers():
    truth = random_rope_attention(32, 2, 1, seed=5)
    oracle = Oracle(truth.with_dtype("float32"), 32, precision="float32")
    M, c = coarse_values(oracle, np.random.default_rng(0), math.sqrt(32))
    exact = truth.value_maps().sum(axis=0)
    assert np.linalg.norm(M - exact) / np.linalg.norm(exact) < 1e-5 and np.abs(c).max() < 1e-5


def test_logit_maps_recover_every_offset_from_exact_head_coordinates():
    """With each head's exact output coordinates and float64 answers, the log-weights, the row spaces, the reduced
    matrices and the rotation's commutant give ``B_h(δ)`` at offsets measured and beyond (−200)."""
    d, H = 16, 2
    truth = random_rope_attention(d, H, 1, seed=3)
    oracle = Oracle(truth, d)
    G = np.repeat(truth.Wv, H, axis=0)
    Wq, Wk, count = logit_maps(oracle, np.random.default_rng(1), truth.Wo, G, np.zeros(d), truth.inv_freq, 1.0)
    assert count == oracle.queries
    from attnprobe.models.positional import rotation_matrix

    for h in range(H):
        for delta in (-1, -7, -200):
            B = Wq[h].T @ rotation_matrix(float(delta), truth.inv_freq, d // H) @ Wk[h]
            exact = truth.logit_matrix(h, delta)
            assert np.linalg.norm(B - exact) / np.linalg.norm(exact) < 1e-6


def test_log_weights_are_the_logits_against_a_zero_key():
    d, H = 16, 2
    truth = random_rope_attention(d, H, 1, seed=3)
    rng = np.random.default_rng(0)
    chosen = LOGIT_OFFSETS[:4] + LOGIT_OFFSETS[-1:]  # 5 keys, the query and the zeros: 7 weights in d_h = 8
    toks = rng.standard_normal((3, len(chosen) + 1, d))
    offs = np.tile(chosen, (3, 1))
    ell = log_weights(Oracle(truth, d), truth.Wo, np.repeat(truth.Wv, H, axis=0), np.zeros(d), toks, offs, 128)
    for h in range(H):
        exact = [[toks[b, -1] @ truth.logit_matrix(h, int(o)) @ toks[b, j]
                  for j, o in enumerate(list(chosen) + [0])] for b in range(3)]
        assert np.allclose(ell[:, h], exact, atol=1e-8)


def _value_maps(precision, per=6, seed=5):
    from attnprobe.learners.positional.coarse import coarse_output_spaces, coarse_value_maps

    truth = random_rope_attention(16, 2, 1, seed=seed)
    oracle = Oracle(truth.with_dtype(precision), 16, precision=precision)
    rng = np.random.default_rng(0)
    M, _ = coarse_values(oracle, rng, 4.0)
    rough, _ = coarse_output_spaces(oracle, M, rng, 2)
    V = coarse_value_maps(oracle, M, rough, rng, 2, per=per)
    exact = truth.value_maps()
    err = max(min(np.linalg.norm(V[h] - exact[g]) / np.linalg.norm(exact[g]) for g in range(2)) for h in range(2))
    return err, oracle, per


def test_value_maps_from_independent_queries_on_float32_answers():
    """Each head's ``V_h`` from the pair probe's directions at random queries, scaled to sum to ``M z``: within
    1e-3 of the truth on float32 answers (measured 3e-5 at d = 32); exact up to the fit's truncation on float64."""
    err, oracle, per = _value_maps("float32")
    assert err < 1e-3
    exact64, _, _ = _value_maps("float64")
    assert exact64 < 1e-5  # the stage itself is exact up to the Chebyshev fit's truncation


def test_reliability_weights_keys_far_below_a_zero_key_less():
    from attnprobe.learners.positional.coarse import reliability

    w = reliability(np.array([-3.0, -1.0, 0.0, 2.0, np.log(0.5)]))
    assert np.allclose(w, [np.exp(-3.0), np.exp(-1.0), 1.0, 1.0, 0.5])


def _wide_start(settings):
    """Logit maps of a wide layer (d = 80, 5 heads of d_h = 16: ``d_h·d`` above ``DENSE_ALS``) from float32 answers,
    each head's value map moved 1e-4 (relative) from the truth's, as the value-map stage leaves it; the start's
    largest function error over lengths up to 128."""
    from attnprobe.learners.positional.coarse import split_value_maps
    from attnprobe.models.compare import function_error_over_lengths
    from attnprobe.models.positional import PositionalAttention

    d, H = 80, 5
    truth = random_rope_attention(d, H, 1, seed=4)
    rng = np.random.default_rng(1)
    V = truth.value_maps()
    V = V + 1e-4 * np.linalg.norm(V, axis=(1, 2), keepdims=True) * rng.standard_normal(V.shape) / d
    Cb, G = split_value_maps(V, truth.value_maps().sum(axis=0))
    oracle = Oracle(truth.with_dtype("float32"), d, precision="float32")
    Wq, Wk, count = logit_maps(oracle, rng, Cb, G, np.zeros(d), truth.inv_freq, 1.0, **settings)
    start = PositionalAttention(Wq, Wk, G, Cb, position="rope", inv_freq=truth.inv_freq, scale=1.0)
    return function_error_over_lengths(start, truth, np.random.default_rng(5), (2, 17, 128)), count


def test_wide_heads_get_more_key_sets_and_no_dense_als():
    """``logit_settings``: narrow heads keep ``logit_maps``' defaults (the d = 32 route as measured); wide ones
    (``d_h·d`` above ``DENSE_ALS``) ask ``LOGIT_EXTRA·d`` more sequences per regression, more key sets with them,
    and skip the dense alternating least squares."""
    from attnprobe.learners.positional.coarse import DENSE_ALS, LOGIT_EXTRA, logit_map_queries, logit_settings

    assert logit_settings(32, 16) == {} and 16 * 64 <= DENSE_ALS
    wide = logit_settings(128, 16)
    assert wide == {"extra": LOGIT_EXTRA * 128, "rounds": 0}
    more = logit_map_queries(128, 16, extra=wide["extra"]) - logit_map_queries(128, 16)
    assert more > 10 * logit_map_queries(128, 16)  # 24,320 sequences where the narrow settings ask 1,664


@pytest.mark.slow
def test_wide_heads_logit_maps_hold_value_maps_off():
    """Wide layers' logit maps (``logit_settings``) from value maps 1e-4 off: the start near the rounding's, where
    the narrow settings (extra 16, no ALS) leave it 0.58 off (d = 80, 5 heads; measured at d = 128, 8/2: 1.3e-3 …
    3.7e-3 against 0.28 … 0.92). ~50 s."""
    from attnprobe.learners.positional.coarse import logit_map_queries, logit_settings

    settings = logit_settings(80, 16)
    err, count = _wide_start(settings)
    assert count == logit_map_queries(80, 16, extra=settings["extra"])
    assert err < 2e-2
