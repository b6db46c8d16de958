"""Seeded random RoPE attention layers (numpy only): LLaMA's shape without torch."""

from __future__ import annotations

import math

import numpy as np

from attnprobe.models.positional import PositionalAttention, rope_frequencies


def random_rope_attention(d: int, heads: int, kv_heads: int | None = None, *, head_dim: int | None = None,
                          base: float = 1e4, seed: int = 0, dtype: str = "float64") -> PositionalAttention:
    """A RoPE layer with GQA (``kv_heads`` groups, default ``heads // 4`` or 1) and weights N(0, 1/d), as
    LLaMA's random init draws them; answers the whole output row (K = d)."""
    rng = np.random.default_rng(seed)
    dh = head_dim or d // heads
    G = kv_heads or max(1, heads // 4)
    s = 1.0 / math.sqrt(d)
    return PositionalAttention(rng.standard_normal((heads, dh, d)) * s, rng.standard_normal((G, dh, d)) * s,
                               rng.standard_normal((G, dh, d)) * s, rng.standard_normal((d, heads * dh)) * s,
                               position="rope", inv_freq=rope_frequencies(dh, base), dtype=dtype)
