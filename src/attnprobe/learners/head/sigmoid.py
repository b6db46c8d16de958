"""Two-row probes and the sigmoid inversion at the heart of Thm 4.1 (eq. 1), with a pluggable error model.

A length-2 query ``[(a + b); b]`` answers ``y = α y1 + (1 − α) y0`` with ``α = σ(aᵀW b + aᵀu)`` and the position
values ``y0 = c + bᵀv``, ``y1 = c + (a+b)ᵀv``. :func:`invert_two_row` turns answers into logits once for every
learner; what differs between learners is how wrong an answer may be, the *error model*:

- :class:`RoundingError` — answers rounded at relative spacing ``eps`` (``Oracle.eps``): exact, low-rank,
  nuclear and multi-head learners (Thm 4.1).
- :class:`AdditiveError` — ``|error| ≤ τ + eps·|y|`` per answer, the AVQ oracle of Sec. 6: the robust learner.

The model gives the error of ``α`` (``spread / |y1 − y0|``) and how many of those errors away from 0 and 1 a
weight must be to count as resolved (``saturation``).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

import numpy as np

def sigmoid_inverse(p):
    """``σ⁻¹(p) = log p − log(1 − p)``, the logit of an attention weight (eq. 1), as every learner has computed it
    (``scipy.special.logit`` rounds differently in the last bits, which would change recovered parameters)."""
    return np.log(p) - np.log1p(-p)


#: A weight whose distance to 0 or 1 is below this many units of answer rounding counts as saturated.
SATURATION_ULPS = 4.0
#: ... and this many units of its error bound under additive noise (Sec. 6)
SATURATION_NOISE = 2.0


@dataclass(frozen=True)
class RoundingError:
    """Answers rounded at relative spacing ``eps``: one rounding of each of ``y``, ``y0``, ``y1``."""

    eps: float
    saturation: float = SATURATION_ULPS

    def spread(self, y, y0, y1):
        """Absolute error of ``y − y0`` and ``y1 − y`` (``y0``, ``y1`` may be the sizes they are computed from)."""
        return self.eps * (np.abs(y0) + np.abs(y1) + np.abs(y))


@dataclass(frozen=True)
class AdditiveError:
    """``|answer − f| ≤ τ + eps·|f|`` (Sec. 6's AVQ(X; τ) on answers rounded at ``eps``); the position values
    ``y0``, ``y1`` are estimates of about half that error each."""

    tau: float
    eps: float
    saturation: float = SATURATION_NOISE

    def __call__(self, y):
        """The error bound of answers ``y``."""
        return self.tau + self.eps * np.abs(y)

    def spread(self, y, y0, y1):
        return self(y) + 0.5 * (self(y0) + self(y1))


@dataclass
class Logits:
    """Inverted attention logits ``aᵀ(W b + u)``: ``values`` (NaN where the weight saturated), the mask
    ``saturated``, ``noise`` (first-order logit error, inf where saturated), ``outside`` (answers no convex
    combination can give), and what they come from: the weights ``p = α``, ``q = 1 − α``, the error ``err`` of
    α, and ``raw`` (the logit wherever ``0 < α < 1``, saturated or not)."""

    values: np.ndarray
    saturated: np.ndarray
    noise: np.ndarray
    outside: np.ndarray
    p: np.ndarray
    q: np.ndarray
    err: np.ndarray
    raw: np.ndarray
    floor: np.ndarray

    @property
    def beyond(self) -> np.ndarray:
        """A lower bound on ``|logit|`` where the weight saturated (``α`` or ``1 − α`` within ``floor``, off by at
        most its error): ``log(1 / 2·floor)``, at least 0. Shrinking such a probe by ``beyond / target`` cannot
        take its logit below the target."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.saturated, np.maximum(0.0, -np.log(2.0 * self.floor)), 0.0)


def two_row_queries(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Queries ``[(a + b); b]`` for every row ``a`` of ``A``: shape (len(A), 2, d)."""
    X = np.empty((A.shape[0], 2, A.shape[1]))
    X[:, 0, :] = A + b
    X[:, 1, :] = b  # broadcasts a shared b
    return X


def invert_two_row(y: np.ndarray, y0: np.ndarray, y1: np.ndarray, error, size0=None, size1=None,
                   clip: bool = False, *, sizes=None) -> Logits:
    """Logits from answers ``y = α y1 + (1 − α) y0``, ``α = σ(logit)``, under the error model ``error``.

    Both ``α`` and ``1 − α`` are formed from differences of answers, so either side of the sigmoid is resolved
    to the answers' precision. A weight within ``error.saturation`` errors of 0 or 1 carries no usable logit and
    is flagged; an answer beyond that on the wrong side of ``y0`` or ``y1`` is no convex combination at all and
    is flagged ``outside``. ``size0``, ``size1`` (default ``|y0|``, ``|y1|``) are the sizes the error of the
    values scales with (the sizes of the terms they are computed from, which can far exceed the values when the
    terms cancel): ``outside`` needs an answer beyond that. ``sizes(at)`` may give them instead, for the answers
    ``at`` (indices into a 1-d ``y``) alone: only an answer beyond ``y0`` or ``y1`` needs them, and most have
    none. ``clip``: a last resort for weights the error keeps
    unresolved: α is clipped into ``[e, 1 − e]`` (``e`` its own error, as Thm 6.1 clips into
    ``[σ(−½), σ(½)]``) before ``raw`` is formed.
    """
    delta = y1 - y0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        p = (y - y0) / delta
        q = (y1 - y) / delta
        spread = error.spread(y, y0, y1)
        err = spread / np.abs(delta)
        floor = error.saturation * spread / np.abs(delta)
        saturated = ~((p > floor) & (q > floor))
        # outside only beyond what the error of every term explains (a weight near 0 or 1 whose y0 or y1 was
        # computed from large cancelling terms is saturated, not outside: asked again at a smaller scale); the
        # margin is never negative, so only an answer beyond y0 or y1 (p < 0 or q < 0) can be outside
        outside = ~np.isfinite(p)
        beyond = (p < 0) | (q < 0)
        if sizes is not None and beyond.any():
            at = np.flatnonzero(beyond)
            s0, s1 = sizes(at)
            wide = error.saturation * error.spread(y[at], np.maximum(s0, np.abs(y0[at])),
                                                   np.maximum(s1, np.abs(y1[at]))) / np.abs(delta[at])
            outside[at] |= (p[at] < -wide) | (q[at] < -wide)
        elif beyond.any():
            size0 = np.abs(y0) if size0 is None else np.maximum(size0, np.abs(y0))
            size1 = np.abs(y1) if size1 is None else np.maximum(size1, np.abs(y1))
            wide = error.saturation * error.spread(y, size0, size1) / np.abs(delta)
            outside |= (p < -wide) | (q < -wide)
        logits = np.where(saturated, np.nan, np.log(np.where(saturated, 1.0, p)) - np.log(np.where(saturated, 1.0, q)))
        noise = spread / np.abs(delta * p * q)
        if clip:
            e = np.clip(err, 1e-12, 0.25)
            p = np.clip(p, e, 1 - e)
            q = 1 - p
        inside = (p > 0) & (q > 0)
        raw = np.where(inside, np.log(np.where(inside, p, 1.0)) - np.log(np.where(inside, q, 1.0)), np.nan)
    return Logits(logits, saturated, np.where(saturated, np.inf, noise), outside, p, q, err, raw, floor)


#: rows of a query block handled together while building it (their temporaries stay in cache)
CHUNK = 128


class QueryMemory:
    """Memory for query blocks, reused from one block to the next: fresh pages for every block cost the kernel
    more time than writing the queries into them. The memory is handed out again only when nothing else holds
    it (the previous block, a view of it, answers computed as a view of it, an oracle that kept its queries), so
    no query an oracle was given ever changes afterwards. Safe to share between threads (one hand-out at a time);
    a block larger than ``keep`` floats is never kept."""

    def __init__(self, keep: int | None = None) -> None:
        self._mem: np.ndarray | None = None
        self._keep = keep
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised float64 array of ``shape``."""
        size = int(np.prod(shape))
        if self._keep is not None and size > self._keep:
            return np.empty(shape)
        with self._lock:
            # references to the memory: this object's, the call's argument, and nothing else when it is free
            if self._mem is None or self._mem.size < size or sys.getrefcount(self._mem) > 2:
                self._mem = np.empty(size)
            return self._mem[:size].reshape(shape)


#: the process's query memory, shared by every extraction (one learner after another, or a sweep over many heads,
#: does not fault in fresh pages for each run): at most :data:`SHARED_KEEP` floats (64 MiB) are kept
SHARED_KEEP = 2**23
SHARED_QUERY_MEMORY = QueryMemory(keep=SHARED_KEEP)


def grid_queries(A: np.ndarray, scales, Bs: np.ndarray, ell: np.ndarray | None, j: np.ndarray | None, v: np.ndarray,
                 c: float, *, memory: QueryMemory | None = None) -> tuple[np.ndarray, tuple]:
    """Queries ``[(s·a_ℓ + b_j); b_j]`` for the pairs ``(ℓ[i], j[i])`` (``s = scales[i]``) and what the sigmoid
    inversion of their answers needs (:func:`answer_logits`): the position values ``y0``, ``y1`` and, for the
    few answers that need them, the sizes of their terms. Built a chunk of rows at a time: the same numbers as
    :func:`two_row_queries` of ``A[ℓ] * s`` and ``Bs[j]`` without block-sized temporaries.

    ``ell = j = None`` asks the whole grid, ℓ-major (every probe against every row of ``Bs``), at one scale
    ``scales``: written by one broadcast sum, without gathering rows, and its position values from the k + m
    values of the rows of ``Bs`` and of the probes (``y1 = (s·a)ᵀv + bᵀv``, equal to the value of the summed row
    up to its rounding). ``memory`` holds the queries when given (:class:`QueryMemory`)."""
    full = ell is None
    m, k, d = A.shape[0], Bs.shape[0], A.shape[1]
    n = m * k if full else len(ell)
    X = np.empty((n, 2, d)) if memory is None else memory.empty((n, 2, d))
    y0, y1 = np.empty(n), np.empty(n)
    if full:  # grid[ℓ, j] = pairs[j] + probes[ℓ]: [b_j; b_j] + [s·a_ℓ; −0] (x + −0 is x, signed zeros too)
        pairs, probes = np.stack([Bs, Bs], axis=1), np.empty((m, 1, 2, d))
        np.multiply(A, float(scales), out=probes[:, 0, 0, :])
        probes[:, 0, 1, :] = -0.0
        np.add(pairs[None], probes, out=X.reshape(m, k, 2, d))
        # the values of the k rows of Bs and of the m probes, once each: y1 = (s·a_ℓ)ᵀv + b_jᵀv
        yb = Bs @ v
        y0.reshape(m, k)[:] = yb
        np.add((probes[:, 0, 0, :] @ v)[:, None], yb, out=y1.reshape(m, k))
    for i in range(0, 0 if full else n, CHUNK):
        rows = slice(i, min(n, i + CHUNK))
        ab, b = X[rows, 0, :], X[rows, 1, :]
        np.multiply(A[ell[rows]], scales[rows, None], out=ab)
        np.take(Bs, j[rows], axis=0, out=b)
        ab += b
        np.matmul(b, v, out=y0[rows])
        np.matmul(ab, v, out=y1[rows])
    y0 += c
    y1 += c

    def sizes(at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sizes of the terms ``y0``, ``y1`` of the queries ``at`` are computed from: each v_i learned from an
        answer c + v_i is off by ~eps(|v_i| + |c|), and a sum rounds with the size of its terms, not of its
        (possibly cancelling) value (rebuilt from the probes: an oracle may have changed its queries)."""
        la, ja = divmod(at, k) if full else (ell[at], j[at])
        s = np.full(len(at), float(scales)) if full else scales[at]
        b = Bs[ja]
        per_entry = np.abs(v) + abs(c)
        sa = A[la] * s[:, None]
        # the whole grid's y1 is a sum of two values, each rounding with the size of its own terms
        terms = np.abs(sa) + np.abs(b) if full else np.abs(sa + b)
        return abs(c) + np.abs(b) @ per_entry, abs(c) + terms @ per_entry

    return X, (y0, y1, sizes)


def measure_logits(oracle, A: np.ndarray, b: np.ndarray, v: np.ndarray, c: float, error=None) -> Logits:
    """Ask the length-two queries ``[(a+b); b]`` for all rows of ``A`` and invert the sigmoid.

    ``b`` is one vector shared by all probes or one row per probe; ``v``, ``c`` are the learner's estimates;
    ``error`` the error model (default: the answers' rounding, ``RoundingError(oracle.eps)``).
    """
    y = oracle(two_row_queries(A, b))
    y0 = np.broadcast_to(c + b @ v, y.shape)
    y1 = c + (A + b) @ v
    # how large the rounding of y0, y1 can be: each v_i learned from an answer c + v_i is off by ~eps(|v_i| + |c|),
    # and a sum of terms rounds with the size of its terms, not of its (possibly cancelling) value
    per_entry = np.abs(v) + abs(c)
    size0 = np.broadcast_to(abs(c) + np.abs(b) @ per_entry, y.shape)
    size1 = abs(c) + np.abs(A + b) @ per_entry
    return invert_two_row(y, y0, y1, RoundingError(oracle.eps) if error is None else error, size0, size1)


def answer_logits(oracle, X: np.ndarray, expected: tuple, error=None) -> Logits:
    """:func:`measure_logits` for queries built by :func:`grid_queries` (``expected``: its second value)."""
    y = oracle(X)
    y0, y1, sizes = expected
    return invert_two_row(y, y0, y1, RoundingError(oracle.eps) if error is None else error, sizes=sizes)
