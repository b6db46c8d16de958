"""The every-row route's start for layers with q/k/v biases (``learners/positional/biased_start.py``): the maps read
behind the zero token mapped back to the layer, and the query bias as an augmented column of the absolute-logit fit,
against the module's own weights."""

from dataclasses import replace

import numpy as np
import pytest

from attnprobe.learners.positional.absolute_logits import absolute_logit_samples, fit_logit_maps
from attnprobe.learners.positional.bfloat16_rows import grouped_start
from attnprobe.learners.positional.biased_start import start_behind
from attnprobe.learners.positional.coarse import split_value_maps
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention, rope_frequencies
from attnprobe.oracles.base import Oracle


def _layer(d, H, G, seed, *, key_bias=True):
    """A causal RoPE layer with q/k/v biases N(0, 1) and no output bias (Qwen2's form; ``key_bias`` False: a query bias
    and an output constant alone), weights N(0, 1/d)."""
    rng = np.random.default_rng(seed)
    dh, s = d // H, 1 / np.sqrt(d)
    return PositionalAttention(
        rng.standard_normal((H, dh, d)) * s, rng.standard_normal((G, dh, d)) * s,
        rng.standard_normal((G, dh, d)) * s, rng.standard_normal((d, H * dh)) * s, bq=rng.standard_normal((H, dh)),
        bk=rng.standard_normal((G, dh)) if key_bias else None, bv=rng.standard_normal((G, dh)) if key_bias else None,
        bo=None if key_bias else rng.standard_normal(d) * 0.1, position="rope", inv_freq=rope_frequencies(dh, 1e4),
        layout="half", scale=1.0, causal=True)


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
    model = start_behind(Wq, truth.Wk, Cb, Gh, c + M @ x0, truth.inv_freq, x0, assemble=grouped_start)
    assert function_error_over_lengths(model, truth, np.random.default_rng(5), (1, 2, 17, 64)) < 1e-9
    off = start_behind(np.concatenate([truth.Wq, 0 * bq[..., None]], axis=-1), truth.Wk, Cb, Gh, c + M @ x0,
                       truth.inv_freq, x0, assemble=grouped_start)
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


def test_the_zero_token_probe_asks_what_its_plan_counts():
    """The every-row route's plan with biases counts the zero token's probe (``neutral_token_queries``): exactly the
    sequences :func:`~.bias_rows.neutral_token` asks when it takes every step (float64 rows, d = 16, 4/1)."""
    from attnprobe.learners.positional import coarse, coarse_bias
    from attnprobe.learners.positional.bfloat16_rows import rows_queries
    from attnprobe.learners.positional.bias_rows import neutral_token, neutral_token_queries

    truth = _layer(16, 4, 1, 0)
    oracle = Oracle(_Rows(truth), 16)
    M, c = coarse.coarse_values(oracle, np.random.default_rng(0), 4.0, repeats=1)
    kernel = coarse_bias.coarse_kernel(M, 4)
    _, info = neutral_token(oracle, M, c, kernel, np.random.default_rng(1), steps=2, length=16, patterns=1, refresh=2,
                            move=0.1)
    assert info["steps"] == 2 and info["sequences"] == neutral_token_queries(16, 4, steps=2, patterns=1, refresh=2)
    assert rows_queries(16, 4, 1, biases=True) - rows_queries(16, 4, 1) == neutral_token_queries(16, 4)


@pytest.mark.slow
def test_a_layer_with_qkv_biases_from_bfloat16_rows_through_the_every_row_route(monkeypatch):
    """The every-row route with ``biases`` (d = 32, 4/1, Qwen2's module, rows rounded to bfloat16; the row polish
    shrunk: 8 sequences, 8 rounds; no hook): the zero token, the value maps and the logits behind it, mapped back
    and polished (every bias fitted), its check within the route's claim and the model within 2e-2 of the float64
    module at every length 1 … 256 (measured 5.7e-3, 171 s; the fast twins: the tests above)."""
    from attnprobe.learners.positional import bfloat16_rows
    from attnprobe.targets.positional_modules import positional_victim, reference_model

    for name, value in (("ROW_SEQUENCES", 8), ("ROW_ROUNDS", 8)):
        monkeypatch.setattr(bfloat16_rows, name, value)
    truth = reference_model(positional_victim("qwen2", d=32, heads=4, kv_heads=1, seed=0))
    oracle = Oracle(_BfloatRows(truth), 32, precision="bfloat16")
    oracle.declare_positions("causal")
    res = bfloat16_rows.extract_bfloat16_rows(oracle, heads=4, seed=0, biases=True)
    assert res.details["biases"] and res.details["groups"] == 1 and np.abs(res.model.bk).max() > 0
    assert res.check.error <= bfloat16_rows.CLAIM
    assert function_error_over_lengths(res.model, truth, np.random.default_rng(5), tuple(range(1, 257))) < 2e-2


class _BfloatRows(_Rows):
    """Every row, inputs and answers rounded to bfloat16."""

    def __call__(self, X):
        import ml_dtypes

        X = np.asarray(X, dtype=np.float64).astype(ml_dtypes.bfloat16).astype(np.float64)
        return np.asarray(self.model.every_position(X)).astype(ml_dtypes.bfloat16).astype(np.float64)
