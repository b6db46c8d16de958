"""Two-layer ReLU networks ``x ↦ w_oᵀ ReLU(Aᵀx + b) + c`` with one or K outputs; the bias-free, single-output
``x ↦ w_oᵀ ReLU(Aᵀx)`` is the FFN of the paper's Sec. 4.1 (``b = 0``, ``c = 0``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe._validation import length_one_rows
from attnprobe.models.attention import real_array, set_frozen
from attnprobe.models.precision import resolve_dtype
from attnprobe.properties import axis_length


def check_ffn(A, w_o) -> tuple[np.ndarray, np.ndarray]:
    A = real_array("A", A, 2)
    w_o = real_array("w_o", w_o, 2 if np.ndim(w_o) == 2 else 1)
    if A.shape[1] != w_o.shape[0]:
        raise ConfigError(f"A must be d×m with m = len(w_o) = {w_o.shape[0]}; got A of shape {A.shape}", param="A")
    if A.shape[0] < 1 or A.shape[1] < 1:
        raise ConfigError(f"A must have at least one row and one column; got {A.shape}", param="A")
    return A, w_o


def check_biases(b, c, m: int, w_o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hidden biases ``b`` (m,) and output bias ``c`` (``()`` or ``(K,)`` like the outputs); None means zeros."""
    out_shape = w_o.shape[1:]
    b = np.zeros(m) if b is None else np.array(b, dtype=np.float64).reshape(-1)
    c = np.zeros(out_shape) if c is None else np.array(c, dtype=np.float64)
    if b.shape != (m,):
        raise ConfigError(f"b must have length m = {m}; got shape {b.shape}", param="b")
    if c.size == 1 and not out_shape:
        c = c.reshape(())
    if c.shape != out_shape:
        raise ConfigError(f"c must have shape {out_shape} (one per output); got {c.shape}", param="c")
    if not (np.isfinite(b).all() and np.isfinite(c).all()):
        raise ConfigError("model parameters must be finite", param="b")
    return b, c


class FFNWidths:
    """``d`` (input width) and ``m`` (hidden width) of a model whose FFN's first layer is ``A`` (d × m)."""

    d = axis_length("A", 0, "The input width (rows of A).")
    m = axis_length("A", 1, "The hidden width: neurons, columns of A.")


