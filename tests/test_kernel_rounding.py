"""A float64 module whose kernel computes the softmax in float32 (LLaMA-family eager attention, BLOOM) answers
with full float64 bits but float32 accuracy: ``precision="auto"`` reads that from the answers' smoothness along a
short line, and the multi-head learner recovers the layer with nothing declared."""

import math

import pytest

torch = pytest.importorskip("torch")

from attnprobe.learners import registry  # noqa: E402
from attnprobe.models.multihead import MultiHeadAttention, match_heads  # noqa: E402
from attnprobe.oracles import Oracle  # noqa: E402
from attnprobe.oracles.precision_detect import (SMOOTH_LINES, SMOOTH_POINTS, kernel_jitter,  # noqa: E402
                                                smoothness_batch)
from attnprobe.oracles.torch_adapter import TorchFunction  # noqa: E402
from attnprobe.oracles.torch_multihead import BertSelfAttentionRow  # noqa: E402
from attnprobe.targets.hf import torch_layer_arrays  # noqa: E402


class SoftmaxInFloat32(BertSelfAttentionRow):
    """BERT self-attention + output dense in float64 whose softmax runs in float32 (the eager kernel of LLaMA)."""

    def forward(self, X):
        B, N, d = X.shape
        dh = d // self.heads
        split = lambda t: t.reshape(B, -1, self.heads, dh).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(X[:, -1:, :])), split(self.key(X)), split(self.value(X))
        alpha = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1, dtype=torch.float32).to(X.dtype)
        return self.dense((alpha @ v).transpose(1, 2).reshape(B, d))


def _module(cls, seed=0):
    torch.manual_seed(seed)
    m = cls(24, 3, row=None)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.4)
    return m


def test_jitter_separates_a_float64_kernel_from_a_float32_softmax():
    X = smoothness_batch(24)
    plain = kernel_jitter(TorchFunction(_module(BertSelfAttentionRow), 24)(X))
    rounded = kernel_jitter(TorchFunction(_module(SoftmaxInFloat32), 24)(X))
    assert plain < 1e-13 and 1e-10 < rounded < 1e-5


def test_auto_reads_float32_inside_and_the_layer_is_recovered():
    module = _module(SoftmaxInFloat32)
    oracle = Oracle(TorchFunction(module, 24), 24, precision="auto")
    res = registry.learner("multihead")(oracle, seed=0)
    assert oracle.precision == "float32"  # the bits alone say float64
    assert "float32" in oracle.detector.describe()["rounded_inside"]
    assert res.queries_by_phase["precision"] >= SMOOTH_LINES * SMOOTH_POINTS
    assert sum(res.queries_by_phase.values()) == res.queries
    a = torch_layer_arrays(module)
    assert res.passed
    assert match_heads(MultiHeadAttention(a["W"], a["v"], a["u"], a["c"]), res.model).worst < 2e-3


def test_a_float64_kernel_stays_float64():
    oracle = Oracle(TorchFunction(_module(BertSelfAttentionRow), 24), 24, precision="auto", outputs=24)
    assert oracle.read_kernel_rounding() >= SMOOTH_LINES * SMOOTH_POINTS
    assert oracle.precision == "float64" and oracle.eps < 1e-15
    assert oracle.detector.describe()["kernel_jitter"] < 1e-13
    assert oracle.read_kernel_rounding() == 0  # asked once


def test_a_declared_precision_asks_nothing():
    oracle = Oracle(TorchFunction(_module(SoftmaxInFloat32), 24), 24, precision="float64", outputs=24)
    assert oracle.read_kernel_rounding() == 0 and oracle.queries == 0
