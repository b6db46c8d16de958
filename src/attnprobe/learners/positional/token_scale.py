"""The tokens' scale for small logits: a RoPE layer seen on tokens scaled by ``s``.

Attention is homogeneous in its tokens up to its biases: ``f(sX)/s`` is the same layer with ``W_Q``, ``W_K`` times
``s`` (bias-free logits ``s²`` larger), the same value maps ``V_h``, the same query and key biases and the value
and output biases over ``s`` (the output's constant ``c/s``). The coarse route's probes are calibrated for
logits of order one at tokens of norm ``√d`` (random-init layers at ``1/√d`` weights: median ``|logit|`` 0.6 … 0.7
at d = 32); a layer at smaller weights (``transformers``' default ``initializer_range = 0.02`` at d = 32: ~0.01)
leaves the attention nearly uniform there, its heads do not separate at float32's rounding, and the route failed
its check after 250k queries. Its logits' size is read first from two-token sequences and ``M = Σ_h V_h``:

    y − c − M (x₁ + x₂)/2 = Σ_h (α_h − ½) V_h (x₁ − x₂),   α_h − ½ ≈ Δℓ_h / 4,

so ``‖y − c − M(x₁+x₂)/2‖ / ‖M(x₁−x₂)/2‖ ≈ |Δℓ|/2`` for small logit differences ``Δℓ``; the route then runs on
:class:`ScaledTokens` and :func:`unscale` maps its result back.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

#: the median logit difference the coarse route is calibrated for (random-init layers at 1/√d weights, d = 32)
CALIBRATED_LOGIT = 0.6
#: below this median logit difference at tokens of norm √d the tokens are scaled up to :data:`CALIBRATED_LOGIT`
SMALL_LOGIT = 0.1
#: the largest scale-up (logits 10⁶ times larger): a layer flatter than that has no attention to read
MAX_SCALE = 1e3
#: two-token sequences in the logits' size probe
PAIRS = 32


class ScaledTokens:
    """The oracle seen on tokens scaled by ``s``: ``f_s(X) = f(sX)/s`` (module docstring); everything else
    (``d``, the query count, phases, the log) is the oracle's own."""

    def __init__(self, oracle, s: float) -> None:
        self._oracle, self.s = oracle, float(s)

    def __call__(self, X):
        return np.asarray(self._oracle(np.asarray(X, dtype=np.float64) * self.s), dtype=np.float64) / self.s

    def __getattr__(self, name):
        return getattr(self._oracle, name)


def pair_sequences(rng: np.random.Generator, d: int, rho: float) -> np.ndarray:
    """:data:`PAIRS` random two-token sequences ``(PAIRS, 2, d)``, every token of norm ``rho``."""
    X = rng.standard_normal((PAIRS, 2, d))
    return X * (rho / np.linalg.norm(X, axis=2, keepdims=True))


def logit_difference(oracle, M: np.ndarray, c, X: np.ndarray) -> float:
    """The median ``|Δℓ|`` between the two tokens of the sequences ``X`` (:func:`pair_sequences`) read at their
    last rows (module docstring: ``2 ‖y − c − M(x₁+x₂)/2‖ / ‖M(x₁−x₂)/2‖``)."""
    y = np.asarray(oracle(X), dtype=np.float64)
    mean, half = (X[:, 0] + X[:, 1]) / 2 @ M.T, (X[:, 0] - X[:, 1]) / 2 @ M.T
    ratio = np.linalg.norm(y - c - mean, axis=1) / np.maximum(np.linalg.norm(half, axis=1), 1e-300)
    return float(2 * np.median(ratio))


def token_scale(oracle, M: np.ndarray, c: np.ndarray, rng: np.random.Generator, rho: float) -> tuple[float, float]:
    """``(s, Δℓ)``: the tokens' scale-up (1 unless the median logit difference ``Δℓ`` at norm ``rho`` is below
    :data:`SMALL_LOGIT`; then ``√(CALIBRATED_LOGIT/Δℓ)``, at most :data:`MAX_SCALE`) and what was read."""
    delta = logit_difference(oracle, M, c, pair_sequences(rng, oracle.d, rho))
    if delta >= SMALL_LOGIT:
        return 1.0, delta
    return float(min(math.sqrt(CALIBRATED_LOGIT / max(delta, 1e-300)), MAX_SCALE)), delta


def unscale(model, s: float):
    """The layer a route learned on :class:`ScaledTokens` (``s``), for the oracle itself: ``W_Q``, ``W_K`` over
    ``s`` (logits ``s²`` smaller), the value and output biases times ``s``; the query and key biases as they are
    (``(sW_Q x + b_Q)ᵀ R (sW_K x + b_K)`` is the scaled layer's logit with the same biases)."""
    if s == 1.0:
        return model
    return dataclasses.replace(model, Wq=model.Wq / s, Wk=model.Wk / s, bv=model.bv * s, bo=model.bo * s)
