"""Seeded random smooth FFNs (the shape of a transformer's MLP)."""

from __future__ import annotations

import numpy as np

from attnprobe.models.smooth_ffn import SmoothFFN


def random_smooth_ffn(d: int, m: int, outputs: int | None = None, *, activation: str = "gelu", bias: bool = True,
                      seed: int = 0, dtype: str = "float64") -> SmoothFFN:
    """``W2 σ(W1 x + b1) + b2`` with weights at ``1/√fan-in`` (``W1`` N(0, 1/d), ``W2`` N(0, 1/m)), so the
    pre-activations of N(0, I) inputs are of order one; biases N(0, 0.1²) when ``bias``; K = ``outputs`` (default
    d, the residual stream's width)."""
    rng = np.random.default_rng(seed)
    K = d if outputs is None else int(outputs)
    W1 = rng.standard_normal((m, d)) / np.sqrt(d)
    W2 = rng.standard_normal((K, m)) / np.sqrt(m)
    b1 = 0.1 * rng.standard_normal(m) if bias else np.zeros(m)
    b2 = 0.1 * rng.standard_normal(K) if bias else np.zeros(K)
    return SmoothFFN(W1, b1, W2, b2, activation, dtype)


def random_gated_ffn(d: int, m: int, outputs: int | None = None, *, activation: str = "silu", bias: bool = True,
                     seed: int = 0, dtype: str = "float64"):
    """A gated FFN ``W2 [σ(Wg x + bg) ⊙ (Wu x + bu)] + b2`` (SwiGLU for σ = ``silu``, GeGLU for ``gelu``) with
    weights at ``1/√fan-in`` (gate and up N(0, 1/d), ``W2`` N(0, 1/m)) and biases N(0, 0.1²) when ``bias``."""
    from attnprobe.models.gated_ffn import GatedFFN

    rng = np.random.default_rng(seed)
    K = d if outputs is None else int(outputs)
    Wg = rng.standard_normal((m, d)) / np.sqrt(d)
    Wu = rng.standard_normal((m, d)) / np.sqrt(d)
    W2 = rng.standard_normal((K, m)) / np.sqrt(m)
    bg, bu = (0.1 * rng.standard_normal((2, m))) if bias else np.zeros((2, m))
    b2 = 0.1 * rng.standard_normal(K) if bias else np.zeros(K)
    return GatedFFN(Wg, bg, Wu, bu, W2, b2, activation, dtype)
