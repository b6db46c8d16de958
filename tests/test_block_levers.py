"""The block learner's levers against the truth (docs/block.md): the last token driven out isolates a pre-norm
block's attention; a post-norm block's output LayerNorm is read from its answers' rows."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.errors import ConfigError  # noqa: E402
from attnprobe.learners.block.levers import (driven_out, ffn_on_sphere, output_layernorm, rational_keys,  # noqa: E402
                                            rational_limit, value_map)
from attnprobe.models.block import fold_norm_weights  # noqa: E402
from attnprobe.oracles.hf_block import block_model, hf_block, oracle_from_hf_block  # noqa: E402
from hf_models import tiny_family_dir  # noqa: E402


def _attention_last(ref, Z):
    Zl = Z.copy()
    Zl[:, -1] *= 1e8  # n1 of a driven-out row: its direction only
    return ref.attention.every_position(ref._norm(Zl, 1))[:, -1]


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_driving_the_last_token_out_isolates_the_attention(tmp_path, family):
    folder = tiny_family_dir(tmp_path / family, family, hidden=32, heads=4, kv_heads=2 if family == "llama" else None,
                             std=0.15)  # weights near 1/√d, as trained layers have them
    oracle = oracle_from_hf_block(folder, 0)
    ref = block_model(hf_block(folder, 0))
    rng = np.random.default_rng(0)
    for N in (2, 9, 24):
        u = rng.standard_normal((3, 1, 32))
        X, X2 = (np.concatenate([rng.standard_normal((3, N - 1, 32)), u], axis=1) for _ in range(2))
        before = oracle.queries
        got = driven_out(oracle.answer_rows, X) - driven_out(oracle.answer_rows, X2)
        assert oracle.queries - before == 2 * 3 * 5  # five steps per sequence
        true = _attention_last(ref, X) - _attention_last(ref, X2)
        assert np.abs(got - true).max() <= 1e-9 * np.abs(true).max(), N
    if family == "gpt_neox":  # parallel: F(n2(t u)) = F(n2(u)), no 1/t term to extrapolate away
        return
    # without the extrapolation (one answer at t = 1e3) the FFN's share is off by O(1/t)
    Xt = X.copy()
    Xt[:, -1] *= 1e3
    plain = oracle.answer_rows(Xt)[:, -1] - Xt[:, -1]
    assert np.abs(plain - driven_out(oracle.answer_rows, X)).max() > 1e-5 * np.abs(plain).max()


def test_output_layernorm_from_the_answers_alone(tmp_path):
    folder = tiny_family_dir(tmp_path / "bert", "bert", hidden=16, heads=2)
    victim = hf_block(folder, 1)
    with torch.no_grad():  # the output norm's weight not 1, its bias not 0 (the oracle runs the same module)
        for name, p in victim.layer.named_parameters():
            if "LayerNorm" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3), dtype=p.dtype) * 0.5)
    oracle = oracle_from_hf_block(folder, 1)
    ref = block_model(victim)
    assert np.abs(ref.norm2_b).max() > 0.1
    rows = oracle.answer_rows(np.random.default_rng(1).standard_normal((8, 5, 16))).reshape(-1, 16)
    w, b = output_layernorm(rows)
    sign = np.sign(w @ ref.norm2_w)
    assert np.abs(sign * w - ref.norm2_w).max() <= 1e-9 * np.abs(ref.norm2_w).max()
    assert np.abs(b - ref.norm2_b).max() <= 1e-9 * np.abs(ref.norm2_b).max()
    with pytest.raises(ConfigError, match="n ≥ d \\+ 3"):
        output_layernorm(rows[:10])
    with pytest.raises(ConfigError, match="not the output of a LayerNorm"):  # a pre-norm block's rows
        output_layernorm(np.random.default_rng(2).standard_normal((40, 16)))


def test_zero_keys_leave_the_ffn_alone_and_the_block_splits_into_its_sublayers(tmp_path):
    """Bias-free attention (LLaMA): F(n2(u)) from k → ∞ zero keys; then the value map and the attention at the last
    position, absolute, each against the truth."""
    folder = tiny_family_dir(tmp_path / "llama", "llama", hidden=32, heads=4, kv_heads=2, std=0.15,
                             attention_bias=False)
    oracle = oracle_from_hf_block(folder, 0)
    ref = block_model(hf_block(folder, 0))
    rng = np.random.default_rng(4)
    U = rng.standard_normal((2, 32))
    before = oracle.queries
    phi = ffn_on_sphere(oracle.answer_rows, U)
    assert oracle.queries - before == 2 * 5 * 5
    true_phi = ref.mlp(ref._norm(U * 1e8, 2))
    assert np.abs(phi - true_phi).max() <= 1e-7 * np.abs(true_phi).max()
    X = np.concatenate([rng.standard_normal((2, 6, 32)), U[:, None]], axis=1)
    attn = driven_out(oracle.answer_rows, X) - phi
    assert np.abs(attn - _attention_last(ref, X)).max() <= 1e-7 * np.abs(attn).max()
    # two zero-key counts only (a linear extrapolation in 1/k) are visibly worse
    rough = ffn_on_sphere(oracle.answer_rows, U, zero_keys=(200, 400))
    assert np.abs(rough - true_phi).max() > 10 * np.abs(phi - true_phi).max()
    with pytest.raises(ConfigError, match="zero_keys"):
        ffn_on_sphere(oracle.answer_rows, U, zero_keys=(5,))


@pytest.mark.slow
def test_the_value_map_times_the_norm_weight_from_single_tokens(tmp_path):
    folder = tiny_family_dir(tmp_path / "llama", "llama", hidden=32, heads=4, kv_heads=2, std=0.15,
                             attention_bias=False)
    victim = hf_block(folder, 0)
    with torch.no_grad():
        victim.layer.input_layernorm.weight.add_(0.3 * torch.randn(32, generator=torch.Generator().manual_seed(5),
                                                                   dtype=torch.float64))
    oracle = oracle_from_hf_block(folder, 0)
    truth = fold_norm_weights(block_model(victim)).attention.value_maps().sum(0)  # only M diag(w1) is identifiable
    M = value_map(oracle.answer_rows, 32)
    assert oracle.queries == 32 * 5 * 6
    assert np.abs(M - truth).max() <= 1e-7 * np.abs(truth).max()
    assert np.abs(M - block_model(victim).attention.value_maps().sum(0)).max() > 1e-3 * np.abs(truth).max()


def test_the_rational_limit_is_exact_where_a_polynomial_in_one_over_k_is_not():
    """``F + Σ_h c_h/(1 + k e^{−s_h})`` (the driven-out token behind k zero keys) with self logits up to 4: the rational
    fit of degree H recovers F to rounding; the degree-4 polynomial in 1/k misses by far more (its series in
    ``e^{s}/k`` converges slowly at k = 200)."""
    rng = np.random.default_rng(0)
    H, d = 8, 40
    s = np.array([4.0, 3.5, 2.0, 1.2, 0.5, -0.3, -1.0, -2.2])
    F, C = rng.standard_normal(d), rng.standard_normal((H, d))
    ks = np.asarray(rational_keys(H), dtype=np.float64)
    assert len(ks) >= 2 * H + 2 and ks.min() == 100 and ks.max() == 1000
    L = F + (1 / (1 + ks[:, None] * np.exp(-s)[None])) @ C
    got = rational_limit(ks.min() / ks, L, H)
    assert np.abs(got - F).max() < 1e-10 * np.abs(F).max()
    poly_keys = np.array([200.0, 400, 600, 800, 1000])  # the polynomial limit's default counts
    weights = np.linalg.solve(np.vander(1 / poly_keys, 5, increasing=True).T, np.eye(5)[0])
    poly = weights @ (F + (1 / (1 + poly_keys[:, None] * np.exp(-s)[None])) @ C)
    assert np.abs(poly - F).max() > 1e3 * np.abs(got - F).max()
    assert np.abs(rational_limit(ks.min() / ks, L, 2) - F).max() > 1e3 * np.abs(got - F).max()  # too few heads
    with pytest.raises(ConfigError, match="zero_keys"):
        ffn_on_sphere(lambda X: X, np.ones((1, 4)), zero_keys=(100, 200, 300), heads=2)
