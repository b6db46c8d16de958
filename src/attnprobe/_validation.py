"""One validation layer (scikit-learn's ``check_scalar`` in spirit): every check names the parameter it checks.

Library messages name parameters (``"The 'rank' parameter must be an integer >= 1; got 0"``); only the CLI
maps parameter names to flags (``ConfigError.param``).
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable

import numpy as np

from attnprobe.errors import ConfigError


def check_int(value, name: str, *, min_value: int | None = None, max_value: int | None = None,
              allow_none: bool = False) -> int | None:
    """``value`` as an ``int`` within ``[min_value, max_value]`` (8 or 8.0; not 8.7, NaN, inf, True or "8")."""
    if value is None and allow_none:
        return None
    whole = isinstance(value, numbers.Integral) or (isinstance(value, numbers.Real) and math.isfinite(value)
                                                    and float(value).is_integer())
    if isinstance(value, (bool, np.bool_)) or not whole:
        raise ConfigError(f"The {name!r} parameter must be a whole number; got {value!r} "
                          f"({type(value).__name__})", param=name)
    value = int(value)
    _check_range(value, name, min_value, max_value, "an integer")
    return value


def check_float(value, name: str, *, min_value: float | None = None, max_value: float | None = None,
                allow_none: bool = False, strict_min: bool = False) -> float | None:
    """``value`` as a finite ``float`` within the bounds (``strict_min``: ``> min_value``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"The {name!r} parameter must be a real number; got {value!r} ({type(value).__name__})",
                          param=name)
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"The {name!r} parameter must be finite; got {value}", param=name)
    if strict_min and min_value is not None and value <= min_value:
        raise ConfigError(f"The {name!r} parameter must be a number > {min_value:g}; got {value:g}", param=name)
    _check_range(value, name, min_value, max_value, "a number")
    return value


def _check_range(value, name, lo, hi, what) -> None:
    if lo is not None and value < lo or hi is not None and value > hi:
        bounds = (f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]")
        raise ConfigError(f"The {name!r} parameter must be {what} {bounds}; got {value}", param=name)


def check_option(value, name: str, options: Iterable) -> object:
    """``value`` must be one of ``options`` (exact match; no silent fallback)."""
    options = tuple(options)
    if value not in options:
        raise ConfigError(f"The {name!r} parameter must be one of {', '.join(map(repr, options))}; got {value!r}",
                          param=name)
    return value


def check_seed(seed, name: str = "seed") -> int:
    """A seed for ``numpy.random.default_rng``: a non-negative integer."""
    return check_int(seed, name, min_value=0)


def as_batch(X, d: int) -> np.ndarray:
    """Check that ``X`` is a real batch of sequences of shape (B, N>=1, d) and return it as float64."""
    arr = np.asarray(X)
    if np.iscomplexobj(arr):
        raise ConfigError(f"queries must be real numbers; got complex values of shape {arr.shape}", param="X")
    try:
        arr = arr.astype(np.float64, copy=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"queries must be numbers; got an array of {arr.dtype}", param="X") from exc
    if arr.ndim != 3 or arr.shape[2] != d or arr.shape[1] < 1:
        raise ConfigError(f"queries must have shape (B, N>=1, {d}); got {arr.shape}", param="X")
    return arr


def length_one_rows(X, d: int, what: str) -> np.ndarray:
    """The rows ``(B, d)`` of a batch ``X`` of length-1 sequences ``(B, 1, d)`` (Sec. 4.1's queries of an FFN):
    ``what`` (e.g. "a ReLU network") answers no longer ones."""
    X = as_batch(X, d)
    if X.shape[1] != 1:
        raise ConfigError(f"{what} answers length-1 queries only; got sequences of length {X.shape[1]}", param="X")
    return X[:, 0, :]


def real_array(name: str, x, ndim: int | None = None) -> np.ndarray:
    """``x`` as a float64 array, refusing what a silent conversion would corrupt: strings, objects and complex
    numbers (their imaginary part would be dropped), a number of dimensions other than ``ndim`` (no silent
    reshape) and non-finite entries."""
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if a.dtype.kind not in "biuf":
        raise ConfigError(f"{name} must hold real numbers; got {a.dtype} values", param=name)
    if ndim is not None and a.ndim != ndim:
        want = {0: "a scalar", 1: "a vector"}.get(ndim, f"a {ndim}-d array")
        raise ConfigError(f"{name} must be {want}; got shape {a.shape}", param=name)
    a = np.array(a, dtype=np.float64)
    if not np.isfinite(a).all():
        raise ConfigError(f"{name} must be finite; it holds inf or NaN", param=name)
    return a
