"""An oracle restricted to a subspace: queries in coordinates ``Z (B, N, k)`` are asked as ``X = Z Eᵀ``.

Prop. C.2: when the heads live in mutually orthogonal subspaces, inputs inside ``U_h = range(E_h)`` see head h
alone, so the restricted oracle is a single-head oracle of width ``k = dim U_h`` with ``W̃ = EᵀW_hE``,
``ṽ = Eᵀv_h``, ``ũ = Eᵀu_h`` and the layer's whole ``c``.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.oracles.base import Oracle
from attnprobe.oracles.wrappers import Wrapper


class _Lift(Wrapper):
    """``Z ↦ parent(Z Eᵀ)``; adds no noise of its own, so its ``noise`` is the parent oracle's."""

    def __init__(self, parent: Oracle, E: np.ndarray):
        super().__init__(parent)
        self.E = E
        self.d = E.shape[1]

    def __call__(self, Z):
        return self._raw(np.asarray(Z, dtype=np.float64) @ self.E.T)


def restrict_to_subspace(oracle: Oracle, E: np.ndarray, name: str | None = None, eps: float | None = None
                         ) -> Oracle:
    """An :class:`Oracle` of width ``k`` answering ``oracle(Z Eᵀ)`` for ``E (d, k)`` with orthonormal columns.

    Every query is also counted (and budgeted) by ``oracle``; the answers' precision and noise are the parent's.
    ``eps`` raises the relative noise floor learners assume (e.g. the leakage of other heads through an
    estimated subspace).
    """
    E = np.asarray(E, dtype=np.float64)
    if E.ndim != 2 or E.shape[0] != oracle.d or not 1 <= E.shape[1] <= oracle.d:
        raise ConfigError(f"a subspace basis must have shape (d, k) with d = {oracle.d} and 1 <= k <= d; "
                          f"got {E.shape}", param="E")
    if not np.allclose(E.T @ E, np.eye(E.shape[1]), atol=1e-8):
        raise ConfigError("a subspace basis must have orthonormal columns (EᵀE = I); orthonormalise it first "
                          "(e.g. numpy.linalg.qr)", param="E")
    budget = None if oracle.budget is None else int(oracle.remaining)
    floor = oracle.eps if eps is None else max(oracle.eps, float(eps))
    return Oracle(_Lift(oracle, E), E.shape[1], budget=budget, precision=oracle.precision,
                  max_batch=oracle.max_batch, name=name or f"{oracle.name} restricted to a {E.shape[1]}-dim subspace",
                  eps_floor=floor)
