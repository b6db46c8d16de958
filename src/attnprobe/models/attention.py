"""Single-head attention regressor (paper Sec. 3, with the biases of real layers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from attnprobe._validation import as_batch, real_array  # noqa: F401  (re-exported: models take batches)
from attnprobe.errors import ConfigError
from attnprobe.models.precision import resolve_dtype
from attnprobe.models.softmax import softmax_last
from attnprobe.properties import axis_length


def attention_weights(Xc: np.ndarray, W: np.ndarray, u: np.ndarray | None = None) -> np.ndarray:
    """``α(X) = softmax(X W x_N + X u)`` per sequence, shape (B, N), computed in the dtype of ``Xc``."""
    q = Xc[:, -1, :] @ W.T  # W x_N, shape (B, d)
    scores = np.einsum("bnd,bd->bn", Xc, q)
    if u is not None:
        scores = scores + Xc @ u
    return softmax_last(scores)


def output_bias(c, K: int | None) -> float | np.ndarray:
    """``c`` as stored: one float in the scalar layout (``K`` None), a read-only (K,) array in the vector layout
    (a single number is broadcast to every output)."""
    c = real_array("c", c)
    if K is None:
        if c.size != 1:
            raise ConfigError(f"c must be a scalar (one number) for scalar answers; got shape {c.shape}", param="c")
        return float(c.reshape(()))
    if c.ndim == 0:
        c = np.full(K, float(c))
    if c.shape != (K,):
        raise ConfigError(f"c must have shape ({K},) to match the {K} outputs of v; got {c.shape}", param="c")
    c = np.array(c, dtype=np.float64)
    c.setflags(write=False)
    return c


def set_frozen(obj, **arrays: np.ndarray) -> None:
    """Store read-only arrays on a frozen dataclass (its ``__post_init__`` normalises, then calls this)."""
    for name, arr in arrays.items():
        arr.setflags(write=False)
        object.__setattr__(obj, name, arr)


@dataclass(frozen=True)
class AttentionParameters:
    """What every attention model with parameters ``W, v, u, c`` shares (a single head, or H heads stacked):
    the parameters and the compute ``dtype``, the bias test, the parameters cast once to the compute dtype, and
    npz I/O under those names."""

    W: np.ndarray
    v: np.ndarray
    u: np.ndarray | None = None
    c: float = 0.0
    dtype: str = "float64"
    _cast: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    #: how error messages name the model (e.g. "an attention head")
    DESCRIPTION: ClassVar[str] = "an attention model"
    #: dimensions of ``v`` in the vector layout
    VECTOR_NDIM: ClassVar[int] = 2

    def _store(self, W, v, u) -> None:
        """Store the validated ``W, v, u`` and the output bias (one number, or one per output in the vector
        layout), after checking the compute dtype."""
        c = output_bias(self.c, v.shape[-2] if v.ndim == self.VECTOR_NDIM else None)
        resolve_dtype(self.dtype)
        set_frozen(self, W=W, v=v, u=u)
        object.__setattr__(self, "c", c)

    @property
    def vector(self) -> bool:
        """True for the vector layout (``v`` holds a K×d value-output map per head; answers are (B, K))."""
        return self.v.ndim == self.VECTOR_NDIM

    @property
    def outputs(self) -> int:
        """Outputs per sequence: K for the vector layout, 1 for the scalar one."""
        return int(self.v.shape[-2]) if self.vector else 1

    def _params(self):
        """Parameters cast once to the compute dtype."""
        if not self._cast:
            dt = resolve_dtype(self.dtype)
            self._cast.update(dt=dt, W=self.W.astype(dt), v=self.v.astype(dt), u=self.u.astype(dt),
                              c=np.asarray(self.c, dtype=dt))
        return self._cast

    def arrays(self) -> dict[str, np.ndarray]:
        return {"W": self.W, "v": self.v, "u": self.u, "c": np.asarray(self.c)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64"):
        missing = {"W", "v"} - set(arrays)
        if missing:
            raise ConfigError(f"{cls.DESCRIPTION} needs arrays {sorted(missing)}", param="arrays")
        return cls(arrays["W"], arrays["v"], arrays.get("u"), arrays.get("c", 0.0), dtype)


@dataclass(frozen=True)
class AttentionHead(AttentionParameters):
    """``f(X) = softmax(X W x_N + X u)ᵀ (X v) + c`` for ``X ∈ R^{N×d}``, ``x_N`` the last row.

    ``u = 0, c = 0`` is the paper's model ``f_{W,v}`` (Sec. 3). ``dtype`` is the precision the whole forward
    pass is computed in, the way a deployed model answers; answers are returned as float64.
    Vector layout: ``v`` of shape (K, d) (the head's value-output map ``W_O[:, h] W_V[h]``) and ``c`` (K,):
    ``f(X) = softmax(…)ᵀ X vᵀ + c`` answers (B, K).
    """

    kind: ClassVar[str] = "attention_head"
    DESCRIPTION: ClassVar[str] = "an attention head"

    def __post_init__(self) -> None:
        v = real_array("v", self.v)
        if v.ndim not in (1, 2) or min(v.shape) < 1:
            raise ConfigError(f"v must have shape (d,) or (K, d) with K, d >= 1; got {v.shape}", param="v")
        d = v.shape[-1]
        if d < 1:
            raise ConfigError("v must have at least one entry (the width d is at least 1)", param="v")
        W = real_array("W", self.W, 2)
        if W.shape != (d, d):
            raise ConfigError(f"W must be {d}x{d} to match v of shape {v.shape} (v must be a vector (d,) or a K×d "
                              f"value-output map); got W of shape {W.shape}", param="W")
        u = np.zeros(d) if self.u is None else real_array("u", self.u, 1)
        if u.shape != (d,):
            raise ConfigError(f"u must have length {d}; got {u.shape}", param="u")
        self._store(W, v, u)

    d = axis_length("v", -1, "The input width.")

    @staticmethod
    def unknowns(d: int, bias: bool = True) -> int:
        """Degrees of freedom: ``d² + 2d + 1`` with biases, ``d² + d`` for the paper's model."""
        return d * d + 2 * d + 1 if bias else d * d + d

    def with_dtype(self, dtype: str) -> "AttentionHead":
        return AttentionHead(self.W, self.v, self.u, self.c, dtype)

    def attention(self, X: np.ndarray) -> np.ndarray:
        """Attention weights ``α(X) ∈ Δ^{N-1}`` per sequence, shape (B, N)."""
        p = self._params()
        return attention_weights(as_batch(X, self.d).astype(p["dt"]), p["W"], p["u"])

    def __call__(self, X: np.ndarray) -> np.ndarray:
        p = self._params()
        Xc = as_batch(X, self.d).astype(p["dt"])
        alpha = attention_weights(Xc, p["W"], p["u"])
        if self.vector:
            out = np.einsum("bn,bnd->bd", alpha, Xc) @ p["v"].T + p["c"]
        else:
            out = (alpha * (Xc @ p["v"])).sum(axis=-1) + p["c"]
        return out.astype(np.float64)
