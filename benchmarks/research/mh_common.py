"""Shared pieces of the multi-head research scripts: a plain numpy forward and MiniLM layer weights.

(Research only: the library's model is attnprobe.models.multihead.MultiHeadAttention.)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


class MH:
    """f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ (X v_h) + c, batched (B, N, d) -> (B,), matmul based."""

    def __init__(self, W, v, u, c, dtype=np.float64):
        self.W, self.v, self.u, self.c = (np.asarray(a, dtype=np.float64) for a in (W, v, u, c))
        self.H, self.d = self.v.shape
        self.dt = dtype
        self.Wf = self.W.reshape(self.H * self.d, self.d).astype(dtype)  # rows: (h, i) -> W_h[i, :]

    def __call__(self, X):
        X = np.asarray(X, dtype=self.dt)
        B, N, d = X.shape
        q = (X[:, -1, :] @ self.Wf.T).reshape(B, self.H, d) + self.u.astype(self.dt)  # W_h x_N + u_h
        s = np.einsum("bnd,bhd->bhn", X, q)
        s = s - s.max(-1, keepdims=True)
        a = np.exp(s)
        a /= a.sum(-1, keepdims=True)
        vals = X @ self.v.astype(self.dt).T  # (B, N, H)
        return (np.einsum("bhn,bnh->b", a, vals) + self.c).astype(np.float64)


def random_mh(d, H, seed, rank=None, bias=True, scale=1.0):
    rng = np.random.default_rng(seed)
    r = rank or d
    W = np.stack([rng.standard_normal((d, r)) @ rng.standard_normal((r, d)) / np.sqrt(d * r) for _ in range(H)]) * scale
    v = rng.standard_normal((H, d)) / np.sqrt(d)
    u = rng.standard_normal((H, d)) / np.sqrt(d) if bias else np.zeros((H, d))
    c = float(rng.standard_normal()) if bias else 0.0
    return MH(W, v, u, c)


def minilm_mh(layer=0, output_row=0, dtype=np.float64):
    from attnprobe.targets.minilm import HEADS, minilm_head
    hs = [minilm_head(layer, h, output_row) for h in range(HEADS)]
    return MH(np.stack([h.W for h in hs]), np.stack([h.v for h in hs]), np.stack([h.u for h in hs]),
              sum(h.c for h in hs), dtype)


def fast_minilm_layer(layer=0, output_row=0):
    """The MiniLM layer evaluated through its rank-32 factors (benchmarks/multihead_generic.py: FactorForm)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from multihead_generic import FactorForm
    from attnprobe.targets.minilm import minilm_layer
    return FactorForm(minilm_layer(layer, output_row), 32)
