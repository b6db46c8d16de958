"""Smooth two-layer FFNs ``y = W2 σ(W1 x + b1) + b2`` (K outputs) with σ one of GELU (the exact erf form and the
tanh approximation) or SiLU, and their first and second derivatives (the learner reads both off the answers).

Identifiable set: the function fixes every neuron ``(w1_i, b1_i, w2_i)`` up to the order of the neurons only —
a smooth σ has no positive homogeneity, so unlike ReLU no scale moves between the layers (GELU and SiLU are not
odd, so no sign flips either). Neurons whose ``w2_i = 0`` (or ``w1_i = 0``, which folds into ``b2``) are invisible.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Callable, ClassVar

import numpy as np
from scipy.special import erf

from attnprobe.errors import ConfigError
from attnprobe._validation import length_one_rows
from attnprobe.models.attention import real_array, set_frozen
from attnprobe.models.precision import resolve_dtype
from attnprobe.properties import axis_length

_SQRT2 = np.sqrt(2.0)
_TANH_C = np.sqrt(2.0 / np.pi)


def _phi(z):
    return np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)


def _gelu(z):
    return 0.5 * z * (1.0 + erf(z / _SQRT2))


def _gelu_1(z):
    return 0.5 * (1.0 + erf(z / _SQRT2)) + z * _phi(z)


def _gelu_2(z):
    return _phi(z) * (2.0 - z * z)


def _tanh_parts(z):
    u = _TANH_C * (z + 0.044715 * z ** 3)
    du = _TANH_C * (1.0 + 3 * 0.044715 * z * z)
    ddu = _TANH_C * 6 * 0.044715 * z
    return np.tanh(u), du, ddu


def _gelu_tanh(z):
    return 0.5 * z * (1.0 + np.tanh(_TANH_C * (z + 0.044715 * z ** 3)))


def _gelu_tanh_1(z):
    t, du, _ = _tanh_parts(z)
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * du


def _gelu_tanh_2(z):
    t, du, ddu = _tanh_parts(z)
    s = 1.0 - t * t
    return s * du + 0.5 * z * (s * ddu - 2.0 * t * s * du * du)


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow warning for large |z|


def _silu(z):
    return z * _sigmoid(z)


def _silu_1(z):
    s = _sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def _silu_2(z):
    s = _sigmoid(z)
    return s * (1.0 - s) * (2.0 + z * (1.0 - 2.0 * s))


@dataclass(frozen=True)
class Activation:
    """A smooth activation σ with σ' and σ'' (float64 numpy ufunc-style callables)."""

    name: str
    f: Callable[[np.ndarray], np.ndarray]
    d1: Callable[[np.ndarray], np.ndarray]
    d2: Callable[[np.ndarray], np.ndarray]


#: the smooth activations by name: ``gelu`` is the exact erf form (BERT, MiniLM), ``gelu_tanh`` the tanh
#: approximation (GPT-2, ``gelu_new``), ``silu`` is x·sigmoid(x) (LLaMA's gate, there inside SwiGLU)
ACTIVATIONS: dict[str, Activation] = {
    "gelu": Activation("gelu", _gelu, _gelu_1, _gelu_2),
    "gelu_tanh": Activation("gelu_tanh", _gelu_tanh, _gelu_tanh_1, _gelu_tanh_2),
    "silu": Activation("silu", _silu, _silu_1, _silu_2),
}
#: numeric codes of the activations in saved files (the ``.npz`` holds numbers only, and the kind tag)
ACTIVATION_CODES = {name: i for i, name in enumerate(ACTIVATIONS)}


def activation(name: str) -> Activation:
    if name not in ACTIVATIONS:
        raise ConfigError(f"unknown smooth activation {name!r}; choose one of {', '.join(ACTIVATIONS)}",
                          param="activation")
    return ACTIVATIONS[name]


