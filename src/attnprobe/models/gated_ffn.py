"""Gated FFNs ``y = W2 [σ(Wg x + bg) ⊙ (Wu x + bu)] + b2``: SwiGLU (σ = SiLU, LLaMA's MLP ``down(silu(gate x) *
up x)``) and GeGLU (σ = GELU, exact or tanh), with biases or without.

Identifiable set: the function fixes each neuron's gate ``(g_i, bg_i)`` (σ is neither homogeneous nor odd, so the
gate's scale and sign are fixed) and the products ``w2_i (u_i, bu_i)ᵀ``; free are the order of the neurons and the
scale split between the up projection and the output column, ``(u_i, bu_i) → c (u_i, bu_i)``, ``w2_i → w2_i / c``
(c ≠ 0, the sign included). :func:`gated_match` compares two gated FFNs on exactly that set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attnprobe._validation import length_one_rows
from attnprobe.errors import ConfigError
from attnprobe.models.attention import real_array, set_frozen
from attnprobe.models.precision import resolve_dtype
from attnprobe.properties import axis_length
from attnprobe.models.smooth_ffn import (ACTIVATION_CODES, ACTIVATIONS, activation, activation_named, nearest_rows,
                                        rounded_affine, rounded_map)

#: the gated families by name and their gate activation
GATED_FAMILIES = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}


def family_name(gate: str) -> str:
    """``swiglu`` / ``geglu`` / ``geglu_tanh`` for a gate activation."""
    return {v: k for k, v in GATED_FAMILIES.items()}[gate]


@dataclass(frozen=True)
class GatedFFN:
    """``f(x) = W2 [σ(Wg x + bg) ⊙ (Wu x + bu)] + b2`` with ``Wg, Wu ∈ R^{m×d}``, ``W2 ∈ R^{K×m}`` (the
    ``nn.Linear`` layout of ``gate_proj``, ``up_proj``, ``down_proj``) and σ the gate activation (a
    :data:`~attnprobe.models.smooth_ffn.ACTIVATIONS` name: ``silu`` for SwiGLU, ``gelu``/``gelu_tanh`` for GeGLU).

    As an oracle it reads length-1 sequences ``(B, 1, d)`` and answers ``(B, K)``; ``dtype`` is the precision the
    forward pass is computed in."""

    Wg: np.ndarray
    bg: np.ndarray
    Wu: np.ndarray
    bu: np.ndarray
    W2: np.ndarray
    b2: np.ndarray
    activation: str = "silu"
    dtype: str = "float64"
    kind: ClassVar[str] = "gated_ffn"

    def __post_init__(self) -> None:
        Wg, Wu, W2 = (real_array(n, a, 2) for n, a in (("Wg", self.Wg), ("Wu", self.Wu), ("W2", self.W2)))
        bg, bu, b2 = (real_array(n, a, 1) for n, a in (("bg", self.bg), ("bu", self.bu), ("b2", self.b2)))
        m, d = Wg.shape
        if m < 1 or d < 1 or Wu.shape != (m, d):
            raise ConfigError(f"Wg and Wu must both be m×d with m, d ≥ 1; got {Wg.shape} and {Wu.shape}", param="Wu")
        if W2.shape[1] != m:
            raise ConfigError(f"W2 must be K×m with m = {m} (the rows of Wg); got {W2.shape}", param="W2")
        if bg.shape != (m,) or bu.shape != (m,) or b2.shape != (W2.shape[0],):
            raise ConfigError(f"bg and bu must have length m = {m} and b2 length K = {W2.shape[0]}; got "
                              f"{bg.shape}, {bu.shape}, {b2.shape}", param="bg")
        activation(self.activation)
        resolve_dtype(self.dtype)
        set_frozen(self, Wg=Wg, bg=bg, Wu=Wu, bu=bu, W2=W2, b2=b2)

    d = axis_length("Wg", 1, "The input width.")
    m = axis_length("Wg", 0, "The hidden width: gated units, rows of Wg and Wu.")
    outputs = axis_length("W2", 0, "The output width K.")

    @property
    def family(self) -> str:
        return family_name(self.activation)

    @staticmethod
    def unknowns(d: int, m: int, outputs: int, bias: bool = True) -> int:
        """Numbers the function fixes: each neuron's gate ``(g, bg)`` and ``w2 (u, bu)ᵀ`` less its one free scale,
        and ``b2``."""
        return m * d + m * (d + outputs - 1) + ((2 * m + outputs) if bias else 0)

    def with_dtype(self, dtype: str) -> "GatedFFN":
        return GatedFFN(self.Wg, self.bg, self.Wu, self.bu, self.W2, self.b2, self.activation, dtype)

    def hidden(self, x: np.ndarray) -> np.ndarray:
        """The gated hidden units ``σ(Wg x + bg) ⊙ (Wu x + bu)`` for inputs (B, d), in float64."""
        return ACTIVATIONS[self.activation].f(x @ self.Wg.T + self.bg) * (x @ self.Wu.T + self.bu)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """``W2 [σ(Wg x + bg) ⊙ (Wu x + bu)] + b2`` for inputs of shape (B, d): shape (B, K)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.d:
            raise ConfigError(f"inputs must have shape (B, {self.d}); got {x.shape}", param="x")
        dt = resolve_dtype(self.dtype)
        if dt == np.float64:
            return self.hidden(x) @ self.W2.T + self.b2
        gate = rounded_affine(x, self.Wg, self.bg, dt)
        up = rounded_affine(x, self.Wu, self.bu, dt)
        h = (rounded_map(ACTIVATIONS[self.activation].f, gate, dt) * up).astype(dt)
        return rounded_affine(h, self.W2, self.b2, dt).astype(np.float64)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return self.forward(length_one_rows(X, self.d, "a gated FFN"))

    def arrays(self) -> dict[str, np.ndarray]:
        return {"Wg": self.Wg, "bg": self.bg, "Wu": self.Wu, "bu": self.bu, "W2": self.W2, "b2": self.b2,
                "activation": np.asarray(ACTIVATION_CODES[self.activation])}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64") -> "GatedFFN":
        missing = {"Wg", "bg", "Wu", "bu", "W2", "b2", "activation"} - set(arrays)
        if missing:
            raise ConfigError(f"a gated FFN needs arrays {sorted(missing)}", param="arrays")
        return cls(arrays["Wg"], arrays["bg"], arrays["Wu"], arrays["bu"], arrays["W2"], arrays["b2"],
                   activation_named(arrays["activation"]), dtype)


