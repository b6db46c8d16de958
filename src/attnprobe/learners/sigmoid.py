"""Two-row probes and the sigmoid inversion at the heart of Thm 4.1 (eq. 1)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: A weight whose distance to 0 or 1 is below this many units of answer rounding counts as saturated.
SATURATION_ULPS = 4.0


@dataclass
class Logits:
    """Inverted attention logits ``aᵀ(W b + u)`` with a mask of probes whose weight saturated."""

    values: np.ndarray
    saturated: np.ndarray
    noise: np.ndarray  # first-order logit error from one rounding of each answer
    outside: np.ndarray | None = None  # answer outside [y0, y1] beyond rounding: not a convex combination


def two_row_queries(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Queries ``[(a + b); b]`` for every row ``a`` of ``A``: shape (len(A), 2, d)."""
    X = np.empty((A.shape[0], 2, A.shape[1]))
    X[:, 0, :] = A + b
    X[:, 1, :] = b  # broadcasts a shared b
    return X


def invert_two_row(y: np.ndarray, y0: np.ndarray, y1: np.ndarray, eps: float, size0=None,
                   size1=None) -> Logits:
    """Logits from answers ``y = α y1 + (1 − α) y0``, ``α = σ(logit)``.

    ``y0 = c + bᵀv`` and ``y1 = c + (a+b)ᵀv`` are the values at the two positions. Both ``α`` and ``1 − α``
    are formed from differences of answers, so either side of the sigmoid is resolved to the answers' precision.
    A weight within ``SATURATION_ULPS`` roundings of 0 or 1 carries no usable logit and is flagged; an answer
    beyond that on the wrong side of ``y0`` or ``y1`` is no convex combination at all and is flagged ``outside``.
    ``size0``, ``size1`` (default ``|y0|``, ``|y1|``) are the sizes their rounding scales with (the sizes of the
    terms they are computed from, which can far exceed the values when the terms cancel): ``outside`` needs an
    answer beyond that rounding.
    """
    delta = y1 - y0
    with np.errstate(divide="ignore", invalid="ignore"):
        p = (y - y0) / delta
        q = (y1 - y) / delta
        floor = SATURATION_ULPS * eps * (np.abs(y0) + np.abs(y1) + np.abs(y)) / np.abs(delta)
        saturated = ~((p > floor) & (q > floor))
        # outside only beyond what the rounding of every term explains (a weight near 0 or 1 whose y0 or y1 was
        # computed from large cancelling terms is saturated, not outside: asked again at a smaller scale)
        size0 = np.abs(y0) if size0 is None else np.maximum(size0, np.abs(y0))
        size1 = np.abs(y1) if size1 is None else np.maximum(size1, np.abs(y1))
        wide = SATURATION_ULPS * eps * (size0 + size1 + np.abs(y)) / np.abs(delta)
        outside = (p < -wide) | (q < -wide) | ~np.isfinite(p)
        logits = np.where(saturated, np.nan, np.log(np.where(saturated, 1.0, p)) - np.log(np.where(saturated, 1.0, q)))
        noise = eps * (np.abs(y0) + np.abs(y1) + np.abs(y)) / np.abs(delta * p * q)
    return Logits(logits, saturated, np.where(saturated, np.inf, noise), outside)


def measure_logits(oracle, A: np.ndarray, b: np.ndarray, v: np.ndarray, c: float) -> Logits:
    """Ask the length-two queries ``[(a+b); b]`` for all rows of ``A`` and invert the sigmoid.

    ``b`` is one vector shared by all probes or one row per probe; ``v``, ``c`` are the learner's estimates.
    """
    y = oracle(two_row_queries(A, b))
    y0 = np.broadcast_to(c + b @ v, y.shape)
    y1 = c + (A + b) @ v
    # how large the rounding of y0, y1 can be: each v_i learned from an answer c + v_i is off by ~eps(|v_i| + |c|),
    # and a sum of terms rounds with the size of its terms, not of its (possibly cancelling) value
    per_entry = np.abs(v) + abs(c)
    size0 = np.broadcast_to(abs(c) + np.abs(b) @ per_entry, y.shape)
    size1 = abs(c) + np.abs(A + b) @ per_entry
    return invert_two_row(y, y0, y1, oracle.eps, size0, size1)
