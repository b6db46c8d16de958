"""Torch multi-head layers as oracles (optional extra ``torch``), and their parameters as a
:class:`~attnprobe.models.multihead.MultiHeadAttention` (App. C's sum form).

Both layers are read the way the multi-head model is defined: the last token is the query, it attends over every
row (itself included), and the answer is one output row ``R`` of the layer at that position.

- :class:`TorchMultiheadRow` — ``torch.nn.MultiheadAttention(d, H, bias=True, batch_first=True)``;
- :class:`BertSelfAttentionRow` — BERT's self-attention (separate query/key/value ``Linear`` layers) followed by the
  attention output dense layer, e.g. a real MiniLM-L6 layer (:func:`attnprobe.targets.minilm.minilm_torch_layer`).
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.multihead import MultiHeadAttention
from attnprobe.oracles.torch_adapter import nn, torch


class TorchMultiheadRow(nn.Module):
    """``X (B, N, d) ↦ MHA(x_N, X, X)[R]``: output row ``row`` of ``nn.MultiheadAttention`` at the last position."""

    def __init__(self, d: int, heads: int, row: int = 0, dtype=torch.float64, attn: nn.MultiheadAttention | None = None):
        super().__init__()
        self.attn = attn if attn is not None else nn.MultiheadAttention(d, heads, bias=True, batch_first=True,
                                                                        dtype=dtype)
        self.d, self.row = int(d), int(row)
        if not 0 <= self.row < self.d:
            raise ConfigError(f"output row must be in 0..{self.d - 1}; got {row}")

    def forward(self, X):
        out, _ = self.attn(X[:, -1:, :], X, X, need_weights=False)
        return out[:, 0, self.row]


class BertSelfAttentionRow(nn.Module):
    """BERT self-attention + attention output dense (no residual, no LayerNorm) at the last position, row ``row``:
    ``concat_h softmax((Q_h x_N + b_Q)ᵀ(K_h X + b_K)/√d_h) (V_h X + b_V) · W_O[row] + b_O[row]``."""

    def __init__(self, d: int, heads: int, row: int = 0, dtype=torch.float64):
        super().__init__()
        if d % heads:
            raise ConfigError(f"the width d={d} must be a multiple of the number of heads {heads}")
        self.d, self.heads, self.row = int(d), int(heads), int(row)
        self.query, self.key, self.value, self.dense = (nn.Linear(d, d, dtype=dtype) for _ in range(4))

    def forward(self, X):
        B, N, d = X.shape
        dh = d // self.heads
        split = lambda t: t.reshape(B, -1, self.heads, dh).transpose(1, 2)  # noqa: E731  (B, H, n, dh)
        q, k, v = split(self.query(X[:, -1:, :])), split(self.key(X)), split(self.value(X))
        alpha = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)  # (B, H, 1, N)
        ctx = (alpha @ v).transpose(1, 2).reshape(B, d)
        return ctx @ self.dense.weight[self.row] + self.dense.bias[self.row]


def _np(t) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


def multihead_from_torch(module, row: int | None = None) -> MultiHeadAttention:
    """The sum-form parameters (App. C) of :class:`TorchMultiheadRow`, :class:`BertSelfAttentionRow` or a bare
    ``nn.MultiheadAttention`` (then ``row`` is required), computed in float64 from the module's weights."""
    if isinstance(module, TorchMultiheadRow):
        row = module.row if row is None else row
        module = module.attn
    if isinstance(module, nn.MultiheadAttention):
        if row is None:
            raise ConfigError("give the output row of the nn.MultiheadAttention to read")
        if module.in_proj_weight is None or module.in_proj_bias is None:
            raise ConfigError("need nn.MultiheadAttention(..., bias=True) with a packed in_proj_weight "
                              "(same query, key and value widths)")
        d, H = module.embed_dim, module.num_heads
        P, b = _np(module.in_proj_weight), _np(module.in_proj_bias)
        Wq, Wk, Wv = P[:d], P[d:2 * d], P[2 * d:]
        bq, bk, bv = b[:d], b[d:2 * d], b[2 * d:]
        Wo, bo = _np(module.out_proj.weight), _np(module.out_proj.bias)
    elif isinstance(module, BertSelfAttentionRow):
        row = module.row if row is None else row
        d, H = module.d, module.heads
        Wq, Wk, Wv = (_np(m.weight) for m in (module.query, module.key, module.value))
        bq, bk, bv = (_np(m.bias) for m in (module.query, module.key, module.value))
        Wo, bo = _np(module.dense.weight), _np(module.dense.bias)
    else:
        raise ConfigError(f"cannot read multi-head parameters from a {type(module).__name__}; expected "
                          "nn.MultiheadAttention, TorchMultiheadRow or BertSelfAttentionRow")
    if not 0 <= row < d:
        raise ConfigError(f"output row must be in 0..{d - 1}; got {row}")
    dh = d // H
    per_head = lambda a: a.reshape((H, dh) + a.shape[1:])  # noqa: E731
    return MultiHeadAttention.from_projections(per_head(Wq), per_head(Wk), per_head(Wv), Wo[row], float(bo[row]),
                                               b_Q=per_head(bq), b_K=per_head(bk), b_V=per_head(bv),
                                               scale=1.0 / math.sqrt(dh))

