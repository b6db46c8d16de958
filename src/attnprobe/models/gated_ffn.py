"""Gated FFNs ``y = W2 [σ(Wg x + bg) ⊙ (Wu x + bu)] + b2``: SwiGLU (σ = SiLU, LLaMA's MLP ``down(silu(gate x) *
up x)``) and GeGLU (σ = GELU, exact or tanh), with biases or without.

Identifiable set: the function fixes each neuron's gate ``(g_i, bg_i)`` (σ is neither homogeneous nor odd, so the
gate's scale and sign are fixed) and the products ``w2_i (u_i, bu_i)ᵀ``; free are the order of the neurons and the
scale split between the up projection and the output column, ``(u_i, bu_i) → c (u_i, bu_i)``, ``w2_i → w2_i / c``
(c ≠ 0, the sign included). :func:`gated_match` compares two gated FFNs on exactly that set.
"""

from __future__ import annotations

import numpy as np

from attnprobe.models.smooth_ffn import ACTIVATIONS, ActivationFFN, activation_ffn, affine_in, nearest_rows

#: the gated families by name and their gate activation
GATED_FAMILIES = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}


def family_name(gate: str) -> str:
    """``swiglu`` / ``geglu`` / ``geglu_tanh`` for a gate activation."""
    return {v: k for k, v in GATED_FAMILIES.items()}[gate]


@activation_ffn("Wg", "bg", "Wu", "bu", activation="silu", kind="gated_ffn", name="a gated FFN")
class GatedFFN(ActivationFFN):
    """``f(x) = W2 [σ(Wg x + bg) ⊙ (Wu x + bu)] + b2`` with ``Wg, Wu ∈ R^{m×d}``, ``W2 ∈ R^{K×m}`` (the
    ``nn.Linear`` layout of ``gate_proj``, ``up_proj``, ``down_proj``) and σ the gate activation (a
    :data:`~attnprobe.models.smooth_ffn.ACTIVATIONS` name: ``silu`` for SwiGLU, ``gelu``/``gelu_tanh`` for GeGLU).

    As an oracle it reads length-1 sequences ``(B, 1, d)`` and answers ``(B, K)``; ``dtype`` is the precision the
    forward pass is computed in."""

    @property
    def family(self) -> str:
        return family_name(self.activation)

    @staticmethod
    def unknowns(d: int, m: int, outputs: int, bias: bool = True) -> int:
        """Numbers the function fixes: each neuron's gate ``(g, bg)`` and ``w2 (u, bu)ᵀ`` less its one free scale,
        and ``b2``."""
        return m * d + m * (d + outputs - 1) + ((2 * m + outputs) if bias else 0)

    def hidden(self, x: np.ndarray) -> np.ndarray:
        """The gated hidden units ``σ(Wg x + bg) ⊙ (Wu x + bu)`` for inputs (B, d), in float64."""
        return ACTIVATIONS[self.activation].f(x @ self.Wg.T + self.bg) * (x @ self.Wu.T + self.bu)

    def hidden_in(self, x: np.ndarray, dt: np.dtype) -> np.ndarray:
        """The gated hidden units computed in precision ``dt`` (``x`` already in it)."""
        gate, up = affine_in(x, self.Wg, self.bg, dt), affine_in(x, self.Wu, self.bu, dt)
        return (ACTIVATIONS[self.activation].f(gate.astype(np.float64)).astype(dt) * up).astype(dt)


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
