"""Answer precision: the dtype a deployed model computes in, its machine epsilon and its unit roundoff.

Two numbers, one meaning each (Higham's convention): the *machine epsilon* ``ε`` of a format is the gap between
1 and the next number (2**-52 for float64); its *unit roundoff* ``u = ε/2`` bounds the relative error of one
rounding to nearest. Answer wrappers state the relative error they add (a unit roundoff); an oracle's rounding
floor ``Oracle.eps`` is a machine epsilon.
"""

from __future__ import annotations

import functools

import numpy as np

from attnprobe.errors import ConfigError

PRECISIONS = ("float64", "float32", "float16", "bfloat16")


def resolve_dtype(name: str | np.dtype) -> np.dtype:
    """Numpy dtype for a precision name; bfloat16 comes from the maintained ``ml_dtypes`` package."""
    key = str(np.dtype(name)) if not isinstance(name, str) else name.lower()
    if key == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigError("bfloat16 needs the ml_dtypes package: pip install 'attnprobe[precision]'",
                              param="dtype") from exc
        return np.dtype(ml_dtypes.bfloat16)
    if key not in PRECISIONS:
        raise ConfigError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}", param="dtype")
    return np.dtype(key)


def finfo(name: str | np.dtype):
    """``np.finfo`` of a precision; bfloat16 (not a numpy floating type) through ``ml_dtypes.finfo``."""
    dt = resolve_dtype(name)
    if dt.name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(dt)
    return np.finfo(dt)


def machine_epsilon(name: str | np.dtype) -> float:
    """Gap between 1 and the next number of a precision (2**-52 for float64, 2**-23 for float32, 2**-7 for
    bfloat16, ...)."""
    if isinstance(name, (str, np.dtype)):  # read for every answer batch (Oracle.eps): remembered
        return _machine_epsilon(name)
    return float(finfo(name).eps)


@functools.lru_cache(maxsize=64)
def _machine_epsilon(name: str | np.dtype) -> float:
    return float(finfo(name).eps)


def unit_roundoff(name: str | np.dtype) -> float:
    """Largest relative error of one rounding to nearest in a precision: half its machine epsilon (2**-53 for
    float64, 2**-24 for float32, 2**-8 for bfloat16, ...)."""
    return machine_epsilon(name) / 2.0


def precision_name(dtype) -> str | None:
    """The precision name of a dtype-like value (``"float32"``, ``np.float32``, ``torch.float32``), or None when
    it names none of :data:`PRECISIONS`."""
    if dtype is None:
        return None
    name = str(dtype).lower().removeprefix("torch.")
    if name not in PRECISIONS:
        try:
            name = str(np.dtype(dtype))
        except TypeError:
            return None
    return name if name in PRECISIONS else None


def coarser(a: str, b: str | None) -> str:
    """The coarser of two precisions (the larger machine epsilon; ``a`` on a tie or when ``b`` is None)."""
    if b is None or b == a:
        return a
    return b if machine_epsilon(b) > machine_epsilon(a) else a