@dataclass(frozen=True)
class ReLUNet(FFNWidths):
    """``f(x) = w_oᵀ ReLU(Aᵀx + b) + c`` with ``A ∈ R^{d×m}`` (column k is neuron k), hidden biases ``b ∈ R^m``,
    output weights ``w_o ∈ R^m`` (one output) or ``R^{m×K}`` (K outputs, e.g. logits) and output bias ``c``.

    ``b`` and ``c`` default to 0: then ``f`` is the paper's bias-free FFN, positively homogeneous
    (``f(λx) = λ f(x)`` for λ ≥ 0). As an oracle it reads sequences ``(B, N, d)`` of length N = 1 (the
    transformer's length-1 queries, Sec. 4.1) and answers ``(B,)`` or ``(B, K)``; :meth:`forward` takes plain
    ``(B, d)`` inputs. ``dtype`` is the precision the forward pass is computed in; answers are returned as float64.
    """

    A: np.ndarray
    w_o: np.ndarray
    dtype: str = "float64"
    b: np.ndarray | None = None
    c: np.ndarray | float | None = None
    kind: ClassVar[str] = "relu_net"

    def __post_init__(self) -> None:
        A, w_o = check_ffn(self.A, self.w_o)
        b, c = check_biases(self.b, self.c, A.shape[1], w_o)
        resolve_dtype(self.dtype)
        set_frozen(self, A=A, w_o=w_o, b=b, c=c)

    @property
    def outputs(self) -> int | None:
        """K for a K-output network, None for a single output answered as a scalar."""
        return self.w_o.shape[1] if self.w_o.ndim == 2 else None

    @property
    def biased(self) -> bool:
        return bool(np.any(self.b) or np.any(self.c))

    @staticmethod
    def unknowns(d: int, m: int, outputs: int = 1, bias: bool = False) -> int:
        """Numbers up to the positive rescaling of each neuron: ``d·m`` for the bias-free single-output net
        (``d·m + m`` raw parameters); with biases and K outputs ``(d + 1)·m + (K − 1)·m + K``."""
        if not bias and outputs == 1:
            return d * m
        return (d + 1) * m + (outputs - 1) * m + (outputs if bias else 0)

    def with_dtype(self, dtype: str) -> "ReLUNet":
        return ReLUNet(self.A, self.w_o, dtype, self.b, self.c)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``w_oᵀ ReLU(Aᵀx + b) + c`` for inputs of shape (B, d): shape (B,) or (B, K)."""
        dt = resolve_dtype(self.dtype)
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ConfigError(f"inputs must have shape (B, {self.d}); got {x.shape}", param="x")
        pre = x.astype(dt) @ self.A.astype(dt)
        if self.b.any():
            pre = pre + self.b.astype(dt)
        y = np.maximum(pre, 0) @ self.w_o.astype(dt)
        if np.any(self.c):
            y = y + self.c.astype(dt)
        return y.astype(np.float64)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return self.forward(length_one_rows(X, self.d, "a ReLU network"))

    def arrays(self) -> dict[str, np.ndarray]:
        return {"A": self.A, "b": self.b, "w_o": self.w_o, "c": self.c}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64") -> "ReLUNet":
        """From arrays ``A, w_o`` and optionally ``b, c`` (files of the bias-free model have no biases)."""
        missing = {"A", "w_o"} - set(arrays)
        if missing:
            raise ConfigError(f"a ReLU network needs arrays {sorted(missing)}", param="arrays")
        return cls(arrays["A"], arrays["w_o"], dtype, arrays.get("b"), arrays.get("c"))


def canonical_neurons(A: np.ndarray, w_o: np.ndarray, tol: float = 1e-12,
                      b: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Neurons up to permutation and positive scale: unit directions ``â_k`` (of ``(a_k, b_k)`` when biases ``b``
    are given) and output weights ``w_k‖(a_k, b_k)‖`` (rows of (m, K) weights for K outputs), dropping dead
    neurons (``a_k = 0``, or ``w_k = 0`` in every output) and merging positively parallel ones."""
    A, w_o = check_ffn(A, w_o)
    if b is not None:
        A = np.vstack([A, np.asarray(b, dtype=np.float64).reshape(1, -1)])
    norms = np.linalg.norm(A, axis=0)
    W = w_o.reshape(w_o.shape[0], -1)
    eff = W * norms[:, None]
    size = np.linalg.norm(eff, axis=1)
    scale = max(float(np.max(size, initial=0.0)), 1e-300)
    keep = (np.linalg.norm(A[: A.shape[0] - (b is not None)], axis=0) > 0) & (size > tol * scale)
    dirs, weights = [], []
    for k in np.flatnonzero(keep):
        a = A[:, k] / norms[k]
        for i, u in enumerate(dirs):
            if float(a @ u) > 1 - 1e-10:
                weights[i] = weights[i] + eff[k]
                break
        else:
            dirs.append(a)
            weights.append(eff[k].copy())
    D = np.array(dirs).T if dirs else np.zeros((A.shape[0], 0))
    Wk = np.array(weights).reshape(len(weights), W.shape[1])
    return D, (Wk[:, 0] if w_o.ndim == 1 else Wk)


def neuron_errors(A_true, w_true, A_hat, w_hat, *, b_true=None, b_hat=None) -> dict:
    """Compare two networks neuron by neuron up to permutation and positive scale (after
    :func:`canonical_neurons`; with biases, neuron k is the hyperplane ``(a_k, b_k)``): each true neuron is matched
    to the recovered one of largest cosine. Returns the neuron counts, the largest direction error ``‖â − a‖``,
    the largest relative output-weight error (norm over outputs) and ``recovered_to(tol)``-style counts:
    ``within_1e-3``, the true neurons whose direction and weights are both within 1e-3."""
    biased = b_true is not None or b_hat is not None
    if biased:
        b_true = np.zeros(np.shape(A_true)[1]) if b_true is None else b_true
        b_hat = np.zeros(np.shape(A_hat)[1]) if b_hat is None else b_hat
    Dt, wt = canonical_neurons(A_true, w_true, b=b_true)
    Dh, wh = canonical_neurons(A_hat, w_hat, b=b_hat)
    out = {"true_neurons": int(Dt.shape[1]), "recovered_neurons": int(Dh.shape[1])}
    if Dt.shape[1] == 0 or Dh.shape[1] == 0:
        return {**out, "direction_error": float("inf"), "weight_error": float("inf"), "within_1e-3": 0,
                "matched_one_to_one": False}
    j = np.argmax(Dt.T @ Dh, axis=1)
    dir_err = np.linalg.norm(Dh[:, j] - Dt, axis=0)
    wt2, wh2 = wt.reshape(wt.shape[0], -1), wh.reshape(wh.shape[0], -1)
    w_err = np.linalg.norm(wh2[j] - wt2, axis=1) / np.linalg.norm(wt2, axis=1)
    return {**out, "direction_error": float(dir_err.max()), "weight_error": float(w_err.max()),
            "within_1e-3": int(np.sum((dir_err < 1e-3) & (w_err < 1e-3))),
            "matched_one_to_one": bool(len(set(j.tolist())) == len(j))}
