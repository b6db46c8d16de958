"""Read the answers' precision from the answers themselves (``precision="auto"``).

A deployed model that computes in float32 (or float16, bfloat16) returns numbers that survive a round trip
through that format unchanged; a float64 computation almost never does (a random double is a float32 with
probability 2**-29). An API that rounds to K significant decimal digits returns numbers whose shortest
decimal form has at most K digits. :class:`PrecisionDetector` watches every answer and keeps the coarsest
description that all of them satisfy; the unit roundoff it reports sets every threshold that depends on
precision (rank detection, rank certificate, functional-check tolerance, probe scales).

Answers that are integers (e.g. 0/1 membership answers, or exact zeros) carry no evidence and are skipped.

A float64 module whose kernel rounds an intermediate (LLaMA-family eager attention and BLOOM compute the softmax
in float32, then go on in float64) returns full float64 numbers that are nonetheless only float32-accurate. The
bits cannot show it; smoothness does: along a short line ``X₀ + tD`` an attention layer is analytic, so a
degree-4 polynomial in ``t`` fits float64 answers to ~1e-15 of their size, while answers rounded inside jitter
around it at that format's roundoff. :func:`kernel_jitter` measures it (:data:`SMOOTH_POINTS` × :data:`SMOOTH_LINES`
queries, asked once by an attention learner that reads whole output rows — ``Oracle.read_kernel_rounding`` — and
only when the bits say float64) and the verdict becomes the format the jitter fits.
"""

from __future__ import annotations

import numpy as np

from attnprobe.models.precision import machine_epsilon, resolve_dtype

#: binary formats from the coarsest: (name, significand bits incl. the implicit one, fewest bits the answers must
#: reach before the verdict is believed: a model computing in that format gives answers whose significands use
#: about all its bits, while answers that are short binary fractions by construction (0.5, 0.75) say nothing)
BINARY_FORMATS = (("bfloat16", 8, 6), ("float16", 11, 9), ("float32", 24, 20))
#: fewest non-integer answers before decimal rounding to K significant digits is believed
MIN_EVIDENCE = 8
#: answers of at most this many significant digits count as decimally rounded (a random double needs 15-17)
MAX_ROUNDED_DIGITS = 12
#: answers asked when precision is needed before any answer was seen (seeded Gaussian length-1 sequences)
PROBE_QUERIES = 8
#: the smoothness probe: lines of sequences (length 3), points per line, half-width of t, degree of the fit
SMOOTH_LINES, SMOOTH_POINTS, SMOOTH_STEP, SMOOTH_DEGREE = 3, 17, 1e-6, 4
#: relative jitter above which float64-looking answers were rounded inside (float64 fits leave ~1e-15)
SMOOTH_JITTER = 1e-11


def smoothness_batch(d: int, seed: int = 0) -> np.ndarray:
    """The smoothness probe: ``SMOOTH_LINES`` lines ``X₀ + tD`` of ``SMOOTH_POINTS`` length-3 sequences each."""
    rng = np.random.default_rng([seed, 1])
    X0, D = rng.standard_normal((2, SMOOTH_LINES, 1, 3, d))
    t = np.linspace(-SMOOTH_STEP, SMOOTH_STEP, SMOOTH_POINTS)[None, :, None, None]
    return (X0 + t * D).reshape(SMOOTH_LINES * SMOOTH_POINTS, 3, d)


def kernel_jitter(y: np.ndarray) -> float:
    """The answers' relative deviation from a degree-``SMOOTH_DEGREE`` polynomial along each probe line
    (:func:`smoothness_batch`); ~1e-15 for a float64 computation, the roundoff of a coarser intermediate else."""
    Y = np.asarray(y, dtype=np.float64).reshape(SMOOTH_LINES, SMOOTH_POINTS, -1)
    t = np.linspace(-1.0, 1.0, SMOOTH_POINTS)
    V = np.vander(t, SMOOTH_DEGREE + 1)
    worst = 0.0
    for line in Y:
        resid = line - V @ np.linalg.lstsq(V, line, rcond=None)[0]
        worst = max(worst, float(np.abs(resid).max() / max(np.abs(line).max(), 1e-300)))
    return worst


