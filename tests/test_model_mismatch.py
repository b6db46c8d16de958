"""Refusals that name the real cause: a normalised output (ALBERT's attention module returns LayerNorm(X + attn))
and a layer that attends to a learned row besides the input (nn.MultiheadAttention(add_bias_kv=True)) are named
as such, not as input clipping or a head count; a real clamp is still a clamp."""

import textwrap

import numpy as np
import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from attnprobe.cli import main  # noqa: E402
from attnprobe.errors import ModelMismatchError  # noqa: E402
from attnprobe.learners import registry  # noqa: E402
from attnprobe.oracles import Oracle  # noqa: E402
from attnprobe.oracles.input_bound import mismatch_cause  # noqa: E402

VICTIMS = '''
import numpy as np
import torch

torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(16, 2, bias=True, add_bias_kv={bias_kv}, batch_first=True, dtype=torch.float64)
with torch.no_grad():
    for p in mha.parameters():
        p.normal_(0.0, 0.4)


def layer(X):
    X = torch.as_tensor(X)
    with torch.no_grad():
        return mha(X[:, -1:], X, X, need_weights=False)[0][:, 0].numpy()
'''


def _albert_normed(tmp_path):
    """ALBERT's whole attention module, LayerNorm(X + attn), with a trained-looking norm (γ, β not 1, 0)."""
    from attnprobe.oracles.hf_attention import load_hf_model
    from hf_models import tiny_family_dir

    model = load_hf_model(tiny_family_dir(tmp_path / "albert", "albert", hidden=16, heads=2, layers=1))
    att = model.encoder.albert_layer_groups[0].albert_layers[0].attention
    with torch.no_grad():
        att.LayerNorm.weight.normal_(1.0, 0.3)
        att.LayerNorm.bias.normal_(0.0, 0.3)

    def answer(X):
        with torch.no_grad():
            return att(torch.as_tensor(X))[0][:, -1].numpy()
    return answer


def test_a_normalised_output_is_named_not_clipping(tmp_path):
    oracle = Oracle(_albert_normed(tmp_path), 16, outputs=16)
    with pytest.raises(ModelMismatchError, match="normalised .*LayerNorm") as info:
        registry.learner("multihead")(oracle, seed=0)
    assert "clips" not in str(info.value) and "H=" not in str(info.value)


@pytest.mark.parametrize("bias_kv, code, want", [(True, 2, "add_bias_kv=True"), (False, 0, None)])
def test_an_extra_attended_row_is_named_not_a_head_count(tmp_path, monkeypatch, capsys, bias_kv, code, want):
    (tmp_path / "mha_victim.py").write_text(textwrap.dedent(VICTIMS.format(bias_kv=bias_kv)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    got = main(["extract", "--oracle", "mha_victim:layer", "--d", "16", "--method", "multihead",
                "--out", str(tmp_path / "r.npz"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert got == code, err
    if want:
        assert len(err.splitlines()) == 1 and want in err and "H=" not in err and "clips" not in err, err
        assert not (tmp_path / "r.npz").exists()


def test_an_attention_layer_is_not_called_normalised():
    """The causes are not vacuous: a plain multi-head layer (affine length-1 answers, whole rows spanning the output
    space) gets none."""
    from attnprobe.targets import random_multihead
    from attnprobe.models.multihead import MultiHeadAttention

    m = random_multihead(8, 2, seed=0)
    V = np.random.default_rng(0).standard_normal((2, 8, 8))
    layer = MultiHeadAttention(m.W, V, m.u, np.zeros(8))
    assert mismatch_cause(Oracle(layer, 8, outputs=8), 1e3) is None
