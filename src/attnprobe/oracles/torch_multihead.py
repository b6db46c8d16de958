"""Torch multi-head layers as oracles (optional extra ``torch``), and their parameters as a
:class:`~attnprobe.models.multihead.MultiHeadAttention` (App. C's sum form).

Both layers are read the way the multi-head model is defined: the last token is the query, it attends over every
row (itself included), and the answer is one output row ``R`` of the layer at that position, or with ``row=None``
the whole output row ``(B, K)`` (the vector layout: :func:`attnprobe.targets.hf.torch_layer_arrays`).

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


def _check_row(row: int | None, d: int) -> int | None:
    if row is None:
        return None
    if not 0 <= int(row) < d:
        raise ConfigError(f"output row must be in 0..{d - 1} (or None for the whole row); got {row}", param="row")
    return int(row)


class TorchMultiheadRow(nn.Module):
    """``X (B, N, d) ↦ MHA(x_N, X, X)[R]``: output row ``row`` of ``nn.MultiheadAttention`` at the last position;
    ``row=None``: the whole ``out_proj`` output ``(B, d)``."""

    def __init__(self, d: int, heads: int, row: int | None = 0, dtype=torch.float64,
                 attn: nn.MultiheadAttention | None = None):
        super().__init__()
        self.attn = attn if attn is not None else nn.MultiheadAttention(d, heads, bias=True, batch_first=True,
                                                                        dtype=dtype)
        self.d = int(d)
        self.row = _check_row(row, self.d)

    def forward(self, X):
        out, _ = self.attn(X[:, -1:, :], X, X, need_weights=False)
        return out[:, 0] if self.row is None else out[:, 0, self.row]


class BertSelfAttentionRow(nn.Module):
    """BERT self-attention + attention output dense (no residual, no LayerNorm) at the last position, row ``row``:
    ``concat_h softmax((Q_h x_N + b_Q)ᵀ(K_h X + b_K)/√d_h) (V_h X + b_V) · W_O[row] + b_O[row]``; ``row=None``:
    the whole output row ``(B, d)``."""

    def __init__(self, d: int, heads: int, row: int | None = 0, dtype=torch.float64):
        super().__init__()
        if d % heads:
            raise ConfigError(f"the width d={d} must be a multiple of the number of heads {heads}", param="heads")
        self.d, self.heads = int(d), int(heads)
        self.row = _check_row(row, self.d)
        self.query, self.key, self.value, self.dense = (nn.Linear(d, d, dtype=dtype) for _ in range(4))

    def forward(self, X):
        B, N, d = X.shape
        dh = d // self.heads
        split = lambda t: t.reshape(B, -1, self.heads, dh).transpose(1, 2)  # noqa: E731  (B, H, n, dh)
        q, k, v = split(self.query(X[:, -1:, :])), split(self.key(X)), split(self.value(X))
        alpha = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)  # (B, H, 1, N)
        ctx = (alpha @ v).transpose(1, 2).reshape(B, d)
        if self.row is None:
            return self.dense(ctx)
        return ctx @ self.dense.weight[self.row] + self.dense.bias[self.row]


def _np(t) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


def torch_projections(module) -> dict:
    """Float64 per-head projections ``Q, K, V (H, d_h, d)``, ``bQ, bK, bV (H, d_h)`` and the output layer
    ``WO (K, H·d_h)``, ``bO (K,)`` of ``nn.MultiheadAttention`` (with ``bias=True``), :class:`TorchMultiheadRow`,
    :class:`BertSelfAttentionRow` or :class:`~attnprobe.oracles.hf_attention.HFAttentionLayer`."""
    if isinstance(module, TorchMultiheadRow):
        module = module.attn
    if isinstance(module, nn.MultiheadAttention):
        if module.in_proj_weight is None or module.in_proj_bias is None:
            raise ConfigError("need nn.MultiheadAttention(..., bias=True) with a packed in_proj_weight "
                              "(same query, key and value widths)", param="module")
        d, H = module.embed_dim, module.num_heads
        P, b = _np(module.in_proj_weight), _np(module.in_proj_bias)
        lin = [(P[i * d:(i + 1) * d], b[i * d:(i + 1) * d]) for i in range(3)]
        out = module.out_proj
    elif callable(getattr(module, "projections", None)):  # HFAttentionLayer: its family reads its weights
        return module.projections()
    elif isinstance(module, BertSelfAttentionRow):
        H, parts, out = module.heads, (module.query, module.key, module.value), module.dense
        lin = [(_np(m.weight), _np(m.bias)) for m in parts]
    else:
        raise ConfigError(f"cannot read multi-head parameters from a {type(module).__name__}; expected "
                          "nn.MultiheadAttention, TorchMultiheadRow, BertSelfAttentionRow or HFAttentionLayer",
                          param="module")
    dh = lin[0][0].shape[0] // H
    per_head = lambda a: a.reshape((H, dh) + a.shape[1:])  # noqa: E731
    proj = {}
    for name, (w, b) in zip("QKV", lin):
        proj[name], proj["b" + name] = per_head(w), per_head(b)
    proj["WO"], proj["bO"] = _np(out.weight), _np(out.bias)
    return proj


def multihead_from_torch(module, row: int | None = None) -> MultiHeadAttention:
    """The sum-form parameters (App. C) of one output row of :class:`TorchMultiheadRow`,
    :class:`BertSelfAttentionRow` or a bare ``nn.MultiheadAttention`` (then ``row`` is required), computed in
    float64 from the module's weights."""
    if isinstance(module, (TorchMultiheadRow, BertSelfAttentionRow)):
        row = module.row if row is None else row
    if row is None:
        raise ConfigError("give the output row to read; a module that answers its whole output row has the "
                          "vector layout (attnprobe.targets.hf.torch_layer_arrays)", param="row")
    p = torch_projections(module)
    K, dh = p["WO"].shape[0], p["Q"].shape[1]
    if not 0 <= row < K:
        raise ConfigError(f"output row must be in 0..{K - 1}; got {row}", param="row")
    return MultiHeadAttention.from_projections(p["Q"], p["K"], p["V"], p["WO"][row], float(p["bO"][row]),
                                               b_Q=p["bQ"], b_K=p["bK"], b_V=p["bV"], scale=1.0 / math.sqrt(dh))
