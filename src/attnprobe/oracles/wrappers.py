"""Composable answer wrappers that simulate imperfect or defended APIs around any oracle callable.

Each wrapper takes a callable ``fn(X) -> y`` (``X`` of shape (B, N, d)) and is one, so they stack:
``Membership(Rounded(BoundedNoise(head, 1e-3), decimals=4))``. Each states what it does to the answers
(``tolerance``: absolute error bound; ``rel_eps``: relative rounding; ``sigma``: fresh noise level) and its
``noise`` adds these to the inner callable's (:mod:`attnprobe.oracles.noise`), so ``Oracle.noise`` knows the
whole chain's noise floor.

- :class:`BoundedNoise` — the paper's approximate value oracle AVQ(X; τ) (Sec. 6): deterministic, |error| ≤ τ.
- :class:`AdversarialNoise` — AVQ whose ±τ error is chosen against sigmoid inversion (Thm 6.1's worst case).
- :class:`FreshNoise` — new Gaussian/uniform noise on every call (repetition helps).
- :class:`Rounded` — rounding to k decimals or k significant digits.
- :class:`Precision` — inputs and answers cast to float32/float16/bfloat16 (ml_dtypes).
- :class:`Membership` — ``1 if f(X) > 0 else 0`` (App. B, eq. 8).
- :class:`ClipInputs` — every input row of norm above R scaled down to norm R (a layer that bounds its inputs).

A chain of them is described, built and named by :class:`attnprobe.oracles.chain.AnswerChain`.
"""

from __future__ import annotations

