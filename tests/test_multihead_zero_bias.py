"""Layers whose query and value biases are exactly zero (BERT's initial weights) are valid targets: the learners
that fit a bias (``bias=True``, the default) recover ``u_h = 0`` and ``c = 0`` like any other value."""

import numpy as np
import pytest

from attnprobe.learners.head.lowrank import extract_lowrank
from attnprobe.learners.multihead.cross import bias_component, bias_token
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.models.attention import AttentionHead
from attnprobe.models.compare import relative_error
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.oracles.base import Oracle
from attnprobe.targets.multihead import random_multihead


def bert_like_layer(d: int, H: int, seed: int) -> MultiHeadAttention:
    """Output row 0 of a concatenate-then-project layer drawn like BERT's initializer: N(0, 0.02) weights, every
    bias zero (so ``u_h = 0`` and ``c = 0``)."""
    rng = np.random.default_rng(seed)
    dh = d // H
    Q, K, V = (0.02 * rng.standard_normal((H, dh, d)) for _ in range(3))
    return MultiHeadAttention.from_projections(Q, K, V, 0.02 * rng.standard_normal(H * dh))


@pytest.mark.parametrize("d,H,d_h", [(8, 2, 4), (12, 3, 4), (16, 4, 4), (8, 2, 8)])
def test_generic_learner_recovers_a_layer_without_biases(d, H, d_h):
    """Low-rank heads (the cross stage's bias token leaves W_h's row space) and full-rank ones, several seeds."""
    for seed in range(3):
        target = random_multihead(d, H, d_h, seed=seed, bias=False)
        assert np.all(target.u == 0) and target.c == 0
        res = extract_generic(Oracle(target, d), seed=seed)  # bias=True: u and c are fitted, not assumed 0
        assert res.model.H == H
        match = match_heads(target, res.model)
        assert match.worst <= 1e-6, match.as_dict()  # W and v relative, u absolute (its true norm is 0)
        assert np.max(np.abs(res.model.u)) <= 1e-8 * np.max(np.abs(target.W))
        assert abs(res.model.c) <= 1e-9 * np.max(np.abs(target.v))
        assert res.check.passed
        assert res.queries <= MultiHeadAttention.query_bound(d, H)


def test_bert_like_zero_bias_layer_as_accurate_as_with_biases():
    """Small weights (N(0, 0.02)) and zero biases: heads recovered as well as the same layer with random biases."""
    d, H = 32, 4
    for seed in range(3):
        target = bert_like_layer(d, H, seed)
        rng = np.random.default_rng(100 + seed)
        biased = MultiHeadAttention(target.W, target.v, 0.003 * rng.standard_normal((H, d)), -0.003)
        worst = {}
        for name, t in (("zero", target), ("biased", biased)):
            res = extract_generic(Oracle(t, d), rank=d // H, seed=seed)
            assert res.check.passed, res.notes
            worst[name] = match_heads(t, res.model).worst
        assert worst["zero"] <= 1e-8, worst
        assert worst["zero"] <= 100 * max(worst["biased"], 1e-13), worst


def test_lowrank_calibrates_w_scale_without_a_query_bias():
    """With u = 0 the calibration's u search only meets rounding; W's probe scale is still calibrated: the same
    as for the head with a small bias (not the unit scale an uncalibrated learner falls back to)."""
    d, r = 32, 4
    for seed in range(3):
        rng = np.random.default_rng(seed)
        W = 0.02 * rng.standard_normal((d, r)) @ (0.02 * rng.standard_normal((r, d)))
        v = 0.02 * rng.standard_normal(d)
        got = {}
        for name, u in (("zero", np.zeros(d)), ("biased", 1e-3 * rng.standard_normal(d))):
            res = extract_lowrank(Oracle(AttentionHead(W, v, u, 0.0), d), rank=r, seed=seed, check=False)
            got[name] = res.details["scale_a"], relative_error(res.model.W, W), np.linalg.norm(res.model.u - u)
        (sa0, err0, du0), (sa1, err1, _) = got["zero"], got["biased"]
        assert 0.25 <= sa0 / sa1 <= 4.0, got
        assert err0 <= 1e-9 and err1 <= 1e-9, got
        assert du0 <= 1e-12 * np.linalg.norm(W), got


def test_bias_component_solves_the_simplex_of_last_tokens():
    """``T_k = a + M_k`` at ``t + s R_k`` and ``T_r = a − Σ_k M_k/√r`` at the bias token: a is exact."""
    rng = np.random.default_rng(0)
    for r in (1, 3, 7):
        a, M = rng.standard_normal(5), rng.standard_normal((r, 5))
        T = np.concatenate([a + M, (a - M.sum(0) / np.sqrt(r))[None]])
        np.testing.assert_allclose(bias_component(T, r), a, atol=1e-12)
        R = np.linalg.qr(rng.standard_normal((9, r)))[0].T
        t = rng.standard_normal(9)
        t -= R.T @ (R @ t)
        tok = bias_token(t, R, 2.0)
        # the bias token's part in W_h's row space is nonzero (there p_h = W_h y + u_h does not reduce to u_h)
        assert np.linalg.norm(R @ tok) == pytest.approx(2.0)
    assert np.array_equal(bias_component(np.ones((1, 3)), 0), np.ones(3))
