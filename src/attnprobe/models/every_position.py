"""A multi-head layer's output row at every position (every-position answers, docs/every-position.md).

Row i of ``X (B, N, d)`` is the layer read with ``x_i`` as the query:
``y_i = Σ_h softmax_j(x_jᵀ W_h x_i + x_jᵀ u_h) V_h x_j + c`` over every j (bidirectional, no position terms), or over
``j ≤ i`` (causal). So a causal layer's row i is its last-position answer on ``X[:i+1]``, and a bidirectional
layer's row i its last-position answer on ``X`` with ``x_i`` moved last.
"""

from __future__ import annotations

import numpy as np

from attnprobe._validation import as_batch
from attnprobe.errors import ConfigError
from attnprobe.models.multihead import MultiHeadAttention
from attnprobe.models.precision import resolve_dtype


def every_position_rows(model: MultiHeadAttention, X: np.ndarray, causal: bool = False) -> np.ndarray:
    """The output rows ``(B, N, K)`` of the multi-head ``model`` (vector layout; K = 1 for the scalar layout)
    at every position of ``X``, in the model's dtype, returned as float64."""
    dt = resolve_dtype(model.dtype)
    Xc = as_batch(X, model.d).astype(dt)
    B, N, d = Xc.shape
    W, u, v, c = (np.asarray(a, dtype=dt) for a in (model.W, model.u, model.v, model.c))
    V = v if v.ndim == 3 else v[:, None, :]  # (H, K, d)
    q = np.einsum("bnd,hed->bhne", Xc, W)  # W_h x_i: (B, H, N, d)
    scores = np.matmul(q, Xc.transpose(0, 2, 1)[:, None]) + np.einsum("bjd,hd->bhj", Xc, u)[:, :, None, :]
    if causal:
        scores = np.where(np.tril(np.ones((N, N), dtype=bool)), scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    alpha = np.exp(scores)
    alpha /= alpha.sum(axis=-1, keepdims=True)  # (B, H, N_query, N_key)
    values = np.einsum("bjd,hkd->bhjk", Xc, V)  # V_h x_j
    out = np.matmul(alpha, values).sum(axis=1) + c.reshape(-1)
    return out.astype(np.float64)


class EveryPositionLayer:
    """``X ↦ (B, N, K)``: a :class:`MultiHeadAttention` answering at every position, bidirectional (no position
    terms) or ``causal``. It declares nothing about its rows: an Oracle reads that from the answers."""

    def __init__(self, model: MultiHeadAttention, causal: bool = False):
        if not isinstance(model, MultiHeadAttention):
            raise ConfigError(f"model must be a MultiHeadAttention; got {type(model).__name__}", param="model")
        self.model, self.causal = model, bool(causal)
        self.d = model.d
        self.dtype = model.dtype
        self.__name__ = f"{'causal' if causal else 'bidirectional'} every-position layer"

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return every_position_rows(self.model, X, self.causal)
