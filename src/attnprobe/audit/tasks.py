"""One audit task = a plain function of (target head, method, defence, seed) -> a record dict.

The task rebuilds the head from its spec inside the worker, so the process pool and Ray run the very same
code on the very same inputs and give the same numbers for the same seeds.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from attnprobe.audit.defenses import Defense
from attnprobe.errors import AttnprobeError, ConfigError
from attnprobe.oracles import Oracle
from attnprobe.models.compare import relative_error, relative_errors


@dataclass(frozen=True)
class HeadSpec:
    """Which head to audit: ``source`` is ``"minilm"`` (the installed MiniLM-L6 weights) or a path to a
    BERT-family ``.safetensors`` checkpoint split into ``heads_per_layer`` heads; ``head=None`` is the whole
    layer (all its heads as one multi-head oracle)."""

    source: str
    layer: int
    head: int | None
    row: int = 0
    heads_per_layer: int | None = None

    def checkpoint(self):
        from attnprobe.targets.bert import BertCheckpoint
        from attnprobe.targets.minilm import HEADS, minilm_checkpoint

        if self.source == "minilm":
            if self.heads_per_layer not in (None, HEADS):
                raise ConfigError(f"MiniLM-L6 has {HEADS} heads per layer; got heads_per_layer={self.heads_per_layer}")
            return minilm_checkpoint()
        if self.heads_per_layer is None:
            raise ConfigError(f"say how many heads per layer {self.source} has (heads_per_layer)")
        return BertCheckpoint(self.source, self.heads_per_layer)

    def target(self):
        if self.head is None:
            return self.checkpoint().layer(self.layer, self.row)
        return self.checkpoint().head(self.layer, self.head, self.row)

    @property
    def name(self) -> str:
        return f"L{self.layer}" if self.head is None else f"L{self.layer}H{self.head}"


def _exact(oracle, task):
    from attnprobe.learners.exact import extract_exact

    return extract_exact(oracle, seed=task.seed)


def _lowrank(oracle, task):
    from attnprobe.learners.lowrank import extract_lowrank

    return extract_lowrank(oracle, rank=task.rank, seed=task.seed)


def _nuclear(oracle, task):
    from attnprobe.learners.nuclear import extract_nuclear

    return extract_nuclear(oracle, rank=task.rank, seed=task.seed)


def _robust(oracle, task):
    from attnprobe.learners.robust import extract_robust

    return extract_robust(oracle, seed=task.seed)


def _membership(oracle, task):
    from attnprobe.learners.membership import extract_membership

    return extract_membership(oracle, seed=task.seed)


def _multihead(oracle, task):
    from attnprobe.learners.multihead.generic import extract_generic

    return extract_generic(oracle, heads=task.head.checkpoint().heads_per_layer, rank=task.rank, seed=task.seed)


#: ``--method`` of ``attnprobe audit`` -> learner(oracle, task); yes/no answers always use ``membership``,
#: whole layers ``multihead``
AUDIT_METHODS = {"exact": _exact, "lowrank": _lowrank, "nuclear": _nuclear, "robust": _robust,
                 "membership": _membership, "multihead": _multihead}


@dataclass(frozen=True)
class Task:
    """One extraction of one head under one defence."""

    head: HeadSpec
    method: str
    defense: Defense = field(default_factory=Defense)
    seed: int = 0
    budget: int | None = None
    rank: int | None = None

    @property
    def learner(self) -> str:
        """The method actually run: a membership defence leaves only the membership learner (App. B); a whole
        layer needs the multi-head learner (App. C and beyond)."""
        if self.head.head is None:
            return "multihead"
        return "membership" if self.defense.membership else self.method


def _check_fields(check) -> tuple[float | None, bool | None, int]:
    """(error, passed, queries) of a functional check, whatever its form (dict or typed result)."""
    def get(key):
        try:
            return check[key]
        except (KeyError, TypeError, IndexError):
            return None
    err, passed, queries = get("relative_error"), get("passed"), get("queries")
    if passed is None and get("sign_agreement") is not None:
        passed = bool(get("sign_agreement") >= 0.99)
    return (None if err is None else float(err)), (None if passed is None else bool(passed)), int(queries or 0)


def _layer_errors(truth, model) -> tuple[dict[str, float], list[float]]:
    """Worst head's W, v, u errors and c's, after matching heads up to permutation; per true head, W's error."""
    from attnprobe.models.multihead import match_heads

    m = match_heads(truth, model)
    worst = {name: float(np.max(getattr(m, name))) for name in ("W", "v", "u")}
    return dict(worst, c=float(m.c)), [float(x) for x in m.W]


def _errors(truth, model, membership: bool) -> dict[str, float]:
    if not membership:
        return relative_errors(truth, model)
    # membership answers fix v only up to its norm (App. B): compare directions; u and c are not learned
    unit = truth.v / np.linalg.norm(truth.v)
    return {"W": relative_error(model.W, truth.W), "v": relative_error(model.v, unit)}


def failed_record(task: Task, error: str | None) -> dict:
    """The record of a task that did not produce a model (also the blank a task fills in)."""
    return {"layer": task.head.layer, "head": task.head.head, "row": task.head.row, "defense": task.defense.name,
            "method": task.learner, "seed": task.seed, "queries": 0, "check_queries": 0, "unknowns": None,
            "relative_error": {}, "check_error": None, "passed": False, "seconds": 0.0, "error": error,
            "arrays": None}


def run_task(task: Task) -> dict:
    """Run one extraction and measure it against the truth. Never raises for a failed extraction: the
    record's ``error`` says what went wrong (the audit goes on). ``arrays`` holds the recovered parameters."""
    t0 = time.perf_counter()
    rec = failed_record(task, None)
    oracle = None
    try:
        if task.learner not in AUDIT_METHODS:
            raise ConfigError(f"unknown audit method {task.learner!r}; choose one of {', '.join(AUDIT_METHODS)}")
        truth = task.head.target()
        oracle = Oracle(truth, truth.d, budget=task.budget, chain=task.defense.seeded(task.seed))
        res = AUDIT_METHODS[task.learner](oracle, task)
        err, passed, check_queries = _check_fields(res.check)
        if task.head.head is None:
            errors, rec["head_W_errors"] = _layer_errors(truth, res.model)
        else:
            errors = _errors(truth, res.model, task.defense.membership)
        rec.update(kind=res.model.kind, queries=int(res.queries), check_queries=check_queries,
                   unknowns=int(res.unknowns),
                   relative_error=errors, check_error=err,
                   passed=bool(passed), arrays={k: np.asarray(v) for k, v in res.model.arrays().items()})
        phases = getattr(res, "queries_by_phase", None)  # learners on the skeleton charge queries to phases
        if phases:
            rec["queries_by_phase"] = {str(k): int(v) for k, v in dict(phases).items()}
    except Exception as exc:  # reported in the record: one failing head must not end a 72-head audit
        rec["error"] = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, AttnprobeError):  # not a refusal we raise on purpose: keep where it came from
            rec["traceback"] = traceback.format_exc(limit=6)
    if oracle is not None and rec["error"] is not None:
        rec["queries"] = int(oracle.queries)
    rec["seconds"] = time.perf_counter() - t0
    return rec
