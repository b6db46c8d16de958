"""RoPE layers with q/k/v biases (Qwen2, GPT-NeoX) behind a neutral key (docs/positional.md).

Under RoPE a key bias does not cancel in the softmax (``qᵀR(δ)b_K`` depends on the offset), so the zero-key pair
probe has no rank-H gap. A *neutral key* ``x₀`` (``W_K,g x₀ + b_K,g = 0`` in every group) removes it: on inputs
``u = x − x₀`` the keys are ``W_K u``, the value bias becomes a constant of the output (the weights sum to one),
and the query carries the bias ``b' = W_Q x₀ + b_Q``, which the RoPE route reads with ``query_bias``
(:func:`~.rope.extract_positional`). The model learned on ``u`` is the layer's on ``x`` with every projection's
bias moved by ``−W x₀`` (:func:`shifted_back`). A wrong ``x₀`` leaves a key bias, and the pair probe refuses it.

``x₀`` is an argument here (finding it from the answers costs ~18,000 sequences per Gauss–Newton step at d = 32:
docs/positional.md); the positional method reads such layers through the kernel of the value maps instead
(:func:`~.rope.extract_positional` with ``key_bias``).
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError, RecoveryError
from attnprobe.learners.positional.bias_rows import shifted_back
from attnprobe.learners.positional.rope import extract_positional
from attnprobe.oracles.subspace import shift_inputs

__all__ = ["extract_neutral", "shifted_back"]


def extract_neutral(oracle, x0, *, heads=None, seed=0, check=True, progress=None, walk=None):
    """The RoPE route on the tokens shifted by the neutral key ``x0`` (module docstring), the model shifted back.
    The check runs on the shifted answers: ``f(x) = f'(x − x₀)`` exactly, so its error is the layer's."""
    x0 = np.asarray(x0, dtype=np.float64)
    if x0.shape != (oracle.d,) or not np.all(np.isfinite(x0)):
        raise ConfigError(f"the neutral key must be a finite vector of length d = {oracle.d}; got shape {x0.shape}",
                          param="neutral_key")
    shifted = shift_inputs(oracle, x0, name="shifted by a neutral key")  # the parent's noise and precision kept
    kw = {} if walk is None else {"walk": walk}
    try:
        res = extract_positional(shifted, heads=heads, seed=seed, check=check, progress=progress, query_bias=True,
                                 **kw)
    except RecoveryError as exc:
        raise RecoveryError(f"behind the key x₀ the layer is not RoPE with a query bias alone; x₀ is not a neutral "
                            f"key (W_K x₀ + b_K ≠ 0) or the layer is not RoPE: {exc}") from exc
    res.model = shifted_back(res.model, x0)
    res.details["neutral_key_norm"] = float(np.linalg.norm(x0))
    res.notes.append(f"tokens shifted by a neutral key (norm {np.linalg.norm(x0):.2f}): the key bias removed, the "
                     "query bias read from ±z")
    return res
