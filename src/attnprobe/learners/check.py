"""Functional check: compare a recovered model with the oracle on fresh random sequences."""

from __future__ import annotations

import numpy as np

DEFAULT_LENGTHS = (1, 2, 4, 8, 16)


def check_queries(lengths=DEFAULT_LENGTHS, per_length: int = 8) -> int:
    return len(lengths) * per_length


def functional_check(oracle, model, rng: np.random.Generator, lengths=DEFAULT_LENGTHS, per_length: int = 8,
                     scale: float = 1.0, input_fn=None) -> dict:
    """Relative error ``‖f̂(X) − f(X)‖ / ‖f(X)‖`` on fresh Gaussian sequences of each length.

    ``input_fn(N, count, rng)`` may supply the sequences (e.g. inputs a target sees in practice); the default
    draws rows with i.i.d. N(0, scale²) entries. Costs ``len(lengths) * per_length`` oracle queries.
    ``passed`` is False when the error exceeds what the answers' precision explains (``max(1e-6, 1e5·eps)``):
    then the recovered model does not describe the oracle (wrong model class, biases, rank, ...).
    """
    d = oracle.d
    before = oracle.queries
    per = {}
    num = den = 0.0
    for N in lengths:
        X = input_fn(N, per_length, rng) if input_fn else scale * rng.standard_normal((per_length, N, d))
        y = oracle(X)
        yh = np.asarray(model(X), dtype=np.float64)
        e2, n2 = float(np.sum((yh - y) ** 2)), float(np.sum(y ** 2))
        per[int(N)] = np.sqrt(e2 / n2) if n2 > 0 else np.sqrt(e2)
        num += e2
        den += n2
    rel = np.sqrt(num / den) if den > 0 else np.sqrt(num)
    tolerance = max(1e-6, 1e5 * oracle.eps)
    return {"relative_error": float(rel), "per_length": per, "lengths": list(map(int, lengths)),
            "per_length_count": per_length, "queries": oracle.queries - before,
            "tolerance": tolerance, "passed": bool(rel <= tolerance)}
