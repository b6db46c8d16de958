"""The RoPE learner on real-size heads (d_h = 16 and 128 at d = 32 … 128), float64 answers."""

import numpy as np
import pytest

from attnprobe.errors import ConfigError, RecoveryError, UnidentifiableError
from attnprobe.learners.core.estimate import estimate_queries
from attnprobe.learners.positional import extract_positional
from attnprobe.learners.positional.rotation import RotaryFactors, factor_rotary
from attnprobe.models.positional import PositionalAttention, rope_frequencies
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.base import Oracle

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.targets.positional_modules import positional_victim, reference_model  # noqa: E402


def _rel(model, truth, rng, lengths=(1, 2, 3, 17, 100, 256)):
    return function_error_over_lengths(model, truth, rng, lengths)


def test_llama_gqa_is_recovered_at_every_length_up_to_256():
    truth = reference_model(positional_victim("llama", d=32, heads=2, kv_heads=1, seed=1))
    oracle = Oracle(truth, 32)
    result = extract_positional(oracle, heads=2, seed=0)
    assert result.passed and result.check.error < 1e-8
    assert result.queries == sum(result.queries_by_phase.values())
    assert _rel(result.model, truth, np.random.default_rng(2)) < 1e-8
    det = result.details
    assert det["heads"] == 2 and det["head_dim"] == 16
    assert det["kv_groups"] == [0, 0]  # one key/value group, found from the recovered factors
    assert abs(det["base_estimate"] / 1e4 - 1) < 1e-6
    assert np.allclose(np.sort(det["theta"])[::-1], truth.inv_freq, rtol=1e-6)
    assert det["offset_signal"] > 1e-3 and "offset dependence detected" in result.notes[0]
    est = estimate_queries("positional", 32, heads=2)
    assert est.low == est.queries <= result.queries + result.check.queries <= est.high


def test_interleaved_layout_victim_is_recovered():
    """GPT-J's layout (pair k = coordinates (2k, 2k+1)) is another basis of the same pairs: the learner finds the
    pairs from the answers, so the function comes back as well as for rotate-half."""
    import dataclasses

    truth = dataclasses.replace(reference_model(positional_victim("llama", d=32, heads=2, kv_heads=1, seed=1)),
                                layout="interleaved")
    result = extract_positional(Oracle(truth, 32), heads=2, seed=0)
    assert result.passed and result.check.error < 1e-8
    assert _rel(result.model, truth, np.random.default_rng(2)) < 1e-8
    assert np.allclose(np.sort(result.details["theta"])[::-1], truth.inv_freq, rtol=1e-6)


def test_rotation_factors_from_offsets_at_head_dim_128():
    """d_h = 128, base 1e4: the pair bases from two offsets alone crowd the low frequencies (gap 1.8e-5); the
    combination of steps keeps B(δ) for δ up to 4096 at the matrices' own accuracy."""
    rng = np.random.default_rng(0)
    d, dh = 256, 128
    theta = rope_frequencies(dh, 1e4)
    f = RotaryFactors(rng.standard_normal((d, dh)) / 16, rng.standard_normal((dh, d)) / 16, theta)
    offsets = (-1, -2, -3, -4, -6, -8, -16, -32, -64, -128, -255)
    U = np.linalg.qr(f.Q)[0]
    V = np.linalg.qr(f.K.T)[0]
    M = {o: U.T @ f.matrix(o) @ V for o in offsets}
    got = factor_rotary(M, U, V, -1, -2)
    for delta in (0, -1, -100, -255, -4096):
        want = f.matrix(delta)
        assert np.linalg.norm(got.matrix(delta) - want) / np.linalg.norm(want) < 1e-9
    assert np.abs(got.theta - theta).max() < 1e-12


