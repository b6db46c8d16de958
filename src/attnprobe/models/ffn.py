"""Bias-free two-layer ReLU network ``x ↦ w_oᵀ ReLU(Aᵀx)`` (the FFN of the paper's Sec. 4.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.attention import as_batch, real_array, set_frozen
from attnprobe.models.precision import resolve_dtype


def _check_ffn(A, w_o) -> tuple[np.ndarray, np.ndarray]:
    A = real_array("A", A, 2)
    w_o = real_array("w_o", w_o, 1)
    if A.shape[1] != w_o.shape[0]:
        raise ConfigError(f"A must be d×m with m = len(w_o) = {w_o.shape[0]}; got A of shape {A.shape}")
    if A.shape[0] < 1 or A.shape[1] < 1:
        raise ConfigError(f"A must have at least one row and one column; got {A.shape}")
    return A, w_o


@dataclass(frozen=True)
class ReLUNet:
    """``f(x) = w_oᵀ ReLU(Aᵀx)`` with ``A ∈ R^{d×m}`` (column k is neuron k), ``w_o ∈ R^m``, no biases.

    Positively homogeneous: ``f(λx) = λ f(x)`` for λ ≥ 0. As an oracle it reads sequences ``(B, N, d)`` of
    length N = 1 (the transformer's length-1 queries, Sec. 4.1); :meth:`forward` takes plain ``(B, d)`` inputs.
    ``dtype`` is the precision the forward pass is computed in; answers are returned as float64.
    """

    A: np.ndarray
    w_o: np.ndarray
    dtype: str = "float64"
    kind: ClassVar[str] = "relu_net"

    def __post_init__(self) -> None:
        A, w_o = _check_ffn(self.A, self.w_o)
        resolve_dtype(self.dtype)
        set_frozen(self, A=A, w_o=w_o)

    @property
    def d(self) -> int:
        return self.A.shape[0]

    @property
    def m(self) -> int:
        return self.A.shape[1]

    @staticmethod
    def unknowns(d: int, m: int) -> int:
        """``d·m`` numbers up to the positive rescaling of each neuron (``d·m + m`` raw parameters)."""
        return d * m

    def with_dtype(self, dtype: str) -> "ReLUNet":
        return ReLUNet(self.A, self.w_o, dtype)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``w_oᵀ ReLU(Aᵀx)`` for inputs of shape (B, d)."""
        dt = resolve_dtype(self.dtype)
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ConfigError(f"inputs must have shape (B, {self.d}); got {x.shape}")
        h = np.maximum(x.astype(dt) @ self.A.astype(dt), 0)
        return (h @ self.w_o.astype(dt)).astype(np.float64)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = as_batch(X, self.d)
        if X.shape[1] != 1:
            raise ConfigError(f"a ReLU network answers length-1 queries only; got sequences of length {X.shape[1]}")
        return self.forward(X[:, 0, :])

    def arrays(self) -> dict[str, np.ndarray]:
        return {"A": self.A, "w_o": self.w_o}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64") -> "ReLUNet":
        missing = {"A", "w_o"} - set(arrays)
        if missing:
            raise ConfigError(f"a ReLU network needs arrays {sorted(missing)}")
        return cls(arrays["A"], arrays["w_o"], dtype)


def canonical_neurons(A: np.ndarray, w_o: np.ndarray, tol: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """Neurons up to permutation and positive scale: unit directions ``â_k`` and output weights ``w_k‖a_k‖``,
    dropping dead neurons (``a_k = 0`` or ``w_k = 0``) and merging positively parallel ones."""
    A, w_o = _check_ffn(A, w_o)
    norms = np.linalg.norm(A, axis=0)
    eff = w_o * norms
    scale = max(float(np.max(np.abs(eff), initial=0.0)), 1e-300)
    keep = (norms > 0) & (np.abs(eff) > tol * scale)
    dirs, weights = [], []
    for k in np.flatnonzero(keep):
        a = A[:, k] / norms[k]
        for i, b in enumerate(dirs):
            if float(a @ b) > 1 - 1e-10:
                weights[i] += eff[k]
                break
        else:
            dirs.append(a)
            weights.append(eff[k])
    D = np.array(dirs).T if dirs else np.zeros((A.shape[0], 0))
    return D, np.array(weights)


def neuron_errors(A_true, w_true, A_hat, w_hat) -> dict:
    """Compare two networks neuron by neuron up to permutation and positive scale (after
    :func:`canonical_neurons`): each true neuron is matched to the recovered one of largest cosine. Returns the
    neuron counts, the largest direction error ``‖â − a‖`` and the largest relative output-weight error."""
    Dt, wt = canonical_neurons(A_true, w_true)
    Dh, wh = canonical_neurons(A_hat, w_hat)
    out = {"true_neurons": int(Dt.shape[1]), "recovered_neurons": int(Dh.shape[1])}
    if Dt.shape[1] == 0 or Dh.shape[1] == 0:
        return {**out, "direction_error": float("inf"), "weight_error": float("inf")}
    j = np.argmax(Dt.T @ Dh, axis=1)
    dir_err = np.linalg.norm(Dh[:, j] - Dt, axis=0)
    w_err = np.abs(wh[j] - wt) / np.abs(wt)
    return {**out, "direction_error": float(dir_err.max()), "weight_error": float(w_err.max()),
            "matched_one_to_one": bool(len(set(j.tolist())) == len(j))}
