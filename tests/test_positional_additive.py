"""T5 relative buckets and BLOOM's ALiBi learned from the real ``transformers`` modules (T5Attention,
BloomAttention), the route between RoPE and an additive bias, and what is refused."""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.errors import UnidentifiableError  # noqa: E402
from attnprobe.learners.positional.additive import extract_additive  # noqa: E402
from attnprobe.learners.positional.route import declared_position, detect_position  # noqa: E402
from attnprobe.models.positional import PositionalAttention, t5_buckets  # noqa: E402
from attnprobe.oracles.base import Oracle  # noqa: E402
from attnprobe.oracles.torch_adapter import TorchFunction  # noqa: E402
from attnprobe.targets.positional import random_rope_attention  # noqa: E402
from attnprobe.targets.positional_modules import EveryRow, positional_victim, reference_model  # noqa: E402

LENGTHS = (1, 2, 8, 64, 256)


def _worst(model, truth, d, rows=False, seed=7):
    """Largest error over lengths up to 256, relative to the answers' spread (last row, or every row)."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for N in LENGTHS:
        X = rng.standard_normal((4, N, d))
        y = truth.every_position(X) if rows else truth(X)
        yh = model.every_position(X) if rows else model(X)
        worst = max(worst, float(np.abs(yh - y).max() / np.abs(y - y.mean(axis=0)).max()))
    return worst


@pytest.fixture(scope="module")
def t5():
    return positional_victim("t5", d=64, heads=4, seed=1)


@pytest.mark.slow
def test_t5_relative_buckets_from_the_last_row(t5):
    """Float64 T5Attention, last-position answers: the function within 1e-8 at every length up to 256, each
    head's bucket values (up to the per-head constant) for every bucket a negative offset reaches."""
    truth = reference_model(t5)
    res = extract_additive(Oracle(TorchFunction(t5, 64), 64, precision="float64"), seed=0)
    assert res.passed and res.check.error < 1e-8
    m = res.model
    assert m.position == "t5" and res.details["position"] == "t5" and res.details["offset_signal"] > 1e-2
    assert _worst(m, truth, 64) < 1e-8
    # heads come out in any order: match them by their value maps, then compare the bias at offsets 0 … −255
    Vt, Vm = truth.value_maps(), m.value_maps()
    offs = -np.arange(256)
    for h in range(4):
        g = int(np.argmin([np.linalg.norm(Vm[h] - Vt[k]) for k in range(4)]))
        bt, bm = truth.position_bias(offs)[g], m.position_bias(offs)[h]
        assert np.abs((bm - bm[0]) - (bt - bt[0])).max() < 1e-8
    assert res.details["buckets_seen"] == 16  # the negative half: positive offsets never reach the last row


@pytest.mark.slow
def test_t5_every_position_reads_the_positive_offsets(t5):
    """With every row of the bidirectional encoder, the positive-offset buckets are read too (all but the one no
    offset reaches), and the recovered layer answers every row like the module."""
    truth = reference_model(t5)
    oracle = Oracle(EveryRow(t5), 64, precision="float64")
    res = extract_additive(oracle, seed=0, position="t5")
    assert res.passed and res.details["bidirectional"] and res.details["buckets_seen"] == 31
    assert not res.model.causal
    assert _worst(res.model, truth, 64, rows=True) < 1e-8
    assert oracle.rows > oracle.queries  # every row was read


@pytest.mark.slow
def test_bloom_alibi_slopes_from_a_float32_softmax():
    """BLOOM computes its softmax in float32 whatever the module's dtype: the slopes come out to 1e-6 (absolute),
    the layer is read as ALiBi and causal, and the check's verdict is honest about the function (largest error 3e-3
    at d = 128 and 1e-2 at d = 64 here: the 1e-5 target is not met yet)."""
    victim = positional_victim("bloom", d=64, heads=4, seed=0)
    truth = reference_model(victim)
    res = extract_additive(Oracle(TorchFunction(victim, 64), 64, precision="float32"), seed=0)
    assert res.details["position"] == "alibi" and res.model.causal
    assert np.allclose(np.sort(res.model.slopes), np.sort(truth.slopes), rtol=0, atol=1e-5)
    worst = _worst(res.model, truth, 64)
    assert worst < 0.1
    if res.passed:  # a check that says "passed" bounds the error
        assert res.check.error <= res.check.tolerance and worst < 20 * res.check.tolerance


