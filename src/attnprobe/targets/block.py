"""Seeded random pre-norm blocks (numpy only): a LLaMA decoder layer's shape without torch (docs/block.md)."""

from __future__ import annotations

import math

import numpy as np

from attnprobe.models.block import TransformerBlock
from attnprobe.models.gated_ffn import GatedFFN
from attnprobe.targets.positional import random_rope_attention


def random_llama_block(d: int = 128, heads: int = 8, kv_heads: int = 2, hidden: int = 256, *, seed: int = 0,
                       eps: float = 1e-6, norm_spread: float = 0.3, dtype: str = "float64") -> TransformerBlock:
    """RMSNorm → RoPE GQA attention → residual → RMSNorm → SwiGLU → residual, weights N(0, 1/fan-in) and norm
    weights ``1 + norm_spread·N(0, 1)`` (not 1, so folding them matters)."""
    rng = np.random.default_rng(seed + 1)
    attention = random_rope_attention(d, heads, kv_heads, seed=seed, dtype=dtype)
    w1, w2 = (1 + norm_spread * rng.standard_normal(d) for _ in range(2))
    s, t = 1 / math.sqrt(d), 1 / math.sqrt(hidden)
    W_up = rng.standard_normal((hidden, d)) * s
    W_down = rng.standard_normal((d, hidden)) * t
    W_gate = rng.standard_normal((hidden, d)) * s
    ffn = GatedFFN(W_gate, np.zeros(hidden), W_up, np.zeros(hidden), W_down, np.zeros(d), "silu")
    return TransformerBlock(attention, ffn, w1, w2, norm="rms", eps=eps, layout="pre", dtype=dtype)
