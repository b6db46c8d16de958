import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnprobe.errors import ConfigError  # noqa: E402
from attnprobe.learners.multihead import extract_multihead  # noqa: E402
from attnprobe.models import match_heads  # noqa: E402
from attnprobe.oracles.torch_adapter import oracle_from_torch  # noqa: E402
from attnprobe.oracles.torch_multihead import (BertSelfAttentionRow, TorchMultiheadRow,  # noqa: E402
                                               multihead_from_torch)
from attnprobe.targets import minilm_layer  # noqa: E402
from attnprobe.targets.minilm import minilm_torch_layer  # noqa: E402


def _randomise(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)


@pytest.mark.parametrize("H,d,row", [(1, 4, 0), (2, 8, 3), (4, 12, 11)])
def test_nn_multiheadattention_equals_numpy_model(H, d, row):
    torch.manual_seed(H)
    mod = TorchMultiheadRow(d, H, row).eval()
    _randomise(mod, H + d)
    oracle = oracle_from_torch(mod)
    model = multihead_from_torch(mod)
    X = np.random.default_rng(0).standard_normal((16, 5, d))
    y = oracle(X)
    assert oracle.queries == 16 and oracle.precision == "float64"
    assert np.max(np.abs(model(X) - y)) <= 1e-12 * max(1.0, np.max(np.abs(y)))


def test_bert_style_minilm_layer_equals_numpy_model():
    mod = minilm_torch_layer(3, output_row=7)
    X = np.random.default_rng(1).standard_normal((8, 6, 384))
    y = oracle_from_torch(mod)(X)
    ref = minilm_layer(3, output_row=7)
    assert np.max(np.abs(ref(X) - y)) <= 1e-12 * np.max(np.abs(y))
    back = multihead_from_torch(mod)
    assert match_heads(ref, back).worst < 1e-13


def test_float32_torch_answers_are_float32_close():
    mod = minilm_torch_layer(0, output_row=2, dtype=torch.float32)
    oracle = oracle_from_torch(mod)
    assert oracle.precision == "float32"
    X = np.random.default_rng(2).standard_normal((8, 4, 384))
    y, ref = oracle(X), minilm_layer(0, output_row=2)(X)
    err = np.max(np.abs(y - ref)) / np.max(np.abs(ref))
    assert 1e-9 < err < 1e-4


def test_bert_module_checks_its_shape():
    with pytest.raises(ConfigError, match="multiple"):
        BertSelfAttentionRow(10, 3)
    with pytest.raises(ConfigError, match="output row"):
        multihead_from_torch(torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64), row=9)


def test_extract_multihead_from_torch_with_known_subspaces():
    """A torch layer whose heads live in orthogonal coordinate blocks (biases kept: u_h = K_hᵀb_Q stays in the
    block) is recovered head by head through the torch oracle."""
    d, H = 8, 2
    mod = TorchMultiheadRow(d, H, row=1)
    _randomise(mod, 3)
    E = np.eye(d).reshape(d, H, d // H).transpose(1, 0, 2)  # head h reads/writes coordinates 4h..4h+3
    with torch.no_grad():
        P = mod.attn.in_proj_weight
        for h in range(H):
            rows = slice(h * 4, (h + 1) * 4)
            other = [c for c in range(d) if not rows.start <= c < rows.stop]
            for block in range(3):  # q, k, v of head h only see the head's coordinates
                P[block * d + rows.start: block * d + rows.stop, other] = 0.0
    truth = multihead_from_torch(mod)
    res = extract_multihead(oracle_from_torch(mod), subspaces=E, seed=0)
    assert match_heads(truth, res.model).worst < 1e-9
    assert res.check.passed