def significant_bits(y: np.ndarray) -> np.ndarray:
    """Per answer: bits of its float64 significand in use (1 for 0.5 or 3.0, 24 at most for a float32 value)."""
    y = np.ascontiguousarray(np.asarray(y, dtype=np.float64).ravel())
    m = (y.view(np.uint64) & np.uint64((1 << 52) - 1)) | np.uint64(1 << 52)
    low = m & (~m + np.uint64(1))  # lowest set bit
    return 53 - np.log2(low.astype(np.float64)).astype(np.int64)


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
        ok = np.array([float(f"{x:.{k - 1}e}") for x in vals]) == vals
        out[idx[ok]] = k
        todo[idx[ok]] = False
    return out


class PrecisionDetector:
    """Accumulates evidence from answers and names the coarsest precision they are all consistent with.

    A binary format F is the verdict when every answer round-trips through F and the answers use nearly all of
    F's significand bits (so they are not merely short fractions); more than 24 bits in any answer means
    float64 computation, or decimal rounding to K ≤ 12 significant digits when at least ``MIN_EVIDENCE``
    answers all have at most K digits (``precision`` is then ``"K digits"`` and ``eps = 10**(1-K)``, so the
    relative rounding error is ``≤ eps/2`` as for binary formats). Until the evidence decides (``decided``),
    the verdict is float64, the finest: nothing coarse is assumed without proof.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self.seen = 0
        self.max_bits = 0
        self.fits = {name: True for name, _, _ in BINARY_FORMATS}
        self.max_digits = 0
        self.probed = False
        #: the smoothness probe's relative jitter (None: not measured) and the format it says the kernel rounds to
        self.jitter: float | None = None
        self.rounded_inside: str | None = None

    def probe_batch(self, d: int) -> np.ndarray:
        return np.random.default_rng(self.seed).standard_normal((PROBE_QUERIES, 1, d))

    def observe(self, y: np.ndarray) -> None:
        y = np.asarray(y, dtype=np.float64).ravel()
        y = y[np.isfinite(y) & (y != np.round(y))]
        if y.size == 0:
            return
        self.seen += int(y.size)
        self.max_bits = max(self.max_bits, int(significant_bits(y).max()))
        for name, ok in self.fits.items():
            if ok:
                self.fits[name] = bool(round_trips(y, name).all())
        if self.max_bits > 24 and self.max_digits <= MAX_ROUNDED_DIGITS:
            sample = y[:256]  # digit counting is a Python loop; a sample keeps it cheap on big batches
            self.max_digits = max(self.max_digits, int(significant_digits(sample).max()))

    @property
    def needs_smoothness(self) -> bool:
        """The bits say float64 and the smoothness probe has not been asked yet."""
        return self.jitter is None and self._verdict() == "float64"

    def observe_smoothness(self, y: np.ndarray) -> None:
        """Take the answers to :func:`smoothness_batch`: jitter above :data:`SMOOTH_JITTER` means the kernel
        rounds inside to the coarsest binary format whose unit roundoff covers it."""
        self.jitter = kernel_jitter(y)
        if self.jitter > SMOOTH_JITTER:
            fits = [name for name, bits, _ in reversed(BINARY_FORMATS) if self.jitter <= 2.0 ** (6 - bits)]
            self.rounded_inside = fits[0] if fits else BINARY_FORMATS[0][0]

    def _verdict(self) -> str | None:
        if self.seen == 0:
            return None
        if self.max_bits > 24:
            if self.max_digits > MAX_ROUNDED_DIGITS:
                return self.rounded_inside or "float64"
            return f"{self.max_digits} digits" if self.seen >= MIN_EVIDENCE else None
        for name, bits, needed in BINARY_FORMATS:
            if self.fits[name] and needed <= self.max_bits <= bits:
                return name
        return None

    @property
    def decided(self) -> bool:
        return self._verdict() is not None

    @property
    def precision(self) -> str:
        return self._verdict() or "float64"

    @property
    def dtype_name(self) -> str:
        """The binary format whose range bounds the answers (float64 for decimal rounding)."""
        p = self.precision
        return p if p in {name for name, _, _ in BINARY_FORMATS} else "float64"

    @property
    def eps(self) -> float:
        p = self.precision
        if p.endswith("digits"):
            return 10.0 ** (1 - int(p.split()[0]))
        return machine_epsilon(p)

    def describe(self) -> dict:
        """What the summary reports: the verdict, its unit roundoff and the evidence behind it."""
        out = {"precision": self.precision, "eps": self.eps, "decided": self.decided, "answers_seen": self.seen,
               "max_significand_bits": self.max_bits}
        if self.jitter is not None:
            out["kernel_jitter"] = self.jitter
            if self.rounded_inside:
                out["rounded_inside"] = (f"float64 answers computed through {self.rounded_inside} (e.g. a float32 "
                                         "softmax)")
        return out
