"""An oracle on mapped inputs: restricted to a subspace (queries in coordinates ``Z (B, N, k)`` are asked as
``X = Z Eᵀ``) or shifted (``X = Z + x₀``). Either keeps the parent's count, budget, precision and noise.

Prop. C.2: when the heads live in mutually orthogonal subspaces, inputs inside ``U_h = range(E_h)`` see head h
alone, so the restricted oracle is a single-head oracle of width ``k = dim U_h`` with ``W̃ = EᵀW_hE``,
``ṽ = Eᵀv_h``, ``ũ = Eᵀu_h`` and the layer's whole ``c``.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.oracles.base import Oracle
from attnprobe.oracles.positions import declared_positions
from attnprobe.oracles.wrappers import Wrapper


class _Lift(Wrapper):
    """``Z ↦ parent(Z Eᵀ + x₀)`` (``E`` None: the identity; ``x₀`` None: zero); adds no noise of its own, so its
    ``noise`` is the parent oracle's. A parent that answers every position (declared or seen) is asked its rows
    (``answer_rows``), so the mapped oracle answers every position too."""

    def __init__(self, parent: Oracle, E: np.ndarray | None = None, x0: np.ndarray | None = None):
        super().__init__(parent)
        self.E, self.x0 = E, x0
        self.d = parent.d if E is None else E.shape[1]

    def __call__(self, Z):
        X = np.asarray(Z, dtype=np.float64)
        X = X if self.E is None else X @ self.E.T
        X = X if self.x0 is None else X + self.x0
        if self.inner.every_position or (self.inner.every_position is None and declared_positions(self.inner)):
            return np.asarray(self.inner.answer_rows(X), dtype=np.float64)
        return self._raw(X)


def _derived(oracle: Oracle, lift: _Lift, name: str, floor: float, outputs: int | None = None) -> Oracle:
    """The :class:`Oracle` asking ``lift``: the parent's remaining budget, precision and batch size."""
    budget = None if oracle.budget is None else int(oracle.remaining)
    return Oracle(lift, lift.d, budget=budget, precision=oracle.precision, max_batch=oracle.max_batch, name=name,
                  eps_floor=floor, outputs=outputs)


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
    floor = oracle.eps if eps is None else max(oracle.eps, float(eps))
    return _derived(oracle, _Lift(oracle, E=E), name or f"{oracle.name} restricted to a {E.shape[1]}-dim subspace",
                    floor)


def shift_inputs(oracle: Oracle, x0: np.ndarray, name: str | None = None) -> Oracle:
    """An :class:`Oracle` answering ``oracle(X + x₀)`` for a finite ``x₀ (d,)`` (a change of origin, e.g. a neutral
    key: :mod:`attnprobe.learners.positional.neutral`). Every query is also counted (and budgeted) by ``oracle``;
    the answers' precision, noise and outputs are the parent's."""
    x0 = np.asarray(x0, dtype=np.float64)
    if x0.shape != (oracle.d,) or not np.all(np.isfinite(x0)):
        raise ConfigError(f"the shift must be a finite vector of length d = {oracle.d}; got shape {x0.shape}",
                          param="x0")
    return _derived(oracle, _Lift(oracle, x0=x0), name or f"{oracle.name} shifted by x0", oracle.eps,
                    outputs=oracle.outputs)
