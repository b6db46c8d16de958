"""RoPE with q/k/v biases (Qwen2: a random-init ``transformers`` ``Qwen2Attention``, float64) read through the kernel
of the value maps: the recovered function against the module at the last position over several lengths, the probe's
rank, the route that reaches it, and what is refused."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.errors import UnidentifiableError  # noqa: E402
from attnprobe.learners.head.probes import random_orthogonal  # noqa: E402
from attnprobe.learners.positional.heads import STEP, key_jacobian, pair_jacobian  # noqa: E402
from attnprobe.learners.positional.rope import extract_positional, value_kernel  # noqa: E402
from attnprobe.learners.positional.route import extract_any_positional  # noqa: E402
from attnprobe.models.compare import function_error_over_lengths  # noqa: E402
from attnprobe.oracles.base import Oracle  # noqa: E402
from attnprobe.targets.positional_modules import positional_victim, reference_model  # noqa: E402

LENGTHS = (1, 2, 3, 8, 31, 64, 256)


@pytest.fixture(scope="module")
def qwen():
    victim = positional_victim("qwen2", d=32, heads=2, kv_heads=1, seed=1)
    return victim, reference_model(victim)


def test_one_key_moved_inside_the_value_kernel_shows_exactly_H_directions(qwen):
    """With q/k biases the zero-key pair probe has no rank-H gap (its value term is full rank); one key moved inside
    ker M changes only the query's weight: rank H = 2 with a gap of many orders."""
    victim, truth = qwen
    d, rng = 32, np.random.default_rng(0)
    M = sum(truth.Wo[:, h * 16:(h + 1) * 16] @ truth.Wv[truth.group(h)] for h in range(2))
    kernel = value_kernel(M, 2)
    assert kernel.shape == (16, 32) and np.abs(M @ kernel.T).max() < 1e-12 * np.abs(M).max()
    z, eta = rng.standard_normal(d), STEP * np.sqrt(d)
    E = random_orthogonal(16, rng)[:12] @ kernel
    s = np.linalg.svd(key_jacobian(truth, z, E, eta), compute_uv=False)
    assert s[2] / s[1] < 1e-8 and s[1] / s[0] > 1e-2
    s_pair = np.linalg.svd(pair_jacobian(truth, z, random_orthogonal(d, rng)[:12], eta), compute_uv=False)
    assert s_pair[2] / s_pair[1] > 1e-2  # the bias-free probe: no gap after H


def test_qwen2_module_recovered_at_every_length(qwen):
    victim, truth = qwen
    assert np.abs(truth.bq).max() > 0.1 and np.abs(truth.bk).max() > 0.1  # the biases are there
    oracle = Oracle(victim, 32)  # the transformers module itself answers
    res = extract_positional(oracle, heads=2, seed=0, key_bias=True)
    assert res.passed and res.check.error < 1e-7
    assert res.queries == sum(res.queries_by_phase.values())
    err = function_error_over_lengths(res.model, truth, np.random.default_rng(0), LENGTHS)
    assert err < 1e-7  # measured 1.1e-8
    # both biases matter: without the fitted key bias, or the query bias, the function is far off
    for name in ("bk", "bq"):
        broken = dataclasses.replace(res.model, **{name: np.zeros_like(getattr(res.model, name))})
        assert function_error_over_lengths(broken, truth, np.random.default_rng(0), LENGTHS) > 1e-3
    assert "query and key biases read" in res.notes[0]


def test_route_reads_qwen2_from_the_answers_and_when_declared(qwen):
    """Nothing declared: the zero-query spread sends it to the additive route, which fails, then to RoPE with
    biases; declared RoPE: the bias-free pair probe refuses with the biases' signature, then RoPE with biases."""
    _, truth = qwen
    res = extract_any_positional(Oracle(truth, 32), heads=2, seed=0, polish="never")
    assert res.passed and "additive tried" in res.queries_by_phase
    assert function_error_over_lengths(res.model, truth, np.random.default_rng(1), LENGTHS) < 1e-7
    assert any("RoPE with q/k biases after an additive" in n for n in res.notes)
    res = extract_any_positional(Oracle(truth, 32), heads=2, seed=0, position="rope", polish="never")
    assert res.passed and "additive tried" not in res.queries_by_phase and res.queries_by_phase["route"] == 8
    assert "position term rope with q/k biases (declared" in res.notes[-1]
    assert res.queries == sum(res.queries_by_phase.values())
    assert function_error_over_lengths(res.model, truth, np.random.default_rng(1), LENGTHS) < 1e-7


