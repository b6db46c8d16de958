"""Shared helpers of the vector-answer research scripts: the whole output row of a real MiniLM-L6 layer."""

from __future__ import annotations

import numpy as np

from attnprobe.models.multihead import MultiHeadAttention


def minilm_whole_layer(layer: int, dtype: str = "float64") -> MultiHeadAttention:
    """All 12 heads of MiniLM-L6 layer ``layer``, the whole 384-dim output row at the last position (before the
    residual and LayerNorm), in the vector layout."""
    from attnprobe.targets.minilm import minilm_checkpoint

    ck = minilm_checkpoint()
    H, dh = ck.heads_per_layer, ck.head_dim
    g = lambda name: ck._get(layer, name)  # noqa: E731
    split = lambda a: a.reshape((H, dh) + a.shape[1:])  # noqa: E731
    return MultiHeadAttention.from_projections(
        split(g("self.query.weight")), split(g("self.key.weight")), split(g("self.value.weight")),
        g("output.dense.weight"), g("output.dense.bias"), b_Q=split(g("self.query.bias")),
        b_V=split(g("self.value.bias")), scale=1.0 / np.sqrt(dh), dtype=dtype)
