"""Functional check: compare a recovered model with the oracle on fresh random sequences (one typed result)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DEFAULT_LENGTHS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class CheckResult:
    """The one check result every learner reports: ``passed`` is True only when ``error <= tolerance``.

    ``error`` is the relative error of the recovered model's answers on ``queries`` fresh sequences;
    ``tolerance`` is the largest error a correct model can show at the answers' precision and declared noise.
    Readable as a mapping too (``check["passed"]``, ``check["relative_error"]``) for JSON and older code.
    """

    passed: bool
    error: float
    tolerance: float
    queries: int
    lengths: tuple[int, ...] = ()
    per_length: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    _ALIASES = {"relative_error": "error"}

    def to_dict(self) -> dict:
        out = {"passed": self.passed, "relative_error": self.error, "tolerance": self.tolerance,
               "queries": self.queries, "lengths": list(self.lengths), "per_length": dict(self.per_length)}
        out.update(self.extra)
        return out

    def __getitem__(self, key: str):
        return self.to_dict()[key]

    def get(self, key: str, default=None):
        return self.to_dict().get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.to_dict()


def check_queries(lengths=DEFAULT_LENGTHS, per_length: int = 8) -> int:
    return len(lengths) * per_length


def functional_check(oracle, model, rng: np.random.Generator, lengths=DEFAULT_LENGTHS, per_length: int = 8,
                     scale: float = 1.0, input_fn=None) -> CheckResult:
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
        per[int(N)] = float(np.sqrt(e2 / n2) if n2 > 0 else np.sqrt(e2))
        num += e2
        den += n2
    rel = float(np.sqrt(num / den) if den > 0 else np.sqrt(num))
    tolerance = check_tolerance(oracle, np.sqrt(den / max(1, len(lengths) * per_length)))
    return CheckResult(passed=bool(rel <= tolerance), error=rel, tolerance=float(tolerance),
                       queries=oracle.queries - before, lengths=tuple(map(int, lengths)), per_length=per,
                       extra={"per_length_count": per_length})


def check_tolerance(oracle, rms_answer: float) -> float:
    """Largest relative check error a correct model can show: ``max(1e-6, 1e5·eps)`` for exact answers, plus
    100x the relative size of the noise the oracle declares (``Oracle.noise``)."""
    noise = oracle.noise
    tol = max(1e-6, 1e5 * oracle.eps, 1e5 * noise.rel_eps)
    if rms_answer > 0:
        tol = max(tol, 100 * (noise.tolerance + 3 * noise.sigma) / rms_answer)
    return tol
