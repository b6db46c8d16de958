"""The logit stage from every-position rows (docs/positional.md, "The start at LLaMA-3-8B's size"): each head's
weights read from a row equal the layer's, and the Gauss–Newton fit of their logs gives the heads' logit maps up
to the gauge."""

import numpy as np
import pytest

from attnprobe.errors import ConfigError
from attnprobe.learners.positional import row_logits
from attnprobe.learners.positional.coarse import split_value_maps
from attnprobe.learners.positional.start_plan import row_logit_tokens
from attnprobe.models.positional import rotation_matrix
from attnprobe.oracles.base import Oracle
from attnprobe.targets import random_rope_attention


def _parts(d, heads, kv, base, seed=0):
    truth = random_rope_attention(d, heads, kv, base=base, seed=seed)
    V = truth.value_maps()
    Cb, G = split_value_maps(V, V.sum(0))
    return truth, Cb, G


@pytest.mark.parametrize("d, heads, kv, support", [(32, 2, 1, 64), (256, 2, 1, 64)])
def test_the_rows_give_every_heads_weights(d, heads, kv, support):
    truth, Cb, G = _parts(d, heads, kv, 1e4)
    dh = d // heads
    N = dh - 2 if dh < 32 else dh - row_logits.MARGIN
    tokens = row_logits.BlockTokens.random(2, N, d, np.random.default_rng(1), support)
    X = tokens.dense().reshape(2, N, d)
    a = row_logits.attention_from_rows(truth.every_position(X), X, Cb, G, truth.output_bias())
    vals = tokens.project(G.reshape(-1, d)).reshape(2, N, heads, dh)
    assert np.allclose(row_logits.attention_from_rows(truth.every_position(X), vals, Cb, G, 0.0), a, atol=1e-12)
    for i in range(N):
        assert np.abs(a[:, :, i, :i + 1] - truth.attention(X[:, :i + 1])).max() < 1e-10
        assert np.all(a[:, :, i, i + 1:] == 0)


def test_the_fit_gives_the_logit_maps_up_to_the_gauge():
    d, heads, kv = 32, 2, 1
    truth, Cb, G = _parts(d, heads, kv, 100.0)
    rng = np.random.default_rng(2)
    N = 14
    tokens = row_logits.BlockTokens.random(37, N, d, rng)
    X = tokens.dense().reshape(-1, N, d)
    ell, w = row_logits.log_weight_samples(row_logits.attention_from_rows(truth.every_position(X), X, Cb, G, 0.0))
    Wq, Wk = truth.Wq * truth.scale, truth.Wk
    start = (Wq + 0.3 * Wq.std() * rng.standard_normal(Wq.shape), Wk + 0.3 * Wk.std() * rng.standard_normal(Wk.shape))
    fit_q, fit_k = row_logits.gauss_newton_logit_maps(tokens, ell, w, truth.inv_freq, kv, start, rounds=9,
                                                      cg_steps=30, cg_near=120, damping_floor=1e-6)
    for h in range(heads):
        for delta in (0, -3, -40):
            true = truth.logit_matrix(h, delta)
            found = fit_q[h].T @ rotation_matrix(delta, truth.inv_freq, d // heads) @ fit_k[h // heads]
            assert np.linalg.norm(found - true) < 1e-6 * np.linalg.norm(true)


def test_the_rows_are_refused_past_the_heads_width():
    truth, Cb, G = _parts(32, 2, 1, 1e4)
    X = np.random.default_rng(0).standard_normal((1, 17, 32))
    with pytest.raises(ConfigError, match="at most 16 tokens"):
        row_logits.attention_from_rows(truth.every_position(X), X, Cb, G, 0.0)


def test_the_stage_asks_what_its_plan_counts():
    truth, Cb, G = _parts(64, 2, 1, 1e4)

    class Rows:
        tokens = 0

        def __call__(self, X):
            Rows.tokens += X.shape[0] * X.shape[1]
            return truth.every_position(X)

    oracle = Oracle(Rows(), 64, positions="causal")
    sequences, tokens = row_logit_tokens(64, 2, per=16)
    Wq, Wk = row_logits.row_logit_maps(oracle, Cb, G, 0.0, truth.inv_freq, 1, np.random.default_rng(0),
                                       sequences=sequences, rounds=0)
    assert oracle.queries == sequences and Rows.tokens == tokens
    assert Wq.shape == (2, 32, 64) and Wk.shape == (1, 32, 64)
