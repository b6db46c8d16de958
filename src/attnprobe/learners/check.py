"""Functional check: compare a recovered model with the oracle on fresh random sequences."""

from __future__ import annotations

import time

import numpy as np

DEFAULT_LENGTHS = (1, 2, 4, 8, 16)


def check_queries(lengths=DEFAULT_LENGTHS, per_length: int = 8) -> int:
    return len(lengths) * per_length


def functional_check(oracle, model, rng: np.random.Generator, lengths=DEFAULT_LENGTHS, per_length: int = 8,
                     scale: float = 1.0, input_fn=None) -> dict:
    """Relative error ``‖f̂(X) − f(X)‖ / ‖f(X)‖`` on fresh Gaussian sequences of each length.

    ``input_fn(N, count, rng)`` may supply the sequences (e.g. inputs a target sees in practice); the default
    draws rows with i.i.d. N(0, scale²) entries. Costs ``len(lengths) * per_length`` oracle queries.
    ``passed`` is False when the error exceeds what the answers' precision and declared noise explain
    (:func:`check_tolerance`): then the recovered model does not describe the oracle (wrong model class, ...).
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
    tolerance = check_tolerance(oracle, np.sqrt(den / max(1, len(lengths) * per_length)))
    return {"relative_error": float(rel), "per_length": per, "lengths": list(map(int, lengths)),
            "per_length_count": per_length, "queries": oracle.queries - before,
            "tolerance": tolerance, "passed": bool(rel <= tolerance)}


def check_tolerance(oracle, rms_answer: float) -> float:
    """Largest relative check error a correct model can show: ``max(1e-6, 1e5·eps)`` for exact answers, plus
    100x the relative size of the noise the oracle's wrappers declare (``oracles.wrappers.answer_noise``)."""
    from attnprobe.oracles.wrappers import answer_noise

    noise = answer_noise(oracle)
    tol = max(1e-6, 1e5 * oracle.eps, 1e5 * noise.rel_eps)
    if rms_answer > 0:
        tol = max(tol, 100 * (noise.tolerance + 3 * noise.sigma) / rms_answer)
    return tol


def finish(result, oracle, rng, check: bool, lengths=DEFAULT_LENGTHS, t0: float | None = None, hint: str = ""):
    """Attach the functional check (with a note when it fails, ending in ``hint``) and the elapsed seconds."""
    if check:
        result.check = functional_check(oracle, result.model, rng, lengths)
        if not result.check["passed"]:
            result.notes.append(
                f"functional check FAILED (relative error {result.check['relative_error']:.2e} > "
                f"{result.check['tolerance']:.1e}): the recovered model does not describe the oracle{hint}")
    if t0 is not None:
        result.seconds = time.perf_counter() - t0
    return result
