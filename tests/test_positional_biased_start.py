"""The every-row route's start for layers with q/k/v biases (``learners/positional/biased_start.py``): the maps read
behind the zero token mapped back to the layer, and the query bias as an augmented column of the absolute-logit fit,
against the module's own weights."""

from dataclasses import replace

import numpy as np
import pytest

from attnprobe.learners.positional.absolute_logits import absolute_logit_samples, fit_logit_maps
from attnprobe.learners.positional.biased_start import start_behind
from attnprobe.learners.positional.coarse import split_value_maps
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention, rope_frequencies
from attnprobe.oracles.base import Oracle


def _layer(d, H, G, seed, *, key_bias=True):
    """A causal RoPE layer with every bias (Qwen2's form), weights N(0, 1/d), biases N(0, 1)."""
    rng = np.random.default_rng(seed)
    dh, s = d // H, 1 / np.sqrt(d)
    return PositionalAttention(
        rng.standard_normal((H, dh, d)) * s, rng.standard_normal((G, dh, d)) * s,
        rng.standard_normal((G, dh, d)) * s, rng.standard_normal((d, H * dh)) * s, bq=rng.standard_normal((H, dh)),
        bk=rng.standard_normal((G, dh)) if key_bias else None, bv=rng.standard_normal((G, dh)) if key_bias else None,
        bo=rng.standard_normal(d) * 0.1, position="rope", inv_freq=rope_frequencies(dh, 1e4), layout="half",
        scale=1.0, causal=True)


def _zero_token(model):
    d = model.d
    W = np.concatenate([model.Wk.reshape(-1, d), model.Wv.reshape(-1, d)])
    return -np.linalg.lstsq(W, np.concatenate([model.bk.ravel(), model.bv.ravel()]), rcond=None)[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_maps_behind_the_zero_token_map_back_to_the_layer(seed):
    """The module's own maps read behind its zero token ``x₀`` (queries augmented by ``b' = W_Q x₀ + b_Q``, keys
    bias-free, the value split and ``c0 = M x₀ + c``) give the layer itself on ``x`` (every bias moved by ``−W x₀``);
    without the query bias column it is far off."""
    truth = _layer(32, 4, 1, seed)
    x0 = _zero_token(truth)
    V, c = truth.value_maps(), truth.output_bias()
    M = V.sum(0)
    Cb, Gh = split_value_maps(V, M)
    bq = np.einsum("hkd,d->hk", truth.Wq, x0) + truth.bq
    Wq = np.concatenate([truth.Wq, bq[..., None]], axis=-1)
    model = start_behind(Wq, truth.Wk, Cb, Gh, c + M @ x0, truth.inv_freq, x0)
    assert function_error_over_lengths(model, truth, np.random.default_rng(5), (1, 2, 17, 64)) < 1e-9
    off = start_behind(np.concatenate([truth.Wq, 0 * bq[..., None]], axis=-1), truth.Wk, Cb, Gh, c + M @ x0,
                       truth.inv_freq, x0)
    assert function_error_over_lengths(off, truth, np.random.default_rng(5), (17, 64)) > 1e-2


class _Rows:
    positions = "causal"

    def __init__(self, model):
        self.model = model

    def __call__(self, X):
        return self.model.every_position(np.asarray(X, dtype=np.float64))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_query_bias_column_fits_the_absolute_logits_of_a_layer_with_a_query_bias(seed):
    """Absolute logits from the float64 rows of a layer whose only biases are a query bias and an output constant
    (what the layer is behind its zero token): the fit with ``query_bias`` leaves under a quarter of the misfit the
    bias-free fit leaves, and its start (the module's own value split) is closer to the module."""
    truth = _layer(16, 2, 1, seed, key_bias=False)
    V = truth.value_maps()
    Cb, Gh = split_value_maps(V, V.sum(0))
    samples = absolute_logit_samples(Oracle(_Rows(truth), 16), Cb, Gh, truth.output_bias(),
                                     np.random.default_rng(seed), sequences=60, length=96, lead=16)
    fits = {}
    for query_bias in (True, False):
        Wq, Wk, misfit = fit_logit_maps(samples, 2, 1, truth.inv_freq, np.random.default_rng(1), rounds=12,
                                        query_bias=query_bias)
        model = replace(truth, Wq=Wq[..., :-1] if query_bias else Wq, Wk=Wk,
                        bq=Wq[..., -1] if query_bias else np.zeros_like(truth.bq))
        fits[query_bias] = misfit, function_error_over_lengths(model, truth, np.random.default_rng(5), (2, 17, 64))
    assert Wq.shape == truth.Wq.shape  # the bias-free fit: no column added
    assert fits[True][0] < 0.25 * fits[False][0]
    assert fits[True][1] < fits[False][1]