def gated_match(truth: GatedFFN, result: GatedFFN) -> dict:
    """Compare two gated FFNs on the identifiable set: each true neuron is matched to the recovered one whose gate
    ``(g, bg)`` is closest; returns the largest relative errors of the gates and of the products
    ``w2 (u, bu)ᵀ`` (the up/down scale split is free) and whether the matching is one to one."""
    Gt = np.hstack([truth.Wg, truth.bg[:, None]])
    Gh = np.hstack([result.Wg, result.bg[:, None]])
    j = nearest_rows(Gt, Gh)
    gate = np.linalg.norm(Gh[j] - Gt, axis=1) / np.linalg.norm(Gt, axis=1)
    Ut = np.hstack([truth.Wu, truth.bu[:, None]])
    Uh = np.hstack([result.Wu, result.bu[:, None]])
    Pt = np.einsum("ki,ia->ika", truth.W2, Ut)
    Ph = np.einsum("ki,ia->ika", result.W2[:, j], Uh[j])
    prod = np.linalg.norm((Ph - Pt).reshape(truth.m, -1), axis=1) / np.linalg.norm(Pt.reshape(truth.m, -1), axis=1)
    return {"neurons": int(truth.m), "recovered_neurons": int(result.m), "gate_error": float(gate.max()),
            "up_down_error": float(prod.max()), "matched_one_to_one": bool(len(set(j.tolist())) == len(j))}
