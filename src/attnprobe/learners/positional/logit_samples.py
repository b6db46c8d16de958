"""The logit stage's samples (docs/positional.md, "The coarse route"): each head's log-weight ``log α/α₀`` of keys
at chosen offsets against a zero key, solved in the heads' coordinates from one answer, and how much a least-squares
fit may trust it. Shared by the bias-free logit maps (:mod:`.coarse`) and those with q/k biases (:mod:`.coarse_bias`).
"""

from __future__ import annotations

import numpy as np

#: the key offsets of the logit sequences (the first is the reference of the rotation's equations; far ones tell
#: the low frequencies apart)
LOGIT_OFFSETS = (-1, -2, -3, -5, -8, -16, -32, -64, -128)
#: random sequences per entry of a head's reduced logit matrix ``M(δ)`` (d_h² entries per offset)
SAMPLES_PER_ENTRY = 2
#: alternating least-squares rounds that refine the logit maps on every sample
ALS_ROUNDS = 12


def log_weights(oracle, Cb, G, c, toks, offs, span: int):
    """Each head's log-weights against a zero key for sequences of zeros (length ``span + 1``) holding the keys
    ``toks[:, :-1]`` at the offsets ``offs (B, T)`` and the query ``toks[:, -1]`` last: the weights solved in each
    head's coordinates (B, H, T+1), NaN where a solved weight is not positive (rounding)."""
    count, T1, d = toks.shape
    H, dh, K = G.shape[0], G.shape[1], Cb.shape[0]
    N = span + 1
    Pc = np.linalg.pinv(Cb).reshape(H, dh, K)
    X = np.zeros((count, N, d))
    np.put_along_axis(X, (N - 1 + offs)[:, :, None], toks[:, :-1], axis=1)
    X[:, -1] = toks[:, -1]
    Y = np.asarray(oracle(X), dtype=np.float64) - c
    coords = np.einsum("hjk,bk->bhj", Pc, Y)
    A = np.einsum("hjd,bnd->bhjn", G, toks)
    alpha = np.einsum("bhnj,bhj->bhn", np.linalg.pinv(A), coords)
    zero = (1 - alpha.sum(axis=2, keepdims=True)) / (N - T1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ell = np.log(alpha / zero)
    ell[~np.isfinite(ell)] = np.nan
    return ell


def reliability(ell: np.ndarray) -> np.ndarray:
    """The least-squares weight of a log-weight ``ℓ = log α/α₀``: a weight solved to an absolute error reads
    ``log α`` to that error over ``α``, so a key far below a zero key's weight (``ℓ < 0``) counts ``e^ℓ`` (rounding
    measured: median 7e-5, but up to 3e-3 at keys weighing a tenth of a zero key, float32 at d = 32)."""
    return np.minimum(1.0, np.exp(np.minimum(ell, 0.0)))


def kept_offsets(offsets, dh: int, least: int = 1) -> tuple:
    """The key offsets a logit sequence can hold for heads of ``d_h`` coordinates: the weights of its keys, the query
    and the zeros are solved in those coordinates, so past ``d_h − 2`` offsets only the first ``max(least, d_h − 3)``
    and the farthest are kept (``least``: 1 bias-free, 2 with q/k biases, whose fits difference two keys)."""
    offsets = tuple(offsets)
    if len(offsets) + 2 > dh:
        offsets = offsets[:max(least, dh - 3)] + offsets[-1:]
    return offsets

