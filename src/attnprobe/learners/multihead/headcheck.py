"""A per-head check of a recovered multi-head layer: each head measured alone, every other head switched off.

For a last token ``y`` and probe ``z``, ``f([y + z; y]) = c + yᵀΣ_g v_g + Σ_g σ(zᵀp_g)·zᵀv_g`` with
``p_g = W_g y + u_g`` (App. C's two-row form). With the recovered heads, choose ``z`` with ``zᵀp̂_g = −L``
for every ``g ≠ h`` (those heads are off: ``σ(−40) = 4e-18``) and ``zᵀp̂_h = ℓ``:

- at ``ℓ = 0`` the answer inverts (eq. 1) to head h's true logit ``zᵀp_h``: the miss ``zᵀ(p_h − p̂_h)``;
- at ``ℓ = L`` head h is fully on and the answer is ``zᵀv_h``: the miss ``zᵀ(v_h − v̂_h)``.

``z`` is a random vector corrected inside ``span{v̂}^⊥``, so each miss is a random projection of the head's
error: ``E[(zᵀe)²] ≈ ‖z‖²‖e‖²/d``, and ``√d·|miss|/‖z‖`` estimates ``‖e‖`` with no access to the truth. A
wrong other head shows up too (it is not switched off). Costs ``2·n`` queries per head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnprobe.learners.head.sigmoid import RoundingError, invert_two_row

SWITCH_OFF_LOGIT = 40.0
#: the reported bound is this multiple of the estimate (a mean of n squared random projections): with n = 16 it
#: fell below the true W/v/u error for 0 of 1,520 heads (smallest ratio 1.3; benchmarks/multihead_headcheck.py)
HEAD_SAFETY = 4.0
PROBES_PER_HEAD = 16


@dataclass(frozen=True)
class HeadCheck:
    """Per head: estimated relative errors of ``p_h = W_h y + u_h`` (attention) and of ``v_h``, and their
    bound ``HEAD_SAFETY × max``; ``queries`` asked."""

    attention: np.ndarray
    value: np.ndarray
    bound: np.ndarray
    queries: int

    def as_dict(self) -> dict:
        return {"attention": self.attention.tolist(), "value": self.value.tolist(), "bound": self.bound.tolist(),
                "worst_bound": float(np.max(self.bound)) if self.bound.size else 0.0, "queries": self.queries}


def head_check_queries(H: int, n: int = PROBES_PER_HEAD) -> int:
    return 2 * n * H


def _probes(model, h, y, rng, logit):
    """``z`` (n, d) with ``zᵀp̂_g = −L`` (g ≠ h) and ``zᵀp̂_h = logit``: random, corrected in ``span{v̂}^⊥``."""
    H, d = model.v.shape
    P = np.einsum("gij,nj->ngi", model.W, y) + model.u[None]  # (n, H, d)
    N = np.linalg.svd(model.v)[2][H:].T  # span{v̂}^⊥, d × (d − H)
    size = SWITCH_OFF_LOGIT * np.sqrt(d) / np.max(np.linalg.norm(P, axis=2), axis=1)
    Z = size[:, None] * rng.standard_normal((y.shape[0], d)) / np.sqrt(d)
    target = np.full((y.shape[0], H), -SWITCH_OFF_LOGIT)
    target[:, h] = logit
    for k in range(y.shape[0]):
        A = P[k] @ N
        t, *_ = np.linalg.lstsq(A, target[k] - P[k] @ Z[k], rcond=None)
        Z[k] += N @ t
    return Z, P[:, h]


def check_heads(oracle, model, rng, n: int = PROBES_PER_HEAD) -> HeadCheck:
    """Every head of ``model`` measured alone on ``oracle`` (module docstring); asks ``2·n·H`` queries."""
    H, d = model.v.shape
    start = oracle.queries
    v_sum = model.v.sum(0)
    att, val = np.zeros(H), np.zeros(H)
    for h in range(H):
        y = rng.standard_normal((2 * n, d))
        Z0, p_h = _probes(model, h, y[:n], rng, 0.0)
        Z1, _ = _probes(model, h, y[n:], rng, SWITCH_OFF_LOGIT)
        X = np.empty((2 * n, 2, d))
        X[:, 0] = y + np.concatenate([Z0, Z1])
        X[:, 1] = y
        ans = oracle(X)
        y0 = model.c + y @ v_sum
        lg = invert_two_row(ans[:n], y0[:n], y0[:n] + Z0 @ model.v[h], RoundingError(oracle.eps))
        miss_l = np.where(lg.saturated, np.inf, np.abs(lg.values - np.einsum("nd,nd->n", Z0, p_h)))
        miss_v = np.abs(ans[n:] - y0[n:] - Z1 @ model.v[h])
        rp = np.sqrt(np.mean(miss_l**2 * d / np.sum(Z0**2, axis=1)))
        att[h] = rp / np.sqrt(np.mean(np.sum(p_h**2, axis=1)))
        val[h] = np.sqrt(np.mean(miss_v**2 * d / np.sum(Z1**2, axis=1))) / np.linalg.norm(model.v[h])
    return HeadCheck(att, val, HEAD_SAFETY * np.maximum(att, val), oracle.queries - start)
