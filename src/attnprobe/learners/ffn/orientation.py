"""Which side of its hyperplane each neuron is active on.

The jumps give neuron k as ``c_kj n_k`` (unit normal ``n_k``, effective output weights ``c_kj``) but not which
side is active: ``c ReLU(nᵀz)`` and ``c ReLU(−nᵀz)`` differ by the linear ``c nᵀz``. The orientations
``ε_k = ±1`` are fixed by the network's linear part ``v_j = Σ_k ε_k c_kj n_k`` (the odd part ``f(x) − f(−x) = vᵀx``
of a bias-free net; the sum of the gradients at the two far ends of a line for a biased one): a linear solve
when the stacked columns are independent, a small 0/1 program (scipy's HiGHS MILP, time-limited) otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Orientation:
    """``signs`` (m,), whether ``Σ ε_k c_k n_k`` reproduces v within tolerance (``exact``), and how they were found."""

    signs: np.ndarray
    exact: bool
    how: str


def orientation_matrix(N: np.ndarray, C: np.ndarray, dx: int) -> np.ndarray:
    """Columns ``vec_j(c_kj n_k[:dx])`` (K·dx rows, m columns): ``M ε = vec(v)`` for the right orientations."""
    return np.einsum("kj,ik->jik", C, N[:dx]).reshape(C.shape[1] * dx, N.shape[1])


def solve_signs(M: np.ndarray, v: np.ndarray, tol: float, time_limit: float, loose: float = 0.0) -> Orientation:
    """Orientations s ∈ {±1}^m with ``‖M s − v‖ ≤ tol`` (M: rows × m).

    ``loose`` (coarse answers, whose jumps carry relative errors ~1e-3): when no vector meets ``tol``, the
    ±1 vector closest to v in L1 is accepted if its residual is below ``loose`` (a wrong sign of neuron k moves
    the residual by ``2‖M_k‖``)."""
    rows, m = M.shape
    if m == 0:
        return Orientation(np.zeros(0), bool(np.linalg.norm(v) <= tol), "no neurons")
    c, *_ = np.linalg.lstsq(M, v, rcond=None)
    s = np.where(c >= 0, 1.0, -1.0)
    if np.linalg.norm(M @ s - v) <= tol:
        return Orientation(s, True, "linear solve")
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:  # pragma: no cover - scipy < 1.9
        return Orientation(s, False, "no MILP solver")
    # s = 2b − 1 with b ∈ {0,1}^m:  2 M b = v + M 1, each row within tol
    rhs = v + M.sum(axis=1)
    row_tol = tol / math.sqrt(rows)
    res = milp(np.zeros(m), constraints=LinearConstraint(2 * M, rhs - row_tol, rhs + row_tol),
               integrality=np.ones(m), bounds=Bounds(0, 1), options={"time_limit": float(time_limit), "disp": False})
    if res.x is not None:
        s2 = np.where(res.x > 0.5, 1.0, -1.0)
        if np.linalg.norm(M @ s2 - v) <= tol:
            return Orientation(s2, True, "0/1 program (HiGHS)")
    how = "0/1 program found no ±1 solution" if res.status == 2 else f"0/1 program stopped ({res.message})"
    if loose > tol:
        s3 = closest_signs(M, v, time_limit)
        if s3 is not None and np.linalg.norm(M @ s3 - v) <= loose:
            return Orientation(s3, True, "closest ±1 vector (0/1 program), within the jumps' noise")
    return Orientation(s, False, how)


def closest_signs(M: np.ndarray, v: np.ndarray, time_limit: float) -> np.ndarray | None:
    """The ±1 vector minimising ``‖M s − v‖₁`` (MILP with one slack per row), or None."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    rows, m = M.shape
    rhs = v + M.sum(axis=1)
    I = np.eye(rows)
    # 2Mb − e ≤ rhs and 2Mb + e ≥ rhs, minimise Σe
    A = np.block([[2 * M, -I], [2 * M, I]])
    lo = np.concatenate([np.full(rows, -np.inf), rhs])
    hi = np.concatenate([rhs, np.full(rows, np.inf)])
    cost = np.concatenate([np.zeros(m), np.ones(rows)])
    res = milp(cost, constraints=LinearConstraint(A, lo, hi), integrality=np.r_[np.ones(m), np.zeros(rows)],
               bounds=Bounds(np.r_[np.zeros(m), np.zeros(rows)], np.r_[np.ones(m), np.full(rows, np.inf)]),
               options={"time_limit": float(time_limit), "disp": False})
    return None if res.x is None else np.where(res.x[:m] > 0.5, 1.0, -1.0)