class ActivationFFN:
    """What the plain and the gated smooth FFN share: their arrays are their dataclass fields before
    ``activation`` and ``dtype`` (saved with the activation code), the ``(B, d)`` input check, the copy at another
    precision, and the output layer ``W2 h + b2`` computed in the compute ``dtype`` (each rounding emulated)
    around the model's own :meth:`hidden` / :meth:`hidden_in`."""

    #: how error messages name the model
    NAME: ClassVar[str]
    #: the first-layer weights (each m×d; the first names the rows) and their biases (each of length m)
    FIRST_LAYER: ClassVar[tuple[str, ...]]
    FIRST_BIASES: ClassVar[tuple[str, ...]]

    @classmethod
    def array_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name not in ("activation", "dtype"))

    def __post_init__(self) -> None:
        arrays = {name: real_array(name, getattr(self, name), 2 if name.startswith("W") else 1)
                  for name in self.array_names()}
        m = self.hidden_width(arrays)
        W2, b2 = arrays["W2"], arrays["b2"]
        if W2.shape[1] != m:
            raise ConfigError(f"W2 must be K×m with m = {m} (the rows of {self.FIRST_LAYER[0]}); got {W2.shape}",
                              param="W2")
        if b2.shape != (W2.shape[0],):
            raise ConfigError(f"b2 must have length K = {W2.shape[0]}; got {b2.shape}", param="b2")
        activation(self.activation)
        resolve_dtype(self.dtype)
        set_frozen(self, **arrays)

    @classmethod
    def hidden_width(cls, arrays: dict[str, np.ndarray]) -> int:
        """``m`` (the rows of the first-layer weights) once every first-layer weight is m×d and every bias has
        length m."""
        m, d = arrays[cls.FIRST_LAYER[0]].shape
        for name in cls.FIRST_LAYER:
            if m < 1 or d < 1 or arrays[name].shape != (m, d):
                shapes = " and ".join(f"{n} {arrays[n].shape}" for n in cls.FIRST_LAYER)
                raise ConfigError(f"{' and '.join(cls.FIRST_LAYER)} must each be m×d with m, d ≥ 1; got {shapes}",
                                  param=name)
        for name in cls.FIRST_BIASES:
            if arrays[name].shape != (m,):
                raise ConfigError(f"{name} must have length m = {m}; got {arrays[name].shape}", param=name)
        return m

    d = property(lambda self: getattr(self, self.FIRST_LAYER[0]).shape[1], doc="The input width.")
    m = property(lambda self: getattr(self, self.FIRST_LAYER[0]).shape[0],
                 doc="The hidden width: neurons (gated units), rows of the first-layer weights.")
    outputs = axis_length("W2", 0, "The output width K.")

    def with_dtype(self, dtype: str):
        return replace(self, dtype=dtype)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``W2 h(x) + b2`` for inputs of shape (B, d): shape (B, K)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ConfigError(f"inputs must have shape (B, {self.d}); got {x.shape}", param="x")
        dt = resolve_dtype(self.dtype)
        if dt == np.float64:
            return self.hidden(x) @ self.W2.T + self.b2
        h = self.hidden_in(x.astype(dt), dt)
        return (h @ self.W2.T.astype(dt) + self.b2.astype(dt)).astype(np.float64)  # not rounded to dt first

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return self.forward(length_one_rows(X, self.d, self.NAME))

    def arrays(self) -> dict[str, np.ndarray]:
        return {**{name: getattr(self, name) for name in self.array_names()},
                "activation": np.asarray(ACTIVATION_CODES[self.activation])}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64"):
        missing = {*cls.array_names(), "activation"} - set(arrays)
        if missing:
            raise ConfigError(f"{cls.NAME} needs arrays {sorted(missing)}", param="arrays")
        return cls(*(arrays[name] for name in cls.array_names()), activation_named(arrays["activation"]), dtype)


