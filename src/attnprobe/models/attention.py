"""Single-head attention regressor (paper Sec. 3, with the biases of real layers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.precision import resolve_dtype
from attnprobe.models.softmax import softmax_last


def attention_weights(Xc: np.ndarray, W: np.ndarray, u: np.ndarray | None = None) -> np.ndarray:
    """``α(X) = softmax(X W x_N + X u)`` per sequence, shape (B, N), computed in the dtype of ``Xc``."""
    q = Xc[:, -1, :] @ W.T  # W x_N, shape (B, d)
    scores = np.einsum("bnd,bd->bn", Xc, q)
    if u is not None:
        scores = scores + Xc @ u
    return softmax_last(scores)


def set_frozen(obj, **arrays: np.ndarray) -> None:
    """Store read-only arrays on a frozen dataclass (its ``__post_init__`` normalises, then calls this)."""
    for name, arr in arrays.items():
        arr.setflags(write=False)
        object.__setattr__(obj, name, arr)


def real_array(name: str, x, ndim: int | None = None) -> np.ndarray:
    """``x`` as a float64 array, refusing what a silent conversion would corrupt: strings, objects and complex
    numbers (their imaginary part would be dropped), a number of dimensions other than ``ndim`` (no silent
    reshape) and non-finite entries."""
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if a.dtype.kind not in "biuf":
        raise ConfigError(f"{name} must hold real numbers; got {a.dtype} values")
    if ndim is not None and a.ndim != ndim:
        want = {0: "a scalar", 1: "a vector"}.get(ndim, f"a {ndim}-d array")
        raise ConfigError(f"{name} must be {want}; got shape {a.shape}")
    a = np.array(a, dtype=np.float64)
    if not np.isfinite(a).all():
        raise ConfigError(f"{name} must be finite; it holds inf or NaN")
    return a


def as_batch(X: np.ndarray, d: int) -> np.ndarray:
    """Check that ``X`` is a float batch of sequences of shape (B, N, d) and return it as float64."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 3 or X.shape[2] != d or X.shape[1] < 1:
        raise ConfigError(f"queries must have shape (B, N>=1, {d}); got {X.shape}")
    return X


@dataclass(frozen=True)
class AttentionHead:
    """``f(X) = softmax(X W x_N + X u)ᵀ (X v) + c`` for ``X ∈ R^{N×d}``, ``x_N`` the last row.

    ``u = 0, c = 0`` is the paper's model ``f_{W,v}`` (Sec. 3). ``dtype`` is the precision the whole forward
    pass is computed in, the way a deployed model answers; answers are returned as float64.
    """

    W: np.ndarray
    v: np.ndarray
    u: np.ndarray | None = None
    c: float = 0.0
    dtype: str = "float64"
    kind: ClassVar[str] = "attention_head"
    _cast: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        v = real_array("v", self.v, 1)
        d = v.shape[0]
        if d < 1:
            raise ConfigError("v must have at least one entry (the width d is at least 1)")
        W = real_array("W", self.W, 2)
        if W.shape != (d, d):
            raise ConfigError(f"W must be {d}x{d} to match v of length {d}; got {W.shape}")
        u = np.zeros(d) if self.u is None else real_array("u", self.u, 1)
        if u.shape != (d,):
            raise ConfigError(f"u must have length {d}; got {u.shape}")
        c = real_array("c", self.c, 0)
        resolve_dtype(self.dtype)
        set_frozen(self, W=W, v=v, u=u)
        object.__setattr__(self, "c", float(c))

    @property
    def d(self) -> int:
        return self.v.shape[0]

    @property
    def has_bias(self) -> bool:
        return bool(np.any(self.u != 0) or self.c != 0)

    @staticmethod
    def unknowns(d: int, bias: bool = True) -> int:
        """Degrees of freedom: ``d² + 2d + 1`` with biases, ``d² + d`` for the paper's model."""
        return d * d + 2 * d + 1 if bias else d * d + d

    def with_dtype(self, dtype: str) -> "AttentionHead":
        return AttentionHead(self.W, self.v, self.u, self.c, dtype)

    def _params(self):
        """Parameters cast once to the compute dtype."""
        if not self._cast:
            dt = resolve_dtype(self.dtype)
            self._cast.update(dt=dt, W=self.W.astype(dt), v=self.v.astype(dt), u=self.u.astype(dt),
                              c=np.asarray(self.c, dtype=dt))
        return self._cast

    def attention(self, X: np.ndarray) -> np.ndarray:
        """Attention weights ``α(X) ∈ Δ^{N-1}`` per sequence, shape (B, N)."""
        p = self._params()
        return attention_weights(as_batch(X, self.d).astype(p["dt"]), p["W"], p["u"])

    def __call__(self, X: np.ndarray) -> np.ndarray:
        p = self._params()
        Xc = as_batch(X, self.d).astype(p["dt"])
        alpha = attention_weights(Xc, p["W"], p["u"])
        values = Xc @ p["v"]
        out = (alpha * values).sum(axis=-1) + p["c"]
        return out.astype(np.float64)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"W": self.W, "v": self.v, "u": self.u, "c": np.asarray(self.c)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64") -> "AttentionHead":
        missing = {"W", "v"} - set(arrays)
        if missing:
            raise ConfigError(f"an attention head needs arrays {sorted(missing)}")
        return cls(arrays["W"], arrays["v"], arrays.get("u"), arrays.get("c", 0.0), dtype)
