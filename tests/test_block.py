"""Whole blocks (docs/block.md): the numpy model against transformers' layer modules, its gauges (what the answers
cannot fix), the repeated-token lever, files and bad input."""

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.errors import ConfigError  # noqa: E402
from attnprobe.models import load_model, save_model  # noqa: E402
from attnprobe.models.block import TransformerBlock, flip_post_norm_sign, fold_norm_weights  # noqa: E402
from attnprobe.models.smooth_ffn import SmoothFFN  # noqa: E402
from attnprobe.oracles.hf_block import block_model, hf_block, oracle_from_hf_block  # noqa: E402
from hf_models import tiny_family_dir  # noqa: E402

FAMILIES = {"llama": dict(hidden=32, heads=4, kv_heads=2), "qwen2": dict(hidden=32, heads=4, kv_heads=2),
            "mistral": dict(hidden=32, heads=4, kv_heads=2), "gpt_neox": dict(hidden=32, heads=4),
            "bert": dict(hidden=16, heads=2)}


def _victim(tmp_path, family, seed=0, **extra):
    folder = tiny_family_dir(tmp_path / family, family, seed=seed, **{**FAMILIES[family], **extra})
    v = hf_block(folder, 1)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # norm weights not 1, biases not 0
        for name, p in v.layer.named_parameters():
            if "norm" in name.lower():
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return v


def _answers(v, X):
    with torch.no_grad():
        return v(torch.as_tensor(X)).numpy()


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_model_answers_like_the_layer_module_at_every_position(tmp_path, family):
    v = _victim(tmp_path, family)
    m = block_model(v)
    assert m.layout == {"bert": "post", "gpt_neox": "parallel"}.get(family, "pre")
    assert m.gated == (family in ("llama", "qwen2", "mistral"))
    rng = np.random.default_rng(1)
    for N in (1, 2, 7, 33):
        X = rng.standard_normal((3, N, v.d))
        assert _rel(m(X), _answers(v, X)) <= 1e-12, N
    # a wrong part is seen: the norm weights of the second norm off by 1e-6
    wrong = replace(m, norm2_w=m.norm2_w * (1 + 1e-6))
    assert _rel(wrong(X), _answers(v, X)) > 1e-9


def test_gpt_neox_sequential_residual_is_the_pre_norm_layout(tmp_path):
    v = _victim(tmp_path, "gpt_neox", use_parallel_residual=False)
    m = block_model(v)
    X = np.random.default_rng(2).standard_normal((2, 9, v.d))
    assert m.layout == "pre" and _rel(m(X), _answers(v, X)) <= 1e-12


def test_llama_decoder_layer_d128_and_its_float32_rmsnorm(tmp_path):
    """The issue's LLaMA layer (d = 128, 8/2 heads, SwiGLU 256): the model to 1e-12 of the float64 victim; the
    module as transformers ships it computes RMSNorm in float32, so it differs by float32 rounding, no more."""
    folder = tiny_family_dir(tmp_path / "llama128", "llama", hidden=128, heads=8, kv_heads=2, layers=1)
    v = hf_block(folder, 0)
    m = block_model(v)
    assert (m.m, m.attention.H, m.attention.G) == (256, 8, 2)
    X = np.random.default_rng(3).standard_normal((2, 64, 128))
    assert _rel(m(X), _answers(v, X)) <= 1e-12
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    shipped = LlamaRMSNorm(128, eps=m.eps).to(torch.float64)
    with torch.no_grad():
        shipped.weight.copy_(torch.as_tensor(np.array(m.norm1_w)))
        x = torch.as_tensor(X)
        err = float((shipped(x) - v.layer.input_layernorm(x)).abs().max() / shipped(x).abs().max())
    assert 1e-12 < err < 1e-6  # float32 rounding of the normalised rows, which the float64 victim takes out


def test_minilm_bert_layer_is_the_post_norm_block():
    from attnprobe.targets.hf import minilm_dir

    try:
        folder = minilm_dir()
    except ConfigError:
        pytest.skip("MiniLM weights not installed")
    v = hf_block(folder, 2)
    m = block_model(v)
    assert (m.d, m.m, m.layout, m.norm, m.activation) == (384, 1536, "post", "layer", "gelu")
    X = np.random.default_rng(4).standard_normal((2, 12, 384))
    assert _rel(m(X), _answers(v, X)) <= 1e-12


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_norm_weights_fold_into_the_next_projections(tmp_path, family):
    m = block_model(_victim(tmp_path, family))
    f = fold_norm_weights(m)
    X = np.random.default_rng(5).standard_normal((3, 8, m.d))
    up = "Wu" if m.gated else "W1"
    assert np.all(f.norm1_w == 1) and np.all(f.norm2_w == 1) and not np.allclose(getattr(f.ffn, up), getattr(m.ffn, up))
    assert _rel(f(X), m(X)) <= 1e-13
    with pytest.raises(ConfigError, match="do not fold"):
        fold_norm_weights(block_model(_victim(tmp_path, "bert")))


