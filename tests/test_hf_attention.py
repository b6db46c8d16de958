"""The real Hugging Face module as the victim: BertSelfAttention + output dense of a MiniLM-L6 layer (and of small
random BERT folders), its vector-layout parameters, and the torch multi-head layers' whole output rows."""

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from attnprobe.errors import ConfigError  # noqa: E402
from attnprobe.oracles.hf_attention import hf_attention_layer, oracle_from_hf  # noqa: E402
from attnprobe.oracles.torch_multihead import (BertSelfAttentionRow, TorchMultiheadRow,  # noqa: E402
                                               multihead_from_torch)
from attnprobe.targets.hf import (hf_checkpoint, hf_layer_arrays, hf_layer_row, layer_answers,  # noqa: E402
                                  minilm_dir, torch_layer_arrays, vector_layer_arrays)
from hf_models import tiny_bert_dir  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    return minilm_dir()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_bert_dir(tmp_path_factory.mktemp("tiny_bert"))


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("layer", [0, 5])
def test_converter_matches_the_real_module_float64(minilm, layer):
    """W_h = K_hᵀQ_h/√d_h, u_h = K_hᵀb_Q/√d_h, V_h = W_O[:,h] W_V[h], c = W_O b_V + b_O answer like the module."""
    oracle = oracle_from_hf(minilm, layer)
    arrays = hf_layer_arrays(minilm, layer)
    assert {k: v.shape for k, v in arrays.items()} == {"W": (12, 384, 384), "u": (12, 384), "v": (12, 384, 384),
                                                      "c": (384,)}
    rng = np.random.default_rng(layer)
    for N in (1, 2, 5):
        X = 4 * rng.standard_normal((6, N, 384))  # hidden states have norm ~20
        y = oracle(X)
        assert y.shape == (6, 384) and y.dtype == np.float64
        assert _rel(y, layer_answers(arrays, X)) < 1e-10
    assert oracle.queries == 18 and oracle.outputs == 384


def test_converter_is_wrong_when_a_term_is_dropped(minilm):
    """The agreement above is not vacuous: dropping the query bias or the value bias breaks it."""
    oracle = oracle_from_hf(minilm, 1)
    p = hf_checkpoint(minilm).layer_weights(1)
    X = 4 * np.random.default_rng(0).standard_normal((6, 3, 384))
    y = oracle(X)
    no_bq = vector_layer_arrays(p["Q"], p["K"], p["V"], p["WO"], p["bO"], None, p["bV"])
    no_bv = vector_layer_arrays(p["Q"], p["K"], p["V"], p["WO"], p["bO"], p["bQ"], None)
    assert _rel(y, layer_answers(no_bq, X)) > 1e-4
    assert _rel(y, layer_answers(no_bv, X)) > 1e-4


def test_float32_module_answers_in_float32_and_is_detected(minilm):
    """The checkpoint's own dtype: answers agree with the float64 truth to float32 rounding, not better, and
    precision="auto" reads float32 from them."""
    o32 = oracle_from_hf(minilm, 2, dtype="float32", precision="auto")
    o64 = oracle_from_hf(minilm, 2)
    X = 4 * np.random.default_rng(1).standard_normal((64, 2, 384))
    y32, y64 = o32(X), o64(X)
    assert y32.shape == y64.shape == (64, 384) and y32.dtype == np.float64
    err = _rel(y32, y64)
    assert 1e-9 < err < 1e-4
    assert np.array_equal(y32, y32.astype(np.float32).astype(np.float64))  # every answer is a float32 number
    assert o32.precision == "float32"
    assert oracle_from_hf(minilm, 2).precision == "float64"


def test_row_and_readout_answer_one_number(minilm):
    arrays = hf_layer_arrays(minilm, 4)
    X = 4 * np.random.default_rng(2).standard_normal((5, 2, 384))
    full = layer_answers(arrays, X)
    row = oracle_from_hf(minilm, 4, row=17)
    y = row(X)
    assert y.shape == (5,) and row.outputs == 1
    assert _rel(y, full[:, 17]) < 1e-10
    assert _rel(y, hf_layer_row(minilm, 4, 17)(X)) < 1e-10  # the scalar layout of that row
    w = np.random.default_rng(3).standard_normal(384)
    assert _rel(oracle_from_hf(minilm, 4, readout=w)(X), full @ w) < 1e-10


def test_weights_read_from_the_live_module_equal_the_folder(minilm):
    module = hf_attention_layer(minilm, 3)
    from_module, from_file = torch_layer_arrays(module), hf_layer_arrays(minilm, 3)
    for k in from_file:
        np.testing.assert_array_equal(from_module[k], from_file[k])


