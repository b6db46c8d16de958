"""RoPE layers with q/k/v biases (``Qwen2Attention``, ``GPTNeoXAttention``, random init, float64) behind a neutral
key: the recovered function against the module at every length up to 256, and a wrong neutral key refused."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.errors import ConfigError, RecoveryError  # noqa: E402
from attnprobe.learners.positional.neutral import extract_neutral  # noqa: E402
from attnprobe.models.compare import function_error_over_lengths  # noqa: E402
from attnprobe.oracles.base import Oracle  # noqa: E402
from attnprobe.targets.positional_modules import positional_victim, reference_model  # noqa: E402

LENGTHS = (1, 2, 3, 8, 64, 256)


def _neutral(truth):
    return -np.linalg.lstsq(truth.Wk.reshape(-1, truth.d), truth.bk.reshape(-1), rcond=None)[0]


@pytest.fixture(scope="module")
def qwen():
    return reference_model(positional_victim("qwen2", d=32, heads=2, kv_heads=1, seed=1))


@pytest.mark.parametrize("family", ["qwen2", "gpt_neox"])
def test_biased_rope_recovered_behind_a_neutral_key(family, qwen):
    truth = qwen if family == "qwen2" else reference_model(positional_victim("gpt_neox", d=32, heads=2, seed=1))
    assert np.abs(truth.bq).max() > 0.1 and np.abs(truth.bk).max() > 0.1  # the biases are there
    res = extract_neutral(Oracle(truth, 32), _neutral(truth), heads=2, seed=0)
    assert res.check.passed
    err = function_error_over_lengths(res.model, truth, np.random.default_rng(0), LENGTHS)
    assert err < 2e-7  # measured 3.8e-8 (Qwen2), 2.6e-8 (GPT-NeoX)
    assert res.check.error < 2e-7
    # the query bias read from ±z matters: without it (b' = 0 behind the shift) the function is far off
    flat = dataclasses.replace(res.model, bq=-np.einsum("hkd,d->hk", res.model.Wq, _neutral(truth)))
    assert function_error_over_lengths(flat, truth, np.random.default_rng(0), LENGTHS) > 1e-3


def test_a_wrong_neutral_key_is_refused(qwen):
    x0 = _neutral(qwen) + 1e-3 * np.random.default_rng(5).standard_normal(32)
    with pytest.raises(RecoveryError, match="not a neutral key"):
        extract_neutral(Oracle(qwen, 32), x0, heads=2, seed=0)
    with pytest.raises(ConfigError, match="neutral key"):
        extract_neutral(Oracle(qwen, 32), np.zeros(31), heads=2, seed=0)


def test_the_shifted_oracle_keeps_the_parents_noise_budget_and_count(qwen):
    """The neutral route asks through :func:`shift_inputs`: noisy answers are refused as noisy (not blamed on x₀),
    and every query is the parent's, against its budget."""
    from attnprobe.errors import UnidentifiableError
    from attnprobe.oracles.subspace import shift_inputs
    from attnprobe.oracles.wrappers import FreshNoise

    with pytest.raises(UnidentifiableError, match="noisy"):
        extract_neutral(Oracle(FreshNoise(qwen, 1e-7), 32), _neutral(qwen), heads=2, seed=0)
    parent = Oracle(qwen, 32, budget=10)
    x0 = _neutral(qwen)
    shifted = shift_inputs(parent, x0)
    X = np.random.default_rng(0).standard_normal((3, 4, 32))
    np.testing.assert_array_equal(shifted(X), Oracle(qwen, 32)(X + x0))
    assert parent.queries == 3 and shifted.budget == 10 and shifted.noise.exact
    assert not shift_inputs(Oracle(FreshNoise(qwen, 1e-7), 32), x0).noise.exact
    with pytest.raises(ConfigError, match="shift must be a finite vector"):
        shift_inputs(parent, np.full(32, np.nan))
