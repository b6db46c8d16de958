"""One-layer single-head transformer ``TF(X) = w_oᵀ ReLU(α(X)ᵀ X A)`` (paper Sec. 4.1, eq. for TF)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.attention import as_batch, attention_weights, real_array, set_frozen
from attnprobe.models.ffn import ReLUNet, _check_ffn
from attnprobe.models.precision import resolve_dtype


@dataclass(frozen=True)
class OneLayerTransformer:
    """``TF(X) = w_oᵀ ReLU(α(X)ᵀ X A)``, ``α(X) = softmax(X W x_N)`` with ``x_N`` the last row (Sec. 4.1).

    ``W`` is d×d (``KᵀQ`` with the 1/√r scale folded in), ``A = Vᵀ W₁ᵀ`` is d×m, ``w_o`` has length m; no biases,
    as in the paper. ``v = A w_o`` is the value vector seen by the antisymmetric oracle ``TF(X) − TF(−X)``.
    """

    W: np.ndarray
    A: np.ndarray
    w_o: np.ndarray
    dtype: str = "float64"
    kind: ClassVar[str] = "one_layer_transformer"

    def __post_init__(self) -> None:
        A, w_o = _check_ffn(self.A, self.w_o)
        W = real_array("W", self.W, 2)
        d = A.shape[0]
        if W.shape != (d, d):
            raise ConfigError(f"W must be {d}x{d} to match A with {d} rows; got {W.shape}")
        resolve_dtype(self.dtype)
        set_frozen(self, W=W, A=A, w_o=w_o)

    @property
    def d(self) -> int:
        return self.A.shape[0]

    @property
    def m(self) -> int:
        return self.A.shape[1]

    @property
    def v(self) -> np.ndarray:
        """``v = A w_o``: the value vector of the antisymmetric single-head oracle."""
        return self.A @ self.w_o

    @property
    def ffn(self) -> ReLUNet:
        return ReLUNet(self.A, self.w_o, self.dtype)

    @staticmethod
    def unknowns(d: int, m: int) -> int:
        """``d²`` for W plus ``d·m`` for the FFN up to positive rescaling of its neurons."""
        return d * d + d * m

    def with_dtype(self, dtype: str) -> "OneLayerTransformer":
        return OneLayerTransformer(self.W, self.A, self.w_o, dtype)

    def attention(self, X: np.ndarray) -> np.ndarray:
        dt = resolve_dtype(self.dtype)
        return attention_weights(as_batch(X, self.d).astype(dt), self.W.astype(dt))

    def __call__(self, X: np.ndarray) -> np.ndarray:
        dt = resolve_dtype(self.dtype)
        Xc = as_batch(X, self.d).astype(dt)
        alpha = attention_weights(Xc, self.W.astype(dt))
        z = np.einsum("bn,bnd->bd", alpha, Xc) @ self.A.astype(dt)  # α(X)ᵀ X A, shape (B, m)
        return (np.maximum(z, 0) @ self.w_o.astype(dt)).astype(np.float64)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"W": self.W, "A": self.A, "w_o": self.w_o, "v": self.v}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64") -> "OneLayerTransformer":
        missing = {"W", "A", "w_o"} - set(arrays)
        if missing:
            raise ConfigError(f"a one-layer transformer needs arrays {sorted(missing)}")
        return cls(arrays["W"], arrays["A"], arrays["w_o"], dtype)
