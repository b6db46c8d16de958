"""One-layer single-head transformer ``TF(X) = w_oᵀ ReLU(α(X)ᵀ X A)`` (paper Sec. 4.1, eq. for TF)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.attention import as_batch, attention_weights, real_array, set_frozen
from attnprobe.models.ffn import FFNWidths, ReLUNet, check_biases, check_ffn
from attnprobe.models.softmax import softmax_last
from attnprobe.models.precision import resolve_dtype
from attnprobe.properties import axis_length


@dataclass(frozen=True)
class OneLayerTransformer(FFNWidths):
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
        A, w_o = check_ffn(self.A, self.w_o)
        W = real_array("W", self.W, 2)
        d = A.shape[0]
        if W.shape != (d, d):
            raise ConfigError(f"W must be {d}x{d} to match A with {d} rows; got {W.shape}", param="W")
        resolve_dtype(self.dtype)
        set_frozen(self, W=W, A=A, w_o=w_o)

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

    def as_multihead(self) -> "MultiHeadTransformer":
        """The same function as a :class:`MultiHeadTransformer`: one head, ``u = 0``, ``V = I``, no biases."""
        d, m = self.A.shape
        return MultiHeadTransformer(self.W[None], np.zeros((1, d)), np.eye(d)[None], self.A, np.zeros(m),
                                    self.w_o.reshape(m, 1), np.zeros(1), False, self.dtype)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64") -> "OneLayerTransformer":
        missing = {"W", "A", "w_o"} - set(arrays)
        if missing:
            raise ConfigError(f"a one-layer transformer needs arrays {sorted(missing)}", param="arrays")
        return cls(arrays["W"], arrays["A"], arrays["w_o"], dtype)


@dataclass(frozen=True)
class MultiHeadTransformer(FFNWidths):
    """``TF(X) = w_oᵀ ReLU(Aᵀ a(X) + b) + c`` with ``a(X) = Σ_h V_h Xᵀ softmax(X W_h x_N + X u_h)`` (multi-head
    attention, a biased ReLU FFN and K outputs); ``residual=True`` feeds ``x_N + a(X)`` to the FFN instead.

    Shapes: ``W (H, d, d)``, ``u (H, d)``, ``v (H, d, d)`` (``V_h``, the head's value-output map), ``A (d, m)``,
    ``b (m,)``, ``w_o (m, K)``, ``c (K,)``; one output is stored as ``(m, 1)`` / ``(1,)`` and answered as ``(B,)``.
    Only compositions are identifiable: ``V_h`` and ``A`` up to an invertible map between them (none with the
    residual), neurons up to positive scale and order, heads up to order (and Prop. 7.1 merges).
    """

    W: np.ndarray
    u: np.ndarray
    v: np.ndarray
    A: np.ndarray
    b: np.ndarray
    w_o: np.ndarray
    c: np.ndarray
    residual: bool = False
    dtype: str = "float64"
    kind: ClassVar[str] = "multihead_transformer"

    def __post_init__(self) -> None:
        W, u, v = real_array("W", self.W, 3), real_array("u", self.u, 2), real_array("v", self.v, 3)
        H, d = u.shape
        if W.shape != (H, d, d) or v.shape != (H, d, d):
            raise ConfigError(f"W and v must have shape (H, d, d) = ({H}, {d}, {d}) to match u of shape {u.shape}; "
                              f"got {W.shape} and {v.shape}", param="W")
        w_o = real_array("w_o", self.w_o)
        w_o = w_o.reshape(-1, 1) if w_o.ndim == 1 else w_o
        A, w_o = check_ffn(self.A, w_o)
        if A.shape[0] != d:
            raise ConfigError(f"A must have d = {d} rows to match the heads; got {A.shape}", param="A")
        b, c = check_biases(self.b, self.c, A.shape[1], w_o)
        if H < 1:
            raise ConfigError("a transformer needs at least one head", param="W")
        resolve_dtype(self.dtype)
        set_frozen(self, W=W, u=u, v=v, A=A, b=b, w_o=w_o, c=c)
        object.__setattr__(self, "residual", bool(np.asarray(self.residual).reshape(())))

    H = axis_length("W", 0, "The heads.")
    K = axis_length("w_o", 1, "The outputs.")

    @property
    def ffn(self) -> ReLUNet:
        """The FFN ``z ↦ w_oᵀReLU(Aᵀz + b) + c`` (K outputs)."""
        return ReLUNet(self.A, self.w_o, self.dtype, self.b, self.c)

    @staticmethod
    def unknowns(d: int, H: int, m: int, K: int, residual: bool = False) -> int:
        """Identifiable numbers: ``H(d² + d)`` for the attention scores; the maps ``[AᵀV_1 … AᵀV_H]``, an
        m × Hd matrix of rank ``r = min(d, m)``: ``r(m + Hd − r)`` (with the residual ``Aᵀ[I, V_1 … V_H]``, of the
        same rank: ``r(m + d − r) + H·d·r``); ``m`` biases, ``m·K`` output weights less ``m`` neuron scales, ``K``."""
        r = min(d, m)
        maps = r * (m + d - r) + H * d * r if residual else r * (m + H * d - r)
        return H * (d * d + d) + maps + m * K + K

    def with_dtype(self, dtype: str) -> "MultiHeadTransformer":
        return MultiHeadTransformer(self.W, self.u, self.v, self.A, self.b, self.w_o, self.c, self.residual, dtype)

    def attention_output(self, X: np.ndarray) -> np.ndarray:
        """``a(X)`` (plus ``x_N`` with the residual), shape (B, d), in the model's dtype."""
        dt = resolve_dtype(self.dtype)
        Xc = as_batch(X, self.d).astype(dt)
        H, d = self.H, self.d
        q = (Xc[:, -1, :] @ self.W.astype(dt).reshape(H * d, d).T).reshape(-1, H, d)  # W_h x_N
        # matrix products, not einsum: numpy's einsum refuses the bfloat16 dtype
        scores = np.matmul(q, Xc.transpose(0, 2, 1)) + (Xc @ self.u.astype(dt).T).transpose(0, 2, 1)  # (B, H, N)
        mixed = np.matmul(softmax_last(scores), Xc)  # Xᵀ α_h: (B, H, d)
        out = mixed.reshape(len(Xc), H * d) @ self.v.astype(dt).transpose(0, 2, 1).reshape(H * d, d)  # Σ_h V_h Xᵀα_h
        return out + Xc[:, -1, :] if self.residual else out

    def __call__(self, X: np.ndarray) -> np.ndarray:
        dt = resolve_dtype(self.dtype)
        z = self.attention_output(X) @ self.A.astype(dt) + self.b.astype(dt)
        y = np.maximum(z, 0) @ self.w_o.astype(dt) + self.c.astype(dt)
        y = y.astype(np.float64)
        return y[:, 0] if self.K == 1 else y

    def arrays(self) -> dict[str, np.ndarray]:
        return {"W": self.W, "u": self.u, "v": self.v, "A": self.A, "b": self.b, "w_o": self.w_o, "c": self.c,
                "residual": np.asarray(self.residual)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64") -> "MultiHeadTransformer":
        missing = {"W", "u", "v", "A", "b", "w_o", "c"} - set(arrays)
        if missing:
            raise ConfigError(f"a multi-head transformer needs arrays {sorted(missing)}", param="arrays")
        for name, ndim in (("b", 1), ("w_o", 2), ("c", 1)):  # files hold K = 1 as (m, 1) / (1,): nothing reshaped
            if np.ndim(arrays[name]) != ndim:
                raise ConfigError(f"{name} must have {ndim} dimension(s) in a multi-head transformer file; got shape "
                                  f"{np.shape(arrays[name])}", param=name)
        if np.ndim(arrays.get("residual", False)) != 0:
            raise ConfigError("residual must be one flag", param="residual")
        return cls(arrays["W"], arrays["u"], arrays["v"], arrays["A"], arrays["b"], arrays["w_o"], arrays["c"],
                   bool(arrays.get("residual", False)), dtype)


def transformer_errors(true, got, *, seed: int = 0, per_length: int = 16) -> dict[str, float]:
    """How far ``got`` is from ``true`` (either a multi-head or a Sec. 4.1 transformer): heads matched by their
    scores (Hungarian on ``‖W_h − Ŵ_g‖``), the worst relative error of W and of u over matched heads, and the
    relative error of the function on fresh N(0, I) sequences of every length 1–16 (V_h and A are only defined up
    to an invertible map, so they are judged through the function)."""
    from scipy.optimize import linear_sum_assignment

    true = true.as_multihead() if isinstance(true, OneLayerTransformer) else true
    got = got.as_multihead() if isinstance(got, OneLayerTransformer) else got
    D = np.linalg.norm(true.W[:, None] - got.W[None], axis=(2, 3)) / np.linalg.norm(true.W, axis=(1, 2))[:, None]
    rows, cols = linear_sum_assignment(D)
    u_scale = float(np.linalg.norm(true.u)) or 1.0  # bias-free: the absolute error
    u_err = max(float(np.linalg.norm(true.u[i] - got.u[j])) for i, j in zip(rows, cols)) / u_scale
    rng = np.random.default_rng(seed)
    num = den = 0.0
    for N in range(1, 17):
        X = rng.standard_normal((per_length, N, true.d))
        y = true(X)
        num += float(np.sum((got(X) - y) ** 2))
        den += float(np.sum((y - true.c.reshape(-1)[0] if true.K == 1 else y - true.c) ** 2))
    return {"heads_found": float(got.H), "heads_true": float(true.H), "W": float(np.max(D[rows, cols])),
            "u": u_err, "function": float(np.sqrt(num / max(den, 1e-300)))}
