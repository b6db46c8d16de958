"""The block learner's check of the FFN it reads first (learners/block/learner.py): measured on fresh rows inside
the norm's ball, and named as the cause when the attention read through it fails (a LLaMA folder at
``initializer_range`` 0.05, d = 32: the FFN 3.2e-4 off, the attention stage refused as "not RoPE")."""

import dataclasses

import numpy as np
import pytest

from attnprobe.errors import RecoveryError
from attnprobe.learners.block.learner import FFN_EXACT, ffn_fresh_error, inexact_ffn
from attnprobe.oracles.base import Oracle
from attnprobe.targets.block import random_llama_block


def test_the_ffn_fresh_error_measures_how_far_the_model_read_is():
    ffn = random_llama_block(16, 2, 1, 32, seed=1).ffn
    oracle = Oracle(ffn, 16)
    assert ffn_fresh_error(oracle, ffn, np.random.default_rng(0)) < 1e-13
    off = dataclasses.replace(ffn, W2=ffn.W2 * (1 + 1e-6))
    err = ffn_fresh_error(oracle, off, np.random.default_rng(0))
    assert 3e-7 < err < 3e-6  # the outputs 1e-6 off, relative to the largest answer
    assert oracle.queries == 2 * 64


def test_a_failing_attention_stage_is_blamed_on_an_inexact_ffn_only():
    exc = RecoveryError("the logit matrices at two offsets are not related by a rotation; the position term is not "
                        "RoPE")
    assert inexact_ffn(exc, FFN_EXACT / 10) is exc
    assert inexact_ffn(exc, float("nan")) is exc and inexact_ffn(exc, None) is exc  # None: an FFN given
    named = inexact_ffn(exc, 3.2e-4)
    assert isinstance(named, RecoveryError)
    assert "FFN" in str(named) and "3.2e-04" in str(named) and str(exc) in str(named)


@pytest.mark.slow
def test_a_block_at_small_weights_is_refused_naming_its_ffn(tmp_path):
    """~70 s: transformers' LLaMA at initializer_range 0.05 (d = 32): the gated FFN learner reads its FFN only
    ~3e-4 close (pre-activations ~0.2), and the refusal says so instead of "the position term is not RoPE"."""
    import torch
    import transformers

    from attnprobe.learners.block.learner import extract_block
    from attnprobe.oracles.hf_block import oracle_from_hf_block

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                      num_key_value_heads=1, num_hidden_layers=1, vocab_size=8,
                                      initializer_range=0.05)
    torch.manual_seed(0)
    transformers.LlamaModel(config).save_pretrained(tmp_path)
    with pytest.raises(RecoveryError, match="read first only"):
        extract_block(oracle_from_hf_block(tmp_path, 0), heads=2)


class _Asked(Exception):
    pass


def test_the_block_plan_without_the_width_is_a_lower_bound():
    """Without ``hidden`` the plan counted the FFN at m = 4d and called it "at least": a d = 16 block of m = 2d asks
    about a third of that, so a budget that sufficed was refused before any query. Now the count at m = d: a budget
    of the m = 2d count passes the plan (the first query is asked), one below the m = d count is refused."""
    from attnprobe.errors import BudgetExceededError, OracleError
    from attnprobe.learners.block.learner import CHECK_LENGTHS, CHECK_PER_LENGTH, block_queries, extract_block

    def asked(X):
        raise _Asked

    check = len(CHECK_LENGTHS) * CHECK_PER_LENGTH
    enough = block_queries(16, 1, 32, check=False) + check
    with pytest.raises(OracleError, match="_Asked"):  # past the plan: the first query is asked
        extract_block(Oracle(asked, 16, budget=enough), heads=1)
    floor = block_queries(16, 1, 16, check=False)
    with pytest.raises(BudgetExceededError, match=f"at least {floor} queries"):
        extract_block(Oracle(asked, 16, budget=floor + check - 1), heads=1)
