"""Read the answers' precision from the answers themselves (``precision="auto"``).

A deployed model that computes in float32 (or float16, bfloat16) returns numbers that survive a round trip
through that format unchanged; a float64 computation almost never does (a random double is a float32 with
probability 2**-29). An API that rounds to K significant decimal digits returns numbers whose shortest
decimal form has at most K digits. :class:`PrecisionDetector` watches every answer and keeps the coarsest
description that all of them satisfy; the unit roundoff it reports sets every threshold that depends on
precision (rank detection, rank certificate, functional-check tolerance, probe scales).

Answers that are integers (e.g. 0/1 membership answers, or exact zeros) carry no evidence and are skipped.
"""

from __future__ import annotations

import numpy as np

from attnprobe.models.precision import resolve_dtype, unit_roundoff

#: binary formats tried from the coarsest; the first that every answer round-trips through wins
BINARY_FORMATS = ("bfloat16", "float16", "float32")
#: fewest non-integer answers before a verdict coarser than float64 is believed
MIN_EVIDENCE = 8
#: answers of at most this many significant digits count as decimally rounded (a random double needs 15-17)
MAX_ROUNDED_DIGITS = 12


def round_trips(y: np.ndarray, fmt: str) -> np.ndarray:
    """Per answer: is it exactly representable in ``fmt`` (float32, float16, bfloat16)?"""
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        back = y.astype(resolve_dtype(fmt)).astype(np.float64)
    return back == y


def significant_digits(y: np.ndarray) -> np.ndarray:
    """Per answer: the fewest significant decimal digits that reproduce it exactly (1..17)."""
    y = np.asarray(y, dtype=np.float64).ravel()
    out = np.full(y.shape, 17, dtype=np.int64)
    todo = np.ones(y.shape, dtype=bool)
    for k in range(1, 18):
        if not todo.any():
            break
        idx = np.flatnonzero(todo)
        vals = y[idx]
        back = np.array([float(f"{x:.{k - 1}e}") for x in vals])
        ok = back == vals
        out[idx[ok]] = k
        todo[idx[ok]] = False
    return out


class PrecisionDetector:
    """Accumulates evidence from answers and names the coarsest precision they are all consistent with.

    ``precision`` is one of ``float64, float32, float16, bfloat16`` or ``"K digits"`` (decimal rounding to K
    significant digits); ``eps`` is its unit roundoff (``10**(1-K)`` for K digits, so that the relative
    rounding error ``≤ eps/2`` as for binary formats). Until ``MIN_EVIDENCE`` non-integer answers have been
    seen the verdict is float64 (the finest, so nothing is assumed).
    """

    def __init__(self) -> None:
        self.seen = 0
        self.formats = {fmt: True for fmt in BINARY_FORMATS}
        self.max_digits = 0

    def observe(self, y: np.ndarray) -> None:
        y = np.asarray(y, dtype=np.float64).ravel()
        y = y[np.isfinite(y) & (y != np.round(y))]
        if y.size == 0:
            return
        self.seen += int(y.size)
        for fmt, ok in self.formats.items():
            if ok:
                self.formats[fmt] = bool(round_trips(y, fmt).all())
        if self.max_digits <= MAX_ROUNDED_DIGITS:
            sample = y[:256]  # digit counting is a Python loop; a sample keeps it cheap on big batches
            self.max_digits = max(self.max_digits, int(significant_digits(sample).max()))

    @property
    def decided(self) -> bool:
        return self.seen >= MIN_EVIDENCE

    @property
    def precision(self) -> str:
        if not self.decided:
            return "float64"
        for fmt in BINARY_FORMATS:
            if self.formats[fmt]:
                return fmt
        if self.max_digits <= MAX_ROUNDED_DIGITS:
            return f"{self.max_digits} digits"
        return "float64"

    @property
    def dtype_name(self) -> str:
        """The binary format whose range bounds the answers (float64 for decimal rounding)."""
        p = self.precision
        return p if p in BINARY_FORMATS else "float64"

    @property
    def eps(self) -> float:
        p = self.precision
        if p.endswith("digits"):
            return 10.0 ** (1 - int(p.split()[0]))
        return unit_roundoff(p)

    def describe(self) -> dict:
        return {"precision": self.precision, "eps": self.eps, "evidence": self.seen, "decided": self.decided}
