"""Post-norm (BERT) blocks (docs/block.md, "Post-norm blocks"): what the answers cannot fix — the first norm's
output scale (through ε only) and shift, the FFN following — on a real transformers ``BertLayer``, and the block
learner's one-line refusal of such a layer from its folder."""

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.cli import main  # noqa: E402
from attnprobe.errors import ConfigError  # noqa: E402
from attnprobe.models.block import rescale_post_norm  # noqa: E402
from attnprobe.oracles.hf_block import block_model, hf_block  # noqa: E402
from hf_models import tiny_bert_dir  # noqa: E402


def _bert_layer(tmp_path):
    """Layer 1 of a random ``BertModel`` (d = 16, 2 heads, FFN 32, weights N(0, 0.25)), norm weights not 1."""
    v = hf_block(tiny_bert_dir(tmp_path / "bert", hidden=16, heads=2), 1)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in v.layer.named_parameters():
            if "LayerNorm" in name:
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return v


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_the_first_norms_scale_and_shift_are_gauges_when_the_ffn_follows(tmp_path):
    v = _bert_layer(tmp_path)
    m = block_model(v)
    X = np.random.default_rng(1).standard_normal((3, 8, m.d))
    with torch.no_grad():
        assert _rel(m(X), v(torch.as_tensor(X)).numpy()) <= 1e-12
    for c, s in ((2.5, 0.4), (0.3, -1.0), (-1.7, 0.0)):
        g = rescale_post_norm(m, c, s)
        assert np.allclose(g.norm1_w, c * m.norm1_w) and not np.allclose(g.ffn.W1, m.ffn.W1)
        assert _rel(g(X), m(X)) <= 1e-10  # ε = 1e-12 against var(u) of order one
    # each half alone is not a gauge: the FFN must follow the norm
    assert _rel(replace(m, norm1_w=2.5 * m.norm1_w, norm1_b=2.5 * m.norm1_b)(X), m(X)) > 1e-3
    assert _rel(replace(m, norm1_b=m.norm1_b + 0.4)(X), m(X)) > 1e-3


def test_the_scale_is_identifiable_through_eps_only(tmp_path):
    """With the last norm's ε of the order of var(u) the scale shows; the shift never does."""
    m = replace(block_model(_bert_layer(tmp_path)), eps=0.05)
    X = np.random.default_rng(2).standard_normal((3, 8, m.d))
    assert _rel(rescale_post_norm(m, 2.0)(X), m(X)) > 1e-3
    assert _rel(rescale_post_norm(m, 1.0, 0.7)(X), m(X)) <= 1e-12
    with pytest.raises(ConfigError) as exc:
        rescale_post_norm(m, 0.0)
    assert exc.value.param == "scale"


def test_method_block_refuses_a_bert_layer_it_cannot_split_in_one_line_naming_the_stage(tmp_path, capsys):
    """A BERT folder whose two heads of width 8 the post-norm chain's attention stage does not split (weights
    N(0, 0.25)): refused in one line naming the post-norm block and the stage, nothing written."""
    folder = tiny_bert_dir(tmp_path / "bert", hidden=16, heads=2)
    code = main(["extract", "--hf-dir", str(folder), "--block", "1", "--method", "block", "--heads", "2",
                 "--out", str(tmp_path / "m.npz")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "post-norm" in err and "stage attention" in err
    assert not (tmp_path / "m.npz").exists()