import math
import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.precision import coarser, precision_name, resolve_dtype, unit_roundoff
from attnprobe.oracles.noise import AnswerNoise, noise_of

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised over uint64 arrays (wraps modulo 2**64)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def input_hash(X: np.ndarray, seed: int = 0) -> np.ndarray:
    """A deterministic 64-bit hash per sequence of the batch (Zobrist style: xor of mixed words).

    Equal sequences (as float64, with -0.0 folded into 0.0) get equal hashes whatever batch they come in.
    """
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float64) + 0.0)
    B = X.shape[0]
    words = X.reshape(B, -1).view(np.uint64)
    L = words.shape[1]
    with np.errstate(over="ignore"):
        keys = _mix64(np.arange(1, L + 1, dtype=np.uint64) * _GOLDEN + np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
        h = np.bitwise_xor.reduce(_mix64(words ^ keys[None, :]), axis=1)
        h = _mix64(h ^ (np.uint64(L) * _GOLDEN))
    return h


def hash_uniform(X: np.ndarray, seed: int = 0) -> np.ndarray:
    """Deterministic pseudo-uniform numbers in [-1, 1) per sequence, from :func:`input_hash`."""
    u = (input_hash(X, seed) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return 2.0 * u - 1.0


class Wrapper:
    """Base of the answer wrappers: keeps the inner callable and its width ``d``."""

    tolerance = 0.0
    rel_eps = 0.0
    sigma = 0.0

    def __init__(self, fn):
        if not callable(fn):
            raise ConfigError(f"a wrapper needs a callable oracle (B,N,d)->(B,); got {type(fn).__name__}", param="fn")
        self.inner = fn
        d = getattr(fn, "d", None)
        if d is not None:
            self.d = d

    def _raw(self, X) -> np.ndarray:
        return np.asarray(self.inner(X), dtype=np.float64)

    @property
    def answer_precision(self) -> str | None:
        """The precision the answers carry, as the inner callable declares it (:func:`declared_precision`)."""
        return declared_precision(self.inner)

    @property
    def noise(self) -> AnswerNoise:
        """This wrapper's own noise added to its inner callable's."""
        own = AnswerNoise(self.tolerance, self.rel_eps, self.sigma, isinstance(self, Membership),
                          isinstance(self, FreshNoise))
        return noise_of(self.inner) + own

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


#: how many wrappers deep :func:`declared_attribute` looks (a chain is a handful of stages)
WRAP_DEPTH = 16


def declared_attribute(fn, name: str, accept=None):
    """The attribute ``name`` that the callable ``fn``, or the first callable it wraps (through ``.inner``, up to
    :data:`WRAP_DEPTH` deep) that has one, declares: what a model says about itself (its rows, its position
    term, why its precision is coarser than its dtype) stays readable behind an answer chain. ``accept``: the
    values taken (default: any but None); None when no callable declares one."""
    for _ in range(WRAP_DEPTH):
        if fn is None:
            break
        value = getattr(fn, name, None)
        if value is not None and (accept is None or accept(value)):
            return value
        fn = getattr(fn, "inner", None)
    return None


def declared_precision(fn) -> str | None:
    """The precision a callable says its answers carry: an answer wrapper's ``answer_precision``, else a model's
    (or torch adapter's) ``dtype``; None for a callable that says nothing."""
    if isinstance(fn, Wrapper):
        return fn.answer_precision
    declared = getattr(fn, "answer_precision", None)
    if isinstance(declared, str):
        return precision_name(declared)
    return precision_name(getattr(fn, "dtype", None))


def _check_level(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name} must be a finite number >= 0; got {value}", param=name)
    return value


class BoundedNoise(Wrapper):
    """AVQ(X; τ) of Sec. 6: ``f(X) + τ·ξ(X)`` with ``ξ(X) ∈ [-1, 1)`` a hash of the input bytes.

    Deterministic (the same sequence always gets the same answer, so repeating a query does not help) and
    ``|answer − f(X)| ≤ τ``: exactly the oracle Thm 6.1 assumes.
    """

    def __init__(self, fn, tau: float, seed: int = 0):
        super().__init__(fn)
        self.tolerance = _check_level("the tolerance τ", tau)
        self.seed = int(seed)

    def __call__(self, X):
        return self._raw(X) + self.tolerance * hash_uniform(X, self.seed)


class AdversarialNoise(Wrapper):
    """A deterministic AVQ(X; τ) that spends its ±τ where sigmoid inversion suffers most.

    For a sequence, the exact answer is a convex combination ``Σ α_i (x_iᵀv + c)`` of the per-row values
    ``f([x_i])``; the adversary moves the answer by τ towards the nearer end of their range, so the implied
    attention weights look more saturated than they are. Length-1 answers are pulled towards 0 by τ, which
    shrinks the value estimates every learner divides by (the ``1/v̂_i`` factor of eq. 6). The per-row values
    are computed by asking the wrapped function itself (the defender knows its model); those internal calls
    are not oracle queries.
    """

    def __init__(self, fn, tau: float):
        super().__init__(fn)
        self.tolerance = _check_level("the tolerance τ", tau)

    def __call__(self, X):
        X = np.asarray(X, dtype=np.float64)
        y = self._raw(X)
        B, N, d = X.shape
        if N == 1:
            return y - self.tolerance * np.sign(y)
        rows = self._raw(X.reshape(B * N, 1, d)).reshape(B, N)
        lo, hi = rows.min(axis=1), rows.max(axis=1)
        toward = np.where(y - lo < hi - y, -1.0, 1.0)
        return y + self.tolerance * toward


class FreshNoise(Wrapper):
    """Fresh noise on every call: Gaussian with standard deviation σ or uniform on [-σ, σ]."""

    KINDS = ("gaussian", "uniform")

    def __init__(self, fn, sigma: float, kind: str = "gaussian", seed: int | np.random.Generator = 0):
        super().__init__(fn)
        if kind not in self.KINDS:
            raise ConfigError(f"unknown fresh-noise kind {kind!r}; choose gaussian or uniform", param="kind")
        self.sigma = _check_level("the noise level σ", sigma)
        self.kind = kind
        if kind == "uniform":
            self.tolerance = self.sigma
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def __call__(self, X):
        y = self._raw(X)
        if self.kind == "gaussian":
            return y + self.sigma * self.rng.standard_normal(y.shape)
        return y + self.sigma * self.rng.uniform(-1.0, 1.0, y.shape)


#: float64 holds 17 significant digits, and 10**±308 is the widest power of ten it holds
MAX_DIGITS, MAX_DECIMALS = 17, 308


class Rounded(Wrapper):
    """Answers rounded to ``decimals`` places or to ``digits`` significant digits (exactly one of them)."""

    def __init__(self, fn, decimals: int | None = None, digits: int | None = None):
        super().__init__(fn)
        if (decimals is None) == (digits is None):
            raise ConfigError("give exactly one of decimals (places after the point) or digits (significant)",
                              param="decimals")
        if digits is not None and not 1 <= int(digits) <= MAX_DIGITS:
            raise ConfigError(f"The 'digits' parameter (significant digits) must be between 1 and {MAX_DIGITS} "
                              f"(float64 answers carry at most {MAX_DIGITS}); got {digits}", param="digits")
        if decimals is not None and not -MAX_DECIMALS <= int(decimals) <= MAX_DECIMALS:
            raise ConfigError(f"The 'decimals' parameter must be between -{MAX_DECIMALS} and {MAX_DECIMALS}; "
                              f"got {decimals}", param="decimals")
        self.decimals = None if decimals is None else int(decimals)
        self.digits = None if digits is None else int(digits)
        if self.decimals is not None:
            self.tolerance = 0.5 * 10.0 ** (-self.decimals)
        else:
            self.rel_eps = 0.5 * 10.0 ** (1 - self.digits)

    def __call__(self, X):
        y = self._raw(X)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if self.decimals is not None:
                r = np.round(y, self.decimals)
            else:
                mag = np.floor(np.log10(np.abs(y)))
                mag = np.where(np.isfinite(mag), mag, 0.0)
                scale = 10.0 ** (self.digits - 1 - mag)
                r = np.round(y * scale) / scale
        # where scaling overflowed, the rounding is finer than float64 itself: the answer is already rounded
        return np.where(np.isfinite(r), r, y)


class Precision(Wrapper):
    """Inputs (unless ``inputs=False``) and answers rounded to ``dtype`` (float32, float16, bfloat16).

    This emulates a deployed model that receives and returns numbers in a low precision; the model's inner
    arithmetic is whatever the wrapped callable does (use ``AttentionHead(..., dtype=...)`` to emulate that
    too). bfloat16 comes from ``ml_dtypes``.
    """

    def __init__(self, fn, dtype: str, inputs: bool = True):
        super().__init__(fn)
        self.dtype = resolve_dtype(dtype)
        self.name = str(dtype)
        self.inputs = bool(inputs)
        self.rel_eps = unit_roundoff(dtype)

    @property
    def answer_precision(self) -> str:
        """The cast, or the inner callable's precision where that is coarser."""
        return coarser(self.dtype.name, declared_precision(self.inner))

    def __call__(self, X):
        X = np.asarray(X, dtype=np.float64)
        with np.errstate(over="ignore"):  # overflow to inf is what the emulated precision does; the Oracle refuses it
            if self.inputs:
                X = X.astype(self.dtype).astype(np.float64)
            return self._raw(X).astype(self.dtype).astype(np.float64)


class Membership(Wrapper):
    """Membership queries (App. B, eq. 8): ``1 if f(X) > 0 else 0``."""

    def __call__(self, X):
        return (self._raw(X) > 0).astype(np.float64)


class ClipInputs(Wrapper):
    """Every input row of Euclidean norm above ``radius`` scaled down to norm ``radius`` before the callable sees
    it, as a deployed layer that bounds (normalises or clamps) its inputs does. The answers are exact answers
    of the clipped inputs: no noise is added, but probes larger than ``radius`` no longer scale."""

    def __init__(self, fn, radius: float):
        super().__init__(fn)
        radius = _check_level("the input-row bound R", radius)
        if radius == 0:
            raise ConfigError("the input-row bound R must be > 0 (R = 0 would answer every query with f(0))",
                              param="radius")
        self.radius = radius

    def __call__(self, X):
        X = np.asarray(X, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            norms = np.linalg.norm(X, axis=-1, keepdims=True)
            shrink = np.where(norms > self.radius, self.radius / np.where(norms > 0, norms, 1.0), 1.0)
        return self._raw(X * shrink)


#: the kinds of answer noise: AVQ's bounded noise, its adversarial version, fresh Gaussian or uniform noise
NOISE_KINDS = ("avq", "adversarial", "gaussian", "uniform")