def test_module_is_in_eval_mode_and_deterministic(minilm):
    """No dropout: the same batch gets the same answers (MiniLM's config has attention dropout 0.1)."""
    oracle = oracle_from_hf(minilm, 0)
    X = np.random.default_rng(4).standard_normal((8, 3, 384))
    np.testing.assert_array_equal(oracle(X), oracle(X))


def test_a_model_left_in_training_mode_still_answers_without_dropout(tiny):
    from attnprobe.oracles.hf_attention import load_hf_model

    load_hf_model(tiny).train()  # someone trained the cached model: the oracle still answers deterministically
    try:
        oracle = oracle_from_hf(tiny, 0)
        X = np.random.default_rng(5).standard_normal((8, 3, 16))
        np.testing.assert_array_equal(oracle(X), oracle(X))
        assert _rel(oracle(X), layer_answers(hf_layer_arrays(tiny, 0), X)) < 1e-10
    finally:
        load_hf_model(tiny).eval()


def test_any_bert_folder(tiny):
    """A random BERT folder (2 heads, d = 16) read the same two ways: converter and live module agree."""
    for layer in (0, 1):
        oracle = oracle_from_hf(tiny, layer)
        X = np.random.default_rng(layer).standard_normal((10, 4, 16))
        assert _rel(oracle(X), layer_answers(hf_layer_arrays(tiny, layer), X)) < 1e-10
    assert hf_checkpoint(tiny).heads_per_layer == 2


@pytest.mark.parametrize("bad, match", [
    ({"layer": 6}, r"0\.\.5 \(the layers"), ({"layer": 0, "row": 384}, r"0\.\.383"), ({"layer": 0, "dtype": "float16"},
                                                                                  "float64, float32"),
])
def test_bad_arguments_are_refused(minilm, bad, match):
    with pytest.raises(ConfigError, match=match):
        oracle_from_hf(minilm, **bad)


def test_a_folder_without_the_files_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        oracle_from_hf(tmp_path, 0)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="model_type None"):
        hf_checkpoint(tmp_path)


@pytest.mark.parametrize("H, d", [(2, 8), (4, 16)])
def test_torch_multihead_whole_out_proj_row(H, d):
    """nn.MultiheadAttention answers its whole out_proj row with row=None; the vector layout reproduces it, and
    each row of it is the scalar layout of that row."""
    torch.manual_seed(H)
    module = TorchMultiheadRow(d, H, row=None).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.7)
    from attnprobe.oracles.torch_adapter import oracle_from_torch

    oracle = oracle_from_torch(module, d)
    X = np.random.default_rng(H).standard_normal((9, 3, d))
    y = oracle(X)
    assert y.shape == (9, d)
    arrays = torch_layer_arrays(module)
    assert arrays["v"].shape == (H, d, d)
    assert _rel(y, layer_answers(arrays, X)) < 1e-12
    assert _rel(y[:, 2], multihead_from_torch(module, row=2)(X)) < 1e-12
    with pytest.raises(ConfigError, match="output row"):
        multihead_from_torch(module)


def test_bert_self_attention_row_whole_row():
    torch.manual_seed(0)
    module = BertSelfAttentionRow(12, 3, row=None).eval()
    X = np.random.default_rng(0).standard_normal((4, 2, 12))
    with torch.no_grad():
        y = module(torch.as_tensor(X)).numpy()
    assert y.shape == (4, 12)
    assert _rel(y, layer_answers(torch_layer_arrays(module), X)) < 1e-12


def test_a_float32_module_declares_float32_and_reads_one_row_in_float32(tiny):
    """Without a declared precision the oracle takes the module's own: float32 (learners set their thresholds by
    it: a float32 module taken as float64 refuses or fails for no reason). A row read out of the float32 module
    is computed in float32 (a float32 number per answer) and equals that row of the whole float32 output."""
    o32 = oracle_from_hf(tiny, 1, dtype="float32")
    assert o32.precision == "float32" and o32.eps == np.finfo(np.float32).eps
    row = oracle_from_hf(tiny, 1, dtype="float32", row=3)
    assert row.precision == "float32"
    X = np.random.default_rng(4).standard_normal((6, 3, 16))
    y, full = row(X), o32(X)
    assert y.shape == (6,) and np.array_equal(y, y.astype(np.float32).astype(np.float64))
    assert np.array_equal(y, full[:, 3])
