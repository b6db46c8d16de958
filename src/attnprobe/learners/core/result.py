"""The result every learner returns: recovered model, exact query counts, time and a functional check."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from attnprobe.learners.core.check import CheckResult


@runtime_checkable
class RecoveredModel(Protocol):
    """What a learner returns as its model (every class of :mod:`attnprobe.models` is one): its ``kind`` (the
    registry of saved model kinds), its width ``d``, its forward map and its arrays under their parameter names."""

    kind: str
    d: int

    def __call__(self, X: np.ndarray) -> np.ndarray: ...

    def arrays(self) -> dict: ...


@dataclass
class Extraction:
    """What a learner recovered and what it cost.

    ``queries`` counts the extraction's own oracle queries (calibration and retries included) and
    ``queries_by_phase`` splits them by the phase that asked them (the values sum to ``queries``);
    ``check`` holds the functional check on fresh sequences (a
    :class:`~attnprobe.learners.core.check.CheckResult`, or None when it was not run), whose queries are counted
    separately. A failed check does not raise: ``check.passed`` is False and a note says so.
    """

    method: str
    model: RecoveredModel
    queries: int
    unknowns: int
    seconds: float
    check: CheckResult | None = None
    details: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    queries_by_phase: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool | None:
        """Whether the functional check passed (None when no check was run)."""
        return None if self.check is None else bool(self.check.passed)

    @property
    def d(self) -> int:
        return self.model.d

    def summary(self) -> dict:
        """JSON-ready summary (OUT.json: method, kind, d, queries, seconds, passed, check, ...)."""
        return jsonable({
            "method": self.method,
            "kind": self.model.kind,
            "d": self.d,
            "queries": self.queries,
            "unknowns": self.unknowns,
            "queries_per_unknown": self.queries / self.unknowns if self.unknowns else None,
            "seconds": self.seconds,
            "queries_by_phase": self.queries_by_phase,
            "passed": self.passed,
            "check": self.check.to_dict() if self.check is not None else {},
            "details": self.details,
            "notes": self.notes,
        })

    def save(self, out: str | Path) -> tuple[Path, Path]:
        """Write the recovered arrays to ``out`` (.npz, under the model's parameter names) and ``out.json``,
        atomically and the JSON last (:func:`attnprobe.models.io.write_files`)."""
        from attnprobe.models.io import json_writer, model_writer, npz_path, write_files

        npz = npz_path(out)
        js = npz.with_suffix(".json")
        positions = self.details.get("positions")  # the victim answered every row: so does the saved model
        write_files([(npz, model_writer(self.model, positions)), (js, json_writer(self.summary()))])
        return npz, js


def jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj
