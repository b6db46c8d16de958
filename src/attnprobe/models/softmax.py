"""Numerically stable softmax pieces shared by the forward maps."""

from __future__ import annotations

import numpy as np


def softmax_last(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, shifted by the max so it never overflows; keeps the dtype."""
    shifted = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)
