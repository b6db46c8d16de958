"""Errors of a recovered model against the truth (which tests, benchmarks and the auditor have; learners not)."""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError


def relative_error(a, b) -> float:
    """``‖a − b‖ / ‖b‖`` (the absolute error ``‖a‖`` where ``b = 0``)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / n) if n > 0 else float(np.linalg.norm(a))


def relative_errors(true_model, result_model) -> dict[str, float]:
    """Per-parameter relative error of ``result_model`` against ``true_model`` (parameters both have)."""
    t, r = true_model.arrays(), result_model.arrays()
    out = {}
    for name in t:
        if name not in r:
            continue
        if np.shape(r[name]) != np.shape(t[name]):
            raise ConfigError(f"parameter {name} has shape {np.shape(r[name])} in the result but "
                              f"{np.shape(t[name])} in the target")
        out[name] = relative_error(r[name], t[name])
    return out
