"""Answer precision: the dtype a deployed model computes in, and its unit roundoff."""

from __future__ import annotations

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
            raise ConfigError("bfloat16 needs the ml_dtypes package: pip install 'attnprobe[precision]'") from exc
        return np.dtype(ml_dtypes.bfloat16)
    if key not in PRECISIONS:
        raise ConfigError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
    return np.dtype(key)


def finfo(name: str | np.dtype):
    """``np.finfo`` of a precision; bfloat16 (not a numpy floating type) through ``ml_dtypes.finfo``."""
    dt = resolve_dtype(name)
    if dt.name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(dt)
    return np.finfo(dt)


def unit_roundoff(name: str | np.dtype) -> float:
    """Machine epsilon of a precision (2**-52 for float64, 2**-23 for float32, 2**-7 for bfloat16, ...)."""
    return float(finfo(name).eps)
