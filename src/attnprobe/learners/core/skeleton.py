"""The one skeleton every learner runs on: seed, timer, progress, an up-front budget check, queries charged to
named phases, and the functional check with one failure semantics.

    run = Run(oracle, "exact", seed=seed, check=check, progress=progress)
    run.plan(n, "exact extraction at d=16")          # refuses before the first query if n + check won't fit
    with run.phase("values"):
        y = oracle(X)                               # charged to "values"
    return run.finish(model, unknowns=..., details=..., notes=...)

The Extraction's ``queries_by_phase`` sums to its ``queries`` (the check's queries are counted apart, in
``check.queries``); ``check`` is a :class:`~attnprobe.learners.core.check.CheckResult`. A failed check does not raise:
the result comes back with ``check.passed = False`` and a note (the CLI turns it into exit code 3).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from attnprobe._validation import check_seed
from attnprobe.learners.core.check import DEFAULT_LENGTHS, CheckResult, check_queries, functional_check
from attnprobe.learners.core.oracle import LearnerOracle
from attnprobe.learners.core.result import Extraction, RecoveredModel


def _no_progress(done: int, total: int) -> None:
    return None


class Run:
    """One extraction in progress on ``oracle`` (see the module docstring)."""

    def __init__(self, oracle: LearnerOracle, method: str, *, seed=0, check: bool = True, check_lengths=DEFAULT_LENGTHS,
                 check_per_length: int = 8, progress: Callable[[int, int], None] | None = None,
                 tolerance: float | None = None, asked_before: dict[str, int] | None = None,
                 scalar: bool = False) -> None:
        self.oracle = oracle
        self.method = method
        self.seed = check_seed(seed) if not isinstance(seed, (list, tuple)) else seed
        self.rng = np.random.default_rng(self.seed)
        self.check = bool(check)
        self.check_lengths = tuple(check_lengths)
        self.check_per_length = int(check_per_length)
        self.progress = progress or _no_progress
        #: an additive error bound τ the caller declares for the answers: the check allows it too (never less
        #: than the answer chain declares)
        self.tolerance = tolerance
        self.planned: int | None = None
        self.t0 = time.perf_counter()
        #: queries this extraction asked before its run started, by phase (a dispatcher's probe, or a learner
        #: that failed before this one took over): counted in :attr:`queries` and :meth:`queries_by_phase`
        self.asked_before = {k: int(v) for k, v in (asked_before or {}).items() if v}
        self.start = oracle.queries - sum(self.asked_before.values())
        self._phase_start = dict(oracle.queries_by_phase)
        if scalar:  # a learner reading one number per sequence: K > 1 outputs refused in one line, (B, 1) as (B,)
            oracle.expect_scalar(method)

    @property
    def check_queries(self) -> int:
        return check_queries(self.check_lengths, self.check_per_length) if self.check else 0

    @property
    def queries(self) -> int:
        """Queries this extraction has asked so far (the check excluded)."""
        return self.oracle.queries - self.start

    def plan(self, n: int, what: str, *, at_least: bool = False) -> None:
        """Refuse up front when ``n`` planned queries plus the check's do not fit in the budget.

        ``at_least``: an adaptive learner knows only a lower bound; the message says so.
        """
        self.planned = int(n)
        k = self.check_queries
        kind = "at least " if at_least else ""
        self.oracle.require(self.planned + k, f"{what} needs {kind}{self.planned} queries plus {k} for the "
                                              "functional check;")

    def phase(self, name: str, *, absorb: bool = False):
        """Context manager charging the queries inside it to phase ``name`` (``absorb``: inner phases too, for
        a phase that runs another learner)."""
        return self.oracle.phase(name, absorb=absorb)

    def report(self, total: int | None = None) -> None:
        """Tell the progress callback how far the extraction is (``total`` defaults to the plan)."""
        total = total if total is not None else (self.planned or self.queries)
        self.progress(self.queries, max(total, self.queries))

    def queries_by_phase(self) -> dict[str, int]:
        now = self.oracle.queries_by_phase
        diff = dict(self.asked_before)
        for k in now:
            diff[k] = diff.get(k, 0) + now[k] - self._phase_start.get(k, 0)
        return {k: v for k, v in diff.items() if v}

    def _check_noise(self, oracle):
        """The answers' noise for the check: the oracle's, with the caller's declared τ where that is larger."""
        if self.tolerance is None or self.tolerance <= oracle.noise.tolerance:
            return None
        return dataclasses.replace(oracle.noise, tolerance=float(self.tolerance))

    def finish(self, model: RecoveredModel, *, unknowns: int, details: dict | None = None,
               notes: list[str] | None = None, hint: str = "", check_model=None, check_oracle=None,
               check_input_fn=None, check_scale: float = 1.0,
               check_fn: Callable[..., CheckResult] | None = None,
               then_check: Callable[[CheckResult], tuple[CheckResult, str]] | None = None) -> Extraction:
        """Assemble the :class:`Extraction`, then run the functional check on fresh sequences.

        ``check_model`` / ``check_oracle`` default to ``model`` / the run's oracle (a learner whose result is
        compared on another oracle, e.g. the transformer's, passes its own). ``check_fn(oracle, model, rng,
        lengths, per_length) -> CheckResult`` replaces the value check (e.g. sign agreement for membership
        answers); it must ask exactly ``len(lengths) * per_length`` queries, as planned. ``then_check(check) ->
        (check, note)``: a further check of the learner's own (e.g. every head measured alone) run after the
        functional one, returning the verdict of both and the note to give when it fails ('' for the default). A
        failed check adds a note ending in ``hint``.
        """
        queries = self.queries
        by_phase = self.queries_by_phase()
        result = Extraction(self.method, model, queries, int(unknowns), 0.0, details=dict(details or {}),
                            notes=list(notes or []), queries_by_phase=by_phase)
        if self.check:
            oracle = check_oracle or self.oracle
            target = check_model if check_model is not None else model
            with oracle.phase("check", fresh=True):  # never answered from a query log
                if check_fn is not None:
                    result.check = check_fn(oracle, target, self.rng, self.check_lengths, self.check_per_length)
                else:
                    result.check = functional_check(oracle, target, self.rng, self.check_lengths,
                                                    self.check_per_length, scale=check_scale,
                                                    input_fn=check_input_fn, noise=self._check_noise(oracle))
            failed = "" if result.check.passed else _failed(result.check, hint)
            if then_check is not None:
                result.check, note = then_check(result.check)
                failed = failed or note or _failed(result.check, hint)
            if not result.check.passed:
                result.notes.append(failed)
        result.seconds = time.perf_counter() - self.t0
        return result


#: how the notes of a check that did not pass begin (:func:`_failed`; a learner's own, e.g. per head, too)
CHECK_NOTE_PREFIXES = ("functional check FAILED", "functional check UNCERTIFIED")


def without_check_notes(notes: list[str]) -> list[str]:
    """``notes`` without those a check that did not pass wrote (:data:`CHECK_NOTE_PREFIXES`): for a result whose
    model, and so whose check, is replaced afterwards."""
    return [note for note in notes if not note.startswith(CHECK_NOTE_PREFIXES)]


def failed_check_hint(check, notes: list[str]) -> str:
    """The learner's hint (what its model class assumed, what to try) ending the note :func:`_failed` wrote for
    ``check`` in ``notes``; '' when there is none."""
    head = _failed(check, "")
    return next((note[len(head):] for note in notes if note.startswith(head)), "")


def _failed(check, hint: str) -> str:
    if check.verdict == "uncertified":
        return f"{CHECK_NOTE_PREFIXES[1]}: {check.describe()}{hint}"
    return (f"{CHECK_NOTE_PREFIXES[0]} (relative error {check.error:.2e} > {check.tolerance:.1e}): the recovered "
            f"model does not describe the oracle{hint}")