def test_the_route_reads_the_position_term_from_the_answers(t5):
    """A key before a zero query: its weight depends on its position under an additive bias, not under RoPE."""
    rng = np.random.default_rng(0)
    t5_oracle = Oracle(TorchFunction(t5, 64), 64, precision="float64")
    kind, spread = detect_position(t5_oracle, rng)
    assert kind == "additive" and spread > 1e-2
    rope = random_rope_attention(64, 4, 2, seed=0)
    kind, spread = detect_position(Oracle(rope, 64, precision="float64"), rng)
    assert kind == "rope" and spread < 1e-12
    t5_oracle.fn.position_term = "t5"
    assert declared_position(t5_oracle.fn) == "t5"


def test_an_offset_free_layer_is_refused_naming_the_cause():
    rng = np.random.default_rng(0)
    d, H, dh = 32, 4, 8
    plain = PositionalAttention(rng.standard_normal((H, dh, d)) / 6, rng.standard_normal((H, dh, d)) / 6,
                                rng.standard_normal((H, dh, d)) / 6, rng.standard_normal((d, H * dh)) / 6,
                                position="none", causal=True)
    with pytest.raises(UnidentifiableError, match="do not depend on its position"):
        extract_additive(Oracle(plain, d, precision="float64"), seed=0)


def test_bucket_layout_is_fitted_not_assumed():
    """A T5 layer with 16 buckets and max distance 32 (not T5's default) is read as such from the answers."""
    rng = np.random.default_rng(3)
    d, H, dh = 32, 2, 16
    s = 1 / np.sqrt(d)
    layer = PositionalAttention(rng.standard_normal((H, dh, d)) * s, rng.standard_normal((H, dh, d)) * s,
                                rng.standard_normal((H, dh, d)) * s, rng.standard_normal((d, H * dh)) * s,
                                position="t5", rel_bias=rng.standard_normal((H, 16)), max_distance=32,
                                bidirectional=True, causal=False, scale=1.0)
    res = extract_additive(Oracle(layer, d, precision="float64"), seed=0, max_offset=64)
    assert (res.details["buckets"], res.details["max_distance"]) in ((16, 32), (8, 32))
    offs = -np.arange(300)
    assert np.array_equal(t5_buckets(offs, 16, 32, True) >= 0, np.ones(300, bool))
    assert _worst(res.model, layer, d) < 1e-8


def test_estimate_follows_the_position_route():
    """--estimate with --position t5 plans the additive route (values, zero-query Jacobians, sketches, biases):
    measured 3,976 sequences + 40 check on T5Attention at d = 128 (benchmarks/positional.md)."""
    from attnprobe.learners.core.estimate import estimate_queries

    t5 = estimate_queries("positional", 128, outputs=128, heads=8, position="t5")
    rope = estimate_queries("positional", 128, outputs=128, heads=8, position="rope")
    assert 3600 <= t5.queries <= 4400 and rope.queries > 3 * t5.queries


def test_a_float32_t5_module_is_refused_for_its_additive_bias_not_as_rope_with_biases():
    """Read from float32 answers, a T5 bias that fits no bucket layout is refused for that (the route's RoPE with
    q/k biases reads float64 answers only: it is not tried, and its refusal is not the one that names the cause)."""
    from attnprobe.errors import RecoveryError
    from attnprobe.learners.positional.route import extract_any_positional

    oracle = Oracle(TorchFunction(positional_victim("t5", d=32, heads=2, seed=1, dtype="float32"), 32), 32)
    with pytest.raises(RecoveryError) as err:
        extract_any_positional(oracle, heads=2, seed=0, polish="never")
    msg = str(err.value)
    assert msg.startswith("an additive position bias") and "coarse answers" in msg and "not tried" in msg
    assert "\n" not in msg


def test_alibi_from_float32_answers_that_misses_its_check_is_refused_naming_the_precision():
    """A float32 BLOOM module (d = 32, 4 heads, d_h = 8): the additive route's stages difference the answers at
    their rounding and the result misses float32's tolerance (3.0e-3 measured): one line naming the precision and
    the position term, not a failed check (exit 3)."""
    from attnprobe.learners.positional.route import extract_any_positional
    from attnprobe.oracles.torch_adapter import oracle_from_torch

    oracle = oracle_from_torch(positional_victim("bloom", dtype="float32", d=32, heads=4, seed=0), 32,
                               precision="float32")
    with pytest.raises(UnidentifiableError) as exc:
        extract_any_positional(oracle, heads=4, polish="never", position="alibi")
    msg = str(exc.value)
    assert "float32 (rounding 1.2e-07)" in msg and "(alibi)" in msg and "not recovered at float32" in msg
    assert "\n" not in msg and f"{oracle.queries} queries spent" in msg
