"""The coarse RoPE start at scale (docs/positional.md, "The start at LLaMA-3-8B's size"): its plan in tokens, the
value maps on M's row space, and the estimate's key/value groups."""

import math

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from attnprobe.errors import ConfigError
from attnprobe.learners.core.estimate import estimate_queries
from attnprobe.learners.positional import coarse
from attnprobe.learners.positional.coarse_bias import coarse_kernel
from attnprobe.learners.positional.start_plan import coarse_start_tokens, victim_macs_per_token
from attnprobe.oracles.base import Oracle
from attnprobe.targets import random_rope_attention


class Counting:
    """A layer's last-position answers, counting the tokens it reads."""

    def __init__(self, model):
        self.model, self.tokens = model, 0

    def __call__(self, X):
        self.tokens += X.shape[0] * X.shape[1]
        return self.model(X)


@pytest.mark.parametrize("d, heads, kv", [(32, 2, 1), (128, 8, 2), (256, 2, 1), (4096, 32, 8)])
def test_the_plan_counts_the_start_queries(d, heads, kv):
    plan = coarse_start_tokens(d, heads, kv)
    assert sum(q for q, _ in plan.values()) == coarse.coarse_queries(d, heads)
    assert all(t >= q for q, t in plan.values())  # every query holds at least one token
    rows = coarse_start_tokens(d, heads, kv, row_space=True)["value maps"]
    rank = kv * d // heads  # the value maps' common row space
    assert rows[0] * d == plan["value maps"][0] * rank and rows[1] * d == plan["value maps"][1] * rank


def _matched_errors(V, truth):
    err = np.array([[np.linalg.norm(v - t) / np.linalg.norm(t) for t in truth] for v in V])
    r, c = linear_sum_assignment(err)
    return err[r, c]


def test_value_maps_on_the_row_space_ask_what_the_plan_says_and_match_the_truth():
    """``row_space``: per·G·d_h random queries instead of per·d, each head's V_h regressed on M's row space (it
    vanishes on M's kernel): as close to the truth as the full regression, from half the queries here."""
    d, H, G = 16, 2, 1
    truth = random_rope_attention(d, H, G, seed=3)
    layer = Counting(truth)
    oracle = Oracle(layer, d)
    rng = np.random.default_rng(0)
    M, c = coarse.coarse_values(oracle, rng, math.sqrt(d))
    kernel = coarse_kernel(M, H)
    assert len(kernel) == d - G * d // H
    rough, _ = coarse.coarse_output_spaces(oracle, M, rng, H, kernel=kernel)
    errors, spent = {}, {}
    for row_space in (False, True):
        before, tokens = oracle.queries, layer.tokens
        V = coarse.coarse_value_maps(oracle, M, rough, np.random.default_rng(1), H, per=2, kernel=kernel,
                                     row_space=row_space)
        errors[row_space] = _matched_errors(V, truth.value_maps()).max()
        spent[row_space] = (oracle.queries - before, layer.tokens - tokens)
        # every V_h vanishes on the kernel of M
        assert np.abs(V @ kernel.T).max() < 1e-6 * np.abs(V).max() or not row_space
    plan = coarse_start_tokens(d, H, G, per=2, row_space=True, key=True)["value maps"]
    assert spent[True] == plan
    assert spent[True][0] * d == spent[False][0] * (G * d // H)
    assert errors[True] < 1e-9 and errors[False] < 1e-9  # float64 answers


def test_the_row_space_needs_a_kernel():
    with pytest.raises(Exception) as exc:
        coarse.row_space_basis(None, 8)
    assert "kernel" in str(exc.value)


def test_the_estimate_plans_the_declared_key_value_groups():
    kw = dict(precision="float32", heads=32, polish="always", positions="causal")
    one = estimate_queries("positional", 4096, **kw)
    grouped = estimate_queries("positional", 4096, kv_heads=8, **kw)
    assert "8 key/value groups" in grouped.basis and "not declared" in one.basis
    assert grouped.peak_bytes < one.peak_bytes and grouped.seconds < one.seconds  # fewer fitted numbers
    with pytest.raises(ConfigError) as exc:
        estimate_queries("positional", 4096, kv_heads=5, **kw)
    assert exc.value.param == "kv_heads"


def test_victim_cost_per_token_counts_the_projections():
    # LLaMA-3-8B's layer: 4096·(32 + 16)·128 + 32·128·4096 multiply-adds per token
    assert victim_macs_per_token(4096, 32, 8) == 4096 * 48 * 128 + 4096 * 4096
