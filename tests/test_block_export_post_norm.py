"""``export`` of a post-norm block (BERT's layer: attention, residual, LayerNorm, GELU FFN, residual, LayerNorm) into
a BERT-family folder (targets/hf_export.py, ``block_weights`` and ``plain_parts``)."""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.cli import main  # noqa: E402
from attnprobe.models import save_model  # noqa: E402
from attnprobe.models.block import flip_post_norm_sign  # noqa: E402
from attnprobe.oracles.hf_block import block_model, hf_block, oracle_from_hf_block  # noqa: E402
from test_post_norm_stages import moved_norms_bert_dir  # noqa: E402


def _another_form(block, seed=1):
    """The same function in the forms a learner returns: each head's query and key maps through an invertible
    ``A_h`` (``W_Q → A W_Q``, ``W_K → A⁻ᵀ W_K``; the query bias with it; the logit scale 1), the first norm's bias
    folded into the FFN (``b1 + W1 b``, ``b2 + b``) and the sign gauge of both norms."""
    a, f = block.attention, block.ffn
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((a.H, a.head_dim, a.head_dim)) + 3 * np.eye(a.head_dim)
    Wq = np.einsum("hij,hjd->hid", A, a.Wq)
    Wk = np.einsum("hji,hjd->hid", np.linalg.inv(A), a.Wk)
    bq = np.einsum("hij,hj->hi", A, a.bq)
    # a key bias only shifts each query's logits alike (it cancels); the logit scale in W_Q
    attention = dataclasses.replace(a, Wq=Wq * a.scale, Wk=Wk, bq=bq * a.scale, bk=np.zeros_like(a.bk), scale=1.0)
    b = block.norm1_b
    ffn = dataclasses.replace(f, b1=f.b1 + f.W1 @ b, b2=f.b2 + b)
    return flip_post_norm_sign(dataclasses.replace(block, attention=attention, ffn=ffn, norm1_b=np.zeros_like(b)))


def test_a_post_norm_block_exports_into_a_bert_folder_that_answers_like_it(tmp_path, capsys):
    folder = moved_norms_bert_dir(tmp_path / "bert", 16, 2)
    truth = block_model(hf_block(folder, 1))
    result = _another_form(truth)
    X = np.random.default_rng(5).standard_normal((3, 9, 16))
    y = oracle_from_hf_block(folder, 1).answer_rows(X)
    assert np.abs(result.every_position(X) - y).max() < 1e-10 * np.abs(y - X).max()  # the same function
    assert np.abs(result.norm1_w - truth.norm1_w).max() > 0.1  # but other weights
    assert min(np.abs(truth.norm1_b).max(), np.abs(truth.norm2_b).max(), np.abs(truth.norm2_w - 1).max()) > 0.1
    path = save_model(result, tmp_path / "block.npz")
    for layers, at in (([], 1), (["--layers", "1"], 0)):
        out = tmp_path / f"out{at}"
        assert main(["export", "--result", str(path), "--hf-dir", str(folder), "--layer", "1", "--out", str(out),
                     *layers]) == 0
        said = capsys.readouterr().out
        assert "holds the recovered block" in said and "post-norm" in said and "RoPE" not in said
        got = oracle_from_hf_block(out, at).answer_rows(X)
        assert np.abs(got - y).max() < 1e-10 * np.abs(y - X).max()


def test_a_post_norm_block_that_does_not_fit_the_folder_is_refused_in_one_line(tmp_path, capsys):
    folder = moved_norms_bert_dir(tmp_path / "bert", 16, 2)
    truth = block_model(hf_block(folder, 1))
    cases = {"eps": (dataclasses.replace(truth, eps=1e-5), "layer_norm_eps"),
             "activation": (dataclasses.replace(truth, ffn=dataclasses.replace(truth.ffn, activation="silu")),
                            "gelu FFN"),
             "pre": (dataclasses.replace(truth, layout="pre"), "post-norm LayerNorm blocks into BERT")}
    for name, (block, said) in cases.items():
        path = save_model(block, tmp_path / f"{name}.npz")
        assert main(["export", "--result", str(path), "--hf-dir", str(folder), "--layer", "1",
                     "--out", str(tmp_path / f"no-{name}")]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / f"no-{name}").exists()
