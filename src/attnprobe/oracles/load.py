"""Build oracles from what a user points at: a ``MODULE:ATTR`` callable or a saved model file."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from attnprobe.errors import ConfigError, OracleError
from attnprobe.models.io import load_model
from attnprobe.oracles.base import Oracle


def load_callable(spec: str):
    """Import ``MODULE:ATTR`` (the current directory is importable); ATTR may be dotted."""
    if ":" not in spec:
        raise ConfigError(f"--oracle must look like MODULE:ATTR (e.g. victims:head); got {spec!r}")
    module_name, attr = spec.split(":", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:
        raise OracleError(f"cannot import module {module_name!r} for --oracle {spec}: "
                          f"{type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise OracleError(f"module {module_name!r} has no attribute {attr!r} (from --oracle {spec})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise OracleError(f"{spec} is a {type(obj).__name__}, not a callable; it must map (B, N, d) -> (B,)")
    return obj


def oracle_from_spec(spec: str, d: int | None, **kwargs) -> Oracle:
    fn = load_callable(spec)
    d = d if d is not None else getattr(fn, "d", None)
    if d is None:
        raise ConfigError(f"give the width with --d: {spec} does not say its d")
    return Oracle(fn, int(d), name=spec, **kwargs)


def oracle_from_file(path: str | Path, dtype: str = "float64", **kwargs) -> Oracle:
    """An oracle answering with a saved model computed in ``dtype`` (its answers' precision)."""
    model = load_model(path, dtype=dtype)
    kwargs.setdefault("precision", dtype)
    return Oracle(model, model.d, name=Path(path).name, **kwargs)
