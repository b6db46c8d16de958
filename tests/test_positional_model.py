"""The positional attention model against the real ``transformers`` modules (random init, d = 128, float64)."""

import numpy as np
import pytest

from attnprobe.errors import ConfigError
from attnprobe.models import load_model, save_model
from attnprobe.models.positional import PositionalAttention, rope_frequencies, rotate, rotation_pairs, t5_buckets

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.targets.positional_modules import positional_victim, reference_model  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
CASES = [("llama", {}), ("qwen2", {}), ("gpt_neox", {}), ("t5", {}), ("llama", {"rope": LLAMA3}),
         ("llama", {"rope": {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}})]


@pytest.mark.parametrize("family,kw", CASES, ids=["llama", "qwen2", "gpt_neox", "t5", "llama3", "linear"])
def test_model_answers_like_the_module_at_every_position(family, kw):
    victim = positional_victim(family, seed=1, **kw)
    model = reference_model(victim)
    rng = np.random.default_rng(0)
    for N in (1, 2, 9, 70):  # 70 > T5's exact buckets and LLaMA-3's short wavelengths
        X = rng.standard_normal((2, N, 128))
        want = victim.every_position(X).numpy()
        scale = np.abs(want).max()
        assert np.abs(model.every_position(X) - want).max() <= 1e-12 * scale
        assert np.abs(model(X) - want[:, -1]).max() <= 1e-12 * scale


def test_bloom_differs_only_by_its_float32_softmax():
    victim = positional_victim("bloom", seed=1)
    model = reference_model(victim)
    X = np.random.default_rng(0).standard_normal((2, 30, 128))
    want = victim.every_position(X).numpy()
    err = np.abs(model.every_position(X) - want).max() / np.abs(want).max()
    assert err <= 1e-6  # the module rounds its softmax to float32 (unit roundoff 6e-8)
    assert np.abs(model.with_dtype("float32").every_position(X) - want).max() / np.abs(want).max() <= 1e-5


def test_positions_matter_and_the_offset_alone_counts():
    model = reference_model(positional_victim("llama", seed=2))
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1, 6, 128))
    far = np.concatenate([X[:, :1], np.zeros((1, 4, 128)), X[:, 1:]], axis=1)  # first key moved 4 places away
    zero_rows = np.concatenate([np.zeros((1, 4, 128)), X], axis=1)  # every token shifted: offsets unchanged
    assert np.abs(model(far) - model(X)).max() > 1e-3 * np.abs(model(X)).max()
    B0 = model.logit_matrix(0, 0)
    assert np.abs(model.logit_matrix(0, -1) - B0).max() > 0.1 * np.abs(B0).max()
    # keys that are zero add nothing but their (zero) logit: shifting every position keeps the offsets
    ratio = model.attention(zero_rows)[0, :, 4:] / model.attention(X)[0]
    assert np.allclose(ratio, ratio[:, :1])


def test_frequencies_match_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for params in (LLAMA3, {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}):
        cfg = LlamaConfig(hidden_size=256, num_attention_heads=2, rope_parameters=dict(params))
        want = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")[0].double().numpy()  # computed in float32
        got = rope_frequencies(128, params["rope_theta"], scaling=params["rope_type"],
                               **{k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")})
        assert np.abs(got / want - 1).max() < 1e-6
    plain = rope_frequencies(128, 1e4)
    assert plain[0] == 1.0 and np.isclose(plain[-1], 1e4 ** (-126 / 128))


def test_interleaved_layout_is_gptj_rotate_every_two():
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 5, 2, 16))  # (B, N, heads, d_h) as GPT-J rotates it
    inv = rope_frequencies(16, 1e4)
    ang = np.arange(5)[:, None] * inv[None]
    sin, cos = (torch.as_tensor(f(ang))[None] for f in (np.sin, np.cos))
    want = apply_rotary_pos_emb(torch.as_tensor(x), sin, cos)
    got = rotate(x, ang[None, :, None, :], rotation_pairs(16, "interleaved"))
    assert np.abs(got - want.numpy()).max() < 1e-14
    # the same function as the rotate-half layout with the pair coordinates permuted
    half = reference_model(positional_victim("llama", d=64, heads=4, seed=4))
    a, b = rotation_pairs(16, "half")
    ia, ib = rotation_pairs(16, "interleaved")
    perm = np.empty(16, int)
    perm[ia], perm[ib] = a, b
    inter = PositionalAttention(half.Wq[:, perm], half.Wk[:, perm], half.Wv, half.Wo, position="rope",
                                inv_freq=half.inv_freq, layout="interleaved")
    X = rng.standard_normal((2, 12, 64))
    assert np.abs(inter.every_position(X) - half.every_position(X)).max() < 1e-13 * np.abs(half(X)).max()


def test_t5_buckets_match_transformers():
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = np.arange(-300, 301)[None]
    for bidi in (True, False):
        want = T5Attention._relative_position_bucket(torch.as_tensor(rel), bidirectional=bidi, num_buckets=32,
                                                     max_distance=128).numpy()
        assert (t5_buckets(rel, 32, 128, bidi) == want).all()


def test_saved_and_loaded(tmp_path):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((2, 11, 128))
    for family in ("qwen2", "t5", "bloom"):
        model = reference_model(positional_victim(family, seed=6))
        back = load_model(save_model(model, tmp_path / f"{family}.npz"))
        assert type(back) is PositionalAttention and back.position == model.position
        assert np.array_equal(back.every_position(X), model.every_position(X))


def test_bad_parameters_are_named():
    W = np.zeros((4, 8, 16))
    with pytest.raises(ConfigError, match="inv_freq"):
        PositionalAttention(W, W[:2], W[:2], np.zeros((16, 32)), position="rope")
    with pytest.raises(ConfigError, match="split evenly"):
        PositionalAttention(W, W[:3], W[:3], np.zeros((16, 32)), position="none")
    with pytest.raises(ConfigError, match="slopes"):
        PositionalAttention(W, W, W, np.zeros((16, 32)), position="alibi", slopes=np.ones(3))
    with pytest.raises(ConfigError, match="llama3|scaling"):
        rope_frequencies(8, 1e4, scaling="yarn")