def test_partial_rotary_static_coordinates_are_not_a_low_frequency():
    """d_h = 128 with 32 rotated coordinates (GPT-NeoX's rotary_pct 0.25): the 96 static coordinates (θ = 0) are
    told apart from the lowest frequency (1.8e-4) at the largest step, and B(δ) holds to 4096."""
    rng = np.random.default_rng(0)
    d, dh = 256, 128
    theta = rope_frequencies(32, 1e4)
    f = RotaryFactors(rng.standard_normal((d, dh)) / 16, rng.standard_normal((dh, d)) / 16, theta)
    U = np.linalg.qr(f.Q)[0]
    V = np.linalg.qr(f.K.T)[0]
    M = {o: U.T @ f.matrix(o) @ V for o in (-1, -2, -3, -4, -6, -8, -16, -32, -64)}
    got = factor_rotary(M, U, V, -1, -2)
    assert len(got.theta) == 16 and np.abs(got.theta - theta).max() < 1e-12
    for delta in (0, -1, -100, -4096):
        want = f.matrix(delta)
        assert np.linalg.norm(got.matrix(delta) - want) / np.linalg.norm(want) < 1e-9


def test_gpt_neox_partial_rotary_module_is_recovered():
    """A real ``GPTNeoXAttention`` (rotary on 4 of 16 dims), biases zero: the function at every length up to 256
    within 1e-8 of the module, the two frequencies found, the rest of each head static."""
    victim = positional_victim("gpt_neox", d=32, heads=2, seed=1, bias_std=0.0, rotary_pct=0.25)
    truth = reference_model(victim)
    result = extract_positional(Oracle(truth, 32), heads=2, seed=0)
    assert result.passed and result.check.error < 1e-8
    assert result.model.rotary_dim == 4 and result.model.head_dim == 16
    assert np.allclose(result.details["theta"], truth.inv_freq, rtol=1e-8)
    assert _rel(result.model, truth, np.random.default_rng(2)) < 1e-8
    X = np.random.default_rng(3).standard_normal((3, 200, 32))
    with torch.no_grad():
        y = victim(torch.as_tensor(X)).numpy()
    assert np.abs(result.model(X) - y).max() / np.abs(y - truth.output_bias()).max() < 1e-8


def test_offset_free_layer_is_reported_not_mistaken():
    truth = reference_model(positional_victim("llama", d=32, heads=2, kv_heads=1, seed=1))
    flat = PositionalAttention(truth.Wq, truth.Wk, truth.Wv, truth.Wo, position="none")
    with pytest.raises(UnidentifiableError, match="do not depend on the offset"):
        extract_positional(Oracle(flat, 32), seed=0)


def test_biases_and_coarse_answers_are_refused_in_one_line():
    qwen = reference_model(positional_victim("qwen2", d=32, heads=2, kv_heads=1, seed=1))
    with pytest.raises(RecoveryError, match="biases"):
        extract_positional(Oracle(qwen, 32), seed=0)
    llama = reference_model(positional_victim("llama", d=32, heads=2, kv_heads=1, seed=1))
    from attnprobe.oracles.chain import AnswerChain

    noisy = Oracle(llama, 32, chain=AnswerChain(noise="gaussian:0.001", seed=1))
    with pytest.raises(UnidentifiableError, match="noisy"):
        extract_positional(noisy, seed=0)


@pytest.mark.slow
def test_a_longer_walk_spans_the_heads_output_spaces_better():
    """``walk`` multiplies the pair probe's walk: the queries grow by exactly the walk's share and the estimate
    follows; the recovered heads' value maps come closer to the module's (measured 2.9e-8 → 1.7e-8 in the function
    at d = 128 for walk 1 → 3)."""
    truth = reference_model(positional_victim("llama", d=32, heads=2, kv_heads=1, seed=1))

    def value_error(res):
        got, want = res.model.value_maps(), truth.value_maps()
        return max(min(np.abs(g - w).max() for w in want) / np.abs(want).max() for g in got)

    short = extract_positional(Oracle(truth, 32), heads=2, seed=0, walk=1)
    long = extract_positional(Oracle(truth, 32), heads=2, seed=0, walk=3)
    assert long.passed and _rel(long.model, truth, np.random.default_rng(2)) < 1e-8
    per_step = 2 * 3 * 4 * (2 + 4)  # 2·LEVELS·settings·(H + 4) queries per step of the walk
    halved = long.queries - short.queries - 2 * (32 // 2) * per_step
    assert halved >= 0 and halved % per_step == 0  # a halved step asks its query again
    assert value_error(long) < value_error(short)
    est = estimate_queries("positional", 32, heads=2, walk=3)
    assert est.low <= long.queries + long.check.queries <= est.high
    with pytest.raises(ConfigError, match="walk"):
        extract_positional(Oracle(truth, 32), heads=2, walk=0)
