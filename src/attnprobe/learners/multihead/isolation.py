"""One head of a multi-head oracle seen as a single-head oracle, once every value vector is known.

Let ``P_h`` project onto ``S_h = {v_g : g ≠ h}^⊥``. A query whose rows are ``x_i' = x_N + P_h(x_i − x_N)``
gives every other head the value ``x_i'ᵀv_g = x_Nᵀv_g`` at every position, whatever its attention weights,
while head h sees logits ``(x_i − x_N)ᵀP_h p_h`` (+ a constant) and values ``x_Nᵀv_h + (x_i − x_N)ᵀP_h v_h``.
So ``f(X') − x_Nᵀ(Σ_g v_g − P_h v_h)`` is *exactly* the single head ``(P_h W_h, P_h v_h, P_h u_h, c)`` at X,
for sequences of any length, and every single-head learner (exact, low-rank, ...) applies unchanged.
"""

from __future__ import annotations

import numpy as np

from attnprobe.oracles.base import Oracle


def other_heads_basis(v: np.ndarray, h: int) -> np.ndarray:
    """Orthonormal basis (d × (H−1)) of ``span{v_g : g ≠ h}``."""
    others = np.delete(v, h, axis=0)
    if others.shape[0] == 0:
        return np.zeros((v.shape[1], 0))
    Q, _ = np.linalg.qr(others.T)
    return Q


class IsolatedHead:
    """The callable ``X ↦ f(X') − x_Nᵀ(Σ_g v_g − P_h v_h)`` (module docstring); counts nothing itself."""

    def __init__(self, oracle, v: np.ndarray, h: int, v_sum: np.ndarray):
        self.oracle = oracle
        C = other_heads_basis(v, h)
        self.P = np.eye(v.shape[1]) - C @ C.T
        self.shift = v_sum - self.P @ v[h]
        self.__name__ = f"head {h} isolated"
        self.noise = oracle.noise  # one answer minus known numbers: the same noise

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        last = X[:, -1:, :]
        B, N, d = X.shape
        Xp = np.empty_like(X)  # the last row's difference is zero: only the others are projected (one product)
        Xp[:, :-1] = last + ((X[:, :-1] - last).reshape(-1, d) @ self.P).reshape(B, N - 1, d)
        Xp[:, -1] = last[:, 0] + 0.0
        return self.oracle(Xp) - last[:, 0, :] @ self.shift


def isolated_oracle(oracle, v: np.ndarray, h: int, v_sum: np.ndarray) -> Oracle:
    """An :class:`Oracle` for head h alone (its queries also count on ``oracle``, within its budget)."""
    budget = None if oracle.budget is None else int(oracle.remaining)
    return Oracle(IsolatedHead(oracle, v, h, v_sum), oracle.d, budget=budget, precision=oracle.precision,
                  name=f"{oracle.name}[head {h} isolated]")