def test_a_wrong_key_bias_fails_the_check(qwen, monkeypatch):
    """A broken step is caught: a key bias fitted with the wrong sign leaves the function off and the check fails."""
    from attnprobe.learners.positional import rope

    _, truth = qwen
    fit = rope.fit_key_bias
    monkeypatch.setattr(rope, "fit_key_bias", lambda *a: -fit(*a))
    res = rope.extract_positional(Oracle(truth, 32), heads=2, seed=0, key_bias=True)
    assert not res.passed and res.check.error > 1e-3


@pytest.mark.parametrize("family", ["qwen2", "gpt_neox"])
def test_biased_layer_with_a_value_map_per_head_read_through_the_zero_query_weights(family):
    """No key/value sharing and H·d_h = d (no kernel of M): the heads separate by their zero-query weights
    ``softmax_δ(b_Qᵀ R(δ) b_K)`` (the additive route's pencil); GPT-NeoX: fused q/k/v biases, rotary on 4 of 16."""
    kw = {"kv_heads": 2} if family == "qwen2" else {"rotary_pct": 0.25}
    truth = reference_model(positional_victim(family, d=32, heads=2, seed=1, **kw))
    res = extract_positional(Oracle(truth, 32), heads=2, seed=0, key_bias=True)
    assert res.passed and "zero-query weights" in res.notes[0]
    assert function_error_over_lengths(res.model, truth, np.random.default_rng(0), LENGTHS) < 1e-7  # 1.9e-9, 2.0e-9


def test_biased_layer_without_a_kernel_or_a_query_bias_is_refused_naming_both():
    """No kernel of M and no query bias: the zero-query weights are uniform, nothing separates the heads."""
    from attnprobe.models.positional import PositionalAttention
    from attnprobe.targets import random_rope_attention

    v = random_rope_attention(32, 2, 2, seed=5)
    bk = 0.5 * np.random.default_rng(1).standard_normal((2, 16))
    truth = PositionalAttention(v.Wq, v.Wk, v.Wv, v.Wo, bk=bk, position="rope", inv_freq=v.inv_freq)
    with pytest.raises(UnidentifiableError, match="rank 32 of d = 32.*did not separate the heads"):
        extract_positional(Oracle(truth, 32), heads=2, seed=0, key_bias=True)
    with pytest.raises(UnidentifiableError, match="q/k biases.*rank 32 of d = 32"):  # the route names it too
        extract_any_positional(Oracle(truth, 32), heads=2, seed=0, position="rope")


def test_a_key_bias_alone_is_read_after_the_bias_free_learner_refuses():
    """A key bias without a query bias leaves the zero-query answers flat (``0ᵀR(δ)b_K = 0``): the route reads the
    layer bias-free first, and with biases after that refuses; every query counted."""
    from attnprobe.models.positional import PositionalAttention
    from attnprobe.targets import random_rope_attention

    v = random_rope_attention(32, 2, 1, seed=5)
    bk = 0.5 * np.random.default_rng(1).standard_normal((1, 16))
    truth = PositionalAttention(v.Wq, v.Wk, v.Wv, v.Wo, bk=bk, position="rope", inv_freq=v.inv_freq)
    oracle = Oracle(truth, 32)
    res = extract_any_positional(oracle, seed=0, position="rope", polish="never")
    assert res.passed and res.queries_by_phase["bias-free tried"] > 0
    assert res.queries == sum(res.queries_by_phase.values()) == oracle.queries - res.check.queries
    assert any("after the bias-free RoPE learner refused" in n for n in res.notes)
    assert function_error_over_lengths(res.model, truth, np.random.default_rng(1), LENGTHS) < 1e-7


def test_a_family_that_declares_no_biases_is_not_read_with_biases_after_a_refusal():
    """The same layer behind a callable that declares ``qk_biases = False`` (a Hugging Face folder whose config says
    ``attention_bias: false``): the bias-free learner's refusal stands, saying why the biased route is not tried
    (before, it was read as "RoPE with q/k biases", the folder's declaration notwithstanding)."""
    from attnprobe.errors import RecoveryError
    from attnprobe.models.positional import PositionalAttention
    from attnprobe.targets import random_rope_attention

    v = random_rope_attention(32, 2, 1, seed=5)
    bk = 0.5 * np.random.default_rng(1).standard_normal((1, 16))
    truth = PositionalAttention(v.Wq, v.Wk, v.Wv, v.Wo, bk=bk, position="rope", inv_freq=v.inv_freq)

    def fn(X):
        return truth(X)

    fn.qk_biases = False
    oracle = Oracle(fn, 32)
    with pytest.raises(RecoveryError) as info:
        extract_any_positional(oracle, seed=0, position="rope", polish="never")
    assert "q/k biases" not in str(info.value).split(";")[0] and "tries next" not in str(info.value)
    assert "declares no q/k biases" in str(info.value) or "biased" not in str(info.value)