def affine_in(x: np.ndarray, W: np.ndarray, b: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``x Wᵀ + b`` computed in precision ``dt`` (``x`` already in it): the parameters cast, the result rounded."""
    return (x @ W.T.astype(dt) + b.astype(dt)).astype(dt)


def activation_ffn(*first: str, activation: str, kind: str, name: str):
    """Make an :class:`ActivationFFN` subclass a frozen dataclass with the fields its shared code reads: the
    first-layer arrays ``first`` (each weight followed by its bias, e.g. ``"W1", "b1"``), then ``W2``, ``b2``,
    ``activation`` (default ``activation``) and ``dtype`` (default float64); ``kind`` is its saved-file tag and
    ``name`` how error messages name it. The one place both FFN models declare their fields."""

    def make(cls):
        cls.__annotations__ = {**dict.fromkeys((*first, "W2", "b2"), np.ndarray), "activation": str, "dtype": str}
        cls.activation, cls.dtype, cls.kind, cls.NAME = activation, "float64", kind, name
        cls.FIRST_LAYER, cls.FIRST_BIASES = first[0::2], first[1::2]
        return dataclass(frozen=True)(cls)

    return make


@activation_ffn("W1", "b1", activation="gelu", kind="smooth_ffn", name="a smooth FFN")
class SmoothFFN(ActivationFFN):
    """``f(x) = W2 σ(W1 x + b1) + b2`` with ``W1 ∈ R^{m×d}``, ``b1 ∈ R^m``, ``W2 ∈ R^{K×m}``, ``b2 ∈ R^K`` (the
    ``nn.Linear`` layout of a transformer's FFN) and σ a smooth :data:`ACTIVATIONS` entry.

    As an oracle it reads length-1 sequences ``(B, 1, d)`` and answers ``(B, K)``; :meth:`forward` takes plain
    ``(B, d)`` inputs. ``dtype`` is the precision the forward pass is computed in (answers come back as float64).
    """

    @staticmethod
    def unknowns(d: int, m: int, outputs: int, bias: bool = True) -> int:
        """Numbers the function fixes: every neuron's ``(w1, b1, w2)`` and ``b2`` (only the order is free)."""
        return m * d + outputs * m + ((m + outputs) if bias else 0)

    def hidden(self, x: np.ndarray) -> np.ndarray:
        """The hidden units ``σ(W1 x + b1)`` for inputs (B, d), in float64."""
        return activation(self.activation).f(x @ self.W1.T + self.b1)

    def hidden_in(self, x: np.ndarray, dt: np.dtype) -> np.ndarray:
        """The hidden units computed in precision ``dt`` (``x`` already in it)."""
        return activation(self.activation).f(affine_in(x, self.W1, self.b1, dt).astype(np.float64)).astype(dt)


def activation_named(code) -> str:
    """The activation a saved file's ``activation`` code (:data:`ACTIVATION_CODES`) stands for."""
    code = int(np.asarray(code).reshape(()))
    names = {v: k for k, v in ACTIVATION_CODES.items()}
    if code not in names:
        raise ConfigError(f"activation code {code} is none of {ACTIVATION_CODES}", param="activation")
    return names[code]


def nearest_rows(truth: np.ndarray, result: np.ndarray) -> np.ndarray:
    """For each row of ``truth``, the index of the nearest row of ``result`` (Euclidean): units matched up to order."""
    dist2 = np.sum(truth ** 2, axis=1)[:, None] + np.sum(result ** 2, axis=1)[None, :] - 2.0 * truth @ result.T
    return np.argmin(dist2, axis=1)


def neuron_match(truth: SmoothFFN, result: SmoothFFN) -> dict:
    """Compare two smooth FFNs neuron by neuron up to order (the identifiable set): each true neuron is matched to
    the recovered one whose ``(w1, b1)`` is closest; returns the largest relative errors of ``(w1, b1)`` and of
    ``w2`` over the matched pairs and whether the matching is one to one."""
    Pt = np.hstack([truth.W1, truth.b1[:, None]])
    Ph = np.hstack([result.W1, result.b1[:, None]])
    j = nearest_rows(Pt, Ph)
    first = np.linalg.norm(Ph[j] - Pt, axis=1) / np.linalg.norm(Pt, axis=1)
    second = np.linalg.norm(result.W2[:, j] - truth.W2, axis=0) / np.linalg.norm(truth.W2, axis=0)
    return {"neurons": int(truth.m), "recovered_neurons": int(result.m), "first_layer_error": float(first.max()),
            "second_layer_error": float(second.max()), "matched_one_to_one": bool(len(set(j.tolist())) == len(j))}