def test_post_norm_sign_gauge_and_the_ones_direction(tmp_path):
    m = block_model(_victim(tmp_path, "bert"))
    X = np.random.default_rng(6).standard_normal((3, 8, m.d))
    flipped = flip_post_norm_sign(m)
    assert _rel(flipped(X), m(X)) <= 1e-14 and np.allclose(flipped.norm2_w, -m.norm2_w)
    # the last norm's bias is not part of the gauge: flipping it too changes the answers
    wrong = replace(flipped, norm2_b=-m.norm2_b)
    assert _rel(wrong(X), m(X)) > 1e-3
    # a LayerNorm ignores the ones direction of its input: W2 + 1 vᵀ, b2 + c 1 answer the same
    v = np.random.default_rng(7).standard_normal(m.m)
    shifted = replace(m, ffn=replace(m.ffn, W2=m.ffn.W2 + np.outer(np.ones(m.d), v), b2=m.ffn.b2 + 0.7))
    assert _rel(shifted(X), m(X)) <= 1e-12


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_a_repeated_token_answers_the_length_one_map_at_every_row(tmp_path, family):
    """Identical keys carry identical values: attention returns the value map whatever its weights or RoPE."""
    m = block_model(_victim(tmp_path, family))
    x = np.random.default_rng(8).standard_normal((4, 1, m.d))
    one = m(x)
    for N in (2, 17, 64):
        rows = m(np.repeat(x, N, axis=1))
        assert np.abs(rows - one).max() / np.abs(one).max() <= 1e-13, N


def test_files_dtypes_and_bad_input(tmp_path):
    m = block_model(_victim(tmp_path, "llama"))
    X = np.random.default_rng(9).standard_normal((2, 5, m.d))
    back = load_model(save_model(m, tmp_path / "b.npz"))
    assert isinstance(back, TransformerBlock) and np.array_equal(back(X), m(X))
    assert back.positions == "positional" and back(X).shape == (2, 5, m.d)
    r32 = _rel(m.with_dtype("float32")(X), m(X))
    assert 1e-9 < r32 < 1e-4
    with pytest.raises(ConfigError) as exc:  # an FFN that does not map d numbers to d
        replace(m, ffn=SmoothFFN(m.ffn.Wu, m.ffn.bu, m.ffn.W2[:-1], m.ffn.b2[:-1], "gelu"))
    assert exc.value.param == "ffn"
    with pytest.raises(ConfigError) as exc:
        replace(m, ffn=m.ffn.arrays())
    assert exc.value.param == "ffn"
    with pytest.raises(ConfigError) as exc:
        replace(m, norm1_b=np.zeros(m.d))
    assert exc.value.param == "norm1_b"


def test_a_file_saved_before_the_block_held_its_ffn_model_loads(tmp_path):
    """Block files once held the FFN flat (``W_in, W_out, W_gate``, absent biases meaning zeros, ``activation``):
    such a file loads to the same block; one with neither layout is refused naming the missing arrays."""
    m = block_model(_victim(tmp_path, "llama"))
    f = m.ffn
    flat = {k: v for k, v in m.arrays().items() if k != "ffn" and not k.startswith("ffn_")}
    flat.update(W_in=f.Wu, W_out=f.W2, W_gate=f.Wg, activation=f.arrays()["activation"])
    np.savez(tmp_path / "old.npz", kind=np.asarray(m.kind), **flat)
    X = np.random.default_rng(10).standard_normal((2, 5, m.d))
    back = load_model(tmp_path / "old.npz")
    assert back.gated and np.array_equal(back(X), m(X))
    del flat["W_in"]
    np.savez(tmp_path / "bad.npz", kind=np.asarray(m.kind), **flat)
    with pytest.raises(ConfigError, match="needs arrays.*ffn"):
        load_model(tmp_path / "bad.npz")


def test_block_oracle_answers_every_position(tmp_path):
    folder = tiny_family_dir(tmp_path / "b", "bert", **FAMILIES["bert"])
    o = oracle_from_hf_block(folder, 0)
    X = np.random.default_rng(10).standard_normal((2, 6, o.d))
    rows = o.answer_rows(X)
    assert rows.shape == (2, 6, o.d) and o.positions == "bidirectional" and o.queries == 2
    assert np.allclose(o(X), rows[:, -1])
    with pytest.raises(ConfigError, match="reads whole blocks of"):
        oracle_from_hf_block(tiny_family_dir(tmp_path / "g", "gpt2", hidden=16, heads=2), 0)


@pytest.mark.parametrize("dtype,low,high", [("float32", 1e-9, 1e-4), ("bfloat16", 1e-4, 0.2)])
def test_coarser_victims_answer_within_their_rounding(tmp_path, dtype, low, high):
    """A block served in float32 or bfloat16 (as block servers cast hidden states) answers like the float64 model
    up to its own rounding, and says its precision."""
    folder = tiny_family_dir(tmp_path / "llama", "llama", **FAMILIES["llama"])
    o = oracle_from_hf_block(folder, 1, dtype=dtype)
    m = block_model(hf_block(folder, 1))
    X = np.random.default_rng(11).standard_normal((2, 7, m.d))
    err = _rel(o.answer_rows(X), m(X))
    assert o.precision == dtype and low < err < high
