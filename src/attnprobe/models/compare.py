"""Comparing parameter sets: the one relative-error formula used by the CLI, tests and benchmarks."""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError


def relative_error(estimate, truth) -> float:
    """``‖x̂ − x‖ / ‖x‖`` (Frobenius), or the absolute error ``‖x̂‖`` when ``x = 0``."""
    a, b = np.asarray(estimate, dtype=float), np.asarray(truth, dtype=float)
    if a.shape != b.shape:
        raise ConfigError(f"cannot compare arrays of shapes {a.shape} and {b.shape}", param="estimate")
    n = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / n) if n > 0 else float(np.linalg.norm(a))


def relative_errors(true_model, result_model) -> dict[str, float]:
    """Per-parameter :func:`relative_error` of every array the two models share."""
    t, r = true_model.arrays(), result_model.arrays()
    out = {}
    for name in t:
        if name not in r:
            continue
        if np.shape(r[name]) != np.shape(t[name]):
            raise ConfigError(f"parameter {name} has shape {np.shape(r[name])} in the result but "
                              f"{np.shape(t[name])} in the target", param=name)
        out[name] = relative_error(r[name], t[name])
    return out
