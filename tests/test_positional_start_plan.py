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
    tokens = sum(t for _, t in coarse_start_tokens(4096, 32, 8).values())
    assert f"about {tokens:.3g} tokens" in grouped.basis  # the start's tokens: the victim's time
    assert grouped.peak_bytes < one.peak_bytes and grouped.seconds < one.seconds  # fewer fitted numbers
    with pytest.raises(ConfigError) as exc:
        estimate_queries("positional", 4096, kv_heads=5, **kw)
    assert exc.value.param == "kv_heads"


def test_victim_cost_per_token_counts_the_projections():
    # LLaMA-3-8B's layer: 4096·(32 + 16)·128 + 32·128·4096 multiply-adds per token
    assert victim_macs_per_token(4096, 32, 8) == 4096 * 48 * 128 + 4096 * 4096


def test_the_reduced_logit_matrix_by_conjugate_gradients_is_the_least_squares_one():
    from attnprobe.learners.positional.wide_logits import reduced_logit_matrix

    rng = np.random.default_rng(0)
    n, p = 600, 6
    zq, kx = rng.standard_normal((n, p)), rng.standard_normal((n, p)) * 3
    truth = rng.standard_normal((p, p))
    y = np.einsum("np,pr,nr->n", zq, truth, kx) + 1e-3 * rng.standard_normal(n)
    w = rng.uniform(0.2, 1.0, n)
    F = (zq[:, :, None] * kx[:, None, :]).reshape(n, -1)
    dense = np.linalg.lstsq(F * w[:, None], y * w, rcond=None)[0].reshape(p, p)
    M = reduced_logit_matrix(zq, kx, y, w)
    assert np.abs(M - dense).max() < 1e-8 * np.abs(dense).max()
    assert np.abs(M - truth).max() < 1e-2  # and near the truth: the noise's share


def test_the_rotation_gauge_per_pair_solves_the_rotation_equations():
    from attnprobe.learners.positional.wide_logits import rotation_gauge
    from attnprobe.models.positional import rope_frequencies, rotation_matrix

    rng = np.random.default_rng(1)
    dh = 8
    theta = rope_frequencies(dh, 5e5)
    A = rng.standard_normal((dh, dh))
    R = [rotation_matrix(float(o), theta, dh) for o in (-1, -2, -5, -16, -128)]
    P = [np.linalg.inv(A) @ R[j] @ R[0].T @ A for j in range(1, len(R))]
    Ak = rotation_gauge(P, [R[j] @ R[0].T for j in range(1, len(R))], rng)
    for Pj, j in zip(P, range(1, len(R))):
        assert np.abs(Ak @ Pj - R[j] @ R[0].T @ Ak).max() < 1e-8 * np.abs(Ak).max()
    # the truth up to a scaled rotation per pair: A_K A⁻¹ commutes with every R
    C = Ak @ np.linalg.inv(A)
    assert all(np.abs(C @ Rj - Rj @ C).max() < 1e-7 * np.abs(C).max() for Rj in R)
    assert np.linalg.cond(Ak) < 1e8


def test_wide_logit_maps_match_the_dense_ones(monkeypatch):
    """The logit maps with their d_h² solves done without forming them (forced here at d = 32 by a zero memory
    threshold) give the function, as the dense solves do, from exact heads' value maps and float64 answers."""
    from attnprobe.learners.positional import wide_logits
    from attnprobe.models.compare import function_error_over_lengths
    from attnprobe.models.positional import PositionalAttention

    truth = random_rope_attention(32, 2, 1, seed=4, base=5e5)
    Cb, G = truth.Wo, np.repeat(truth.Wv, 2, axis=0)
    monkeypatch.setattr(wide_logits, "WIDE_DESIGN_BYTES", 0)
    Wq, Wk, _ = coarse.logit_maps(Oracle(truth, 32), np.random.default_rng(0), Cb, G, truth.output_bias(),
                                  truth.inv_freq, 1.0, rounds=0)
    model = PositionalAttention(Wq, Wk, G, Cb, bo=truth.output_bias(), position="rope", inv_freq=truth.inv_freq,
                                layout="half", scale=1.0, causal=True)
    # the dense solves: 7.7e-11 here (seed 4)
    assert function_error_over_lengths(model, truth, np.random.default_rng(5), (2, 17, 64)) < 1e-6


def test_value_maps_from_kernel_token_rows_and_key_probes():
    """value_span.py: the span of the V_h from every-position rows of kernel tokens has dimension H (a gap after the
    H-th singular value), every true V_h lies in it, and a few key probes split it into each head's V_h — here with
    float64 answers, to the rows' ε truncation; the queries are the plan's."""
    from attnprobe.learners.positional.value_span import span_queries, split_span, value_span

    d, H, G = 32, 4, 1
    truth = random_rope_attention(d, H, G, seed=2)
    layer = Counting(type("Rows", (), {"positions": "causal",
                                       "__call__": lambda self, X: truth.every_position(X)})())
    oracle = Oracle(layer, d)
    rng = np.random.default_rng(0)
    M, _ = coarse.coarse_values(oracle, rng, math.sqrt(d))
    kernel = coarse_kernel(M, H)
    Q = coarse.row_space_basis(kernel, d)
    before = (oracle.queries, layer.tokens)
    S, sv = value_span(oracle, Q, kernel, H, rng)
    assert sv[H] < 1e-5 * sv[H - 1]  # exactly H dimensions
    for V in truth.value_maps():
        t = V @ Q.T
        assert np.linalg.norm(t - np.einsum("h,har->ar", np.einsum("har,ar->h", S, t), S)) < 1e-5 * np.linalg.norm(t)
    V, far = split_span(oracle, S, Q, M, rng, kernel=kernel, probes=3)
    assert _matched_errors(V, truth.value_maps()).max() < 1e-5
    plan = span_queries(d, H, G, probes=3)
    assert (oracle.queries - before[0], layer.tokens - before[1]) == tuple(np.add(plan["span"], plan["split"]))
