"""The block learner's sublayer oracles (docs/block.md, "The learner") against the truth of a random LLaMA-shaped
pre-norm block: the linear part at 0 and ε, the FFN fed through the norm's inverse, the attention's last row with
the query driven out; and the registry entry."""

import math

import numpy as np
import pytest

from attnprobe.errors import ConfigError
from attnprobe.learners import registry
from attnprobe.learners.block.sublayers import (AttentionThroughBlock, FFNThroughBlock, inverse_norm, linear_part,
                                                sqrt_eps)
from attnprobe.models.block import fold_norm_weights
from attnprobe.models.gated_ffn import GatedFFN
from attnprobe.targets.block import random_llama_block


@pytest.fixture(scope="module")
def block():
    return random_llama_block(32, 2, 1, 64, seed=0)


@pytest.fixture(scope="module")
def read(block):
    K0 = linear_part(block.every_position, block.d)
    s, misfit = sqrt_eps(block.every_position, K0, np.random.default_rng(0))
    return K0, s, misfit


def test_linear_part_and_eps_against_the_truth(block, read):
    K0, s, misfit = read
    assert abs(s / math.sqrt(block.eps) - 1) < 1e-9 and misfit < 1e-8
    f = fold_norm_weights(block)
    M = f.attention.every_position(np.eye(block.d)[:, None, :])[:, 0].T  # M' = M diag(w1) on single tokens
    assert np.abs(s * (K0 - np.eye(block.d)) - M).max() < 1e-9 * np.abs(M).max()


def test_the_norm_inverts_onto_its_ball(block):
    Z = np.random.default_rng(1).standard_normal((4, 3, block.d)) * 0.5
    X = inverse_norm(Z, block.eps)
    assert np.allclose(X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + block.eps), Z, rtol=1e-13, atol=0)
    with pytest.raises(ConfigError, match="rms below 1"):
        inverse_norm(Z * 3, block.eps)


def test_ffn_and_attention_oracles_answer_like_the_sublayers(block, read):
    K0, s, _ = read
    f = fold_norm_weights(block)
    ffn = FFNThroughBlock(block.every_position, s * (K0 - np.eye(block.d)), s * s)
    V = np.random.default_rng(2).standard_normal((32, 1, block.d)) * 0.4
    true = f.mlp(V[:, 0])
    assert np.abs(ffn(V) - true).max() < 1e-8 * np.abs(true).max()
    # the attention oracle on the true FFN (v ↦ F(w2 ⊙ v)): keys through the inverse norm, the query driven out
    truth = GatedFFN(f.W_gate, f.b_gate, f.W_in, f.b_in, f.W_out, f.b_out, "silu")
    att = AttentionThroughBlock(block.every_position, truth, s * s, block.d)
    Z = np.random.default_rng(3).standard_normal((8, 9, block.d)) * 0.3
    Z[:, -1] *= math.sqrt(block.d) / np.linalg.norm(Z[:, -1], axis=1, keepdims=True)
    want = f.attention.every_position(Z)[:, -1]
    assert np.abs(att(Z) - want).max() < 1e-9 * np.abs(want).max()
    with pytest.raises(ConfigError, match="rms 1"):
        att(Z * 0.5)


def test_block_is_registered_with_an_estimate():
    entry = registry.learner("block")
    assert entry.recovers == "block" and {"heads", "hidden"} <= set(entry.option_names)
    assert entry.capabilities.vector_answers
