"""One audit task = a plain function of (target head, learner, defence, seed) -> a record dict; the learner is
run through the learner registry (:mod:`attnprobe.learners.registry`).

The task rebuilds the head from its spec inside the worker, so the process pool and Ray run the very same
code on the very same inputs and give the same numbers for the same seeds.
"""

from __future__ import annotations

import importlib
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from attnprobe.audit.defenses import Defense, answers_left
from attnprobe.errors import AttnprobeError, ConfigError
from attnprobe.learners import registry
from attnprobe.models.compare import parameter_errors
from attnprobe.oracles import Oracle


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


@dataclass(frozen=True)
class Task:
    """One extraction of one head under one defence. ``module`` is the module that registers the learner (set
    from the registry when the task is made): a worker process imports it first, so learners registered outside
    attnprobe run on the process pool and on Ray too."""

    head: HeadSpec
    method: str
    defense: Defense = field(default_factory=Defense)
    seed: int = 0
    budget: int | None = None
    rank: int | None = None
    module: str | None = None

    def __post_init__(self) -> None:
        if self.module is None and self.method in {e.name for e in registry.learners()}:
            object.__setattr__(self, "module", registry.learner(self.method).fn.__module__)

    @property
    def learner(self) -> str:
        """The learner actually run: ``method`` when its capabilities fit the defence, else the first registered
        learner of the same kind that fits (yes/no answers leave only a membership learner, App. B); a whole
        layer needs a multi-head learner (Sec. 7, App. C)."""
        fits = fitting_learners(self.defense, whole_layers=self.head.head is None)
        if self.method in fits or not fits:
            return self.method
        return fits[0]


def audit_learners(whole_layers: bool = False) -> list[str]:
    """The learners an audit can run: every registered head learner (multi-head learners for whole layers)."""
    return [e.name for e in registry.learners("multi_head" if whole_layers else "head")]


def fitting_learners(defense: Defense, whole_layers: bool = False) -> list[str]:
    """The audit learners whose capabilities fit the answers ``defense`` leaves (with the packages installed)."""
    recovers = "multi_head" if whole_layers else "head"
    return [e.name for e in registry.learners(recovers) if e.fits(**answers_left(defense))]


def _errors(task: Task, truth, model) -> tuple[dict[str, float], list[float] | None]:
    """The record's parameter errors (:func:`parameter_errors`) and, for a whole layer, W's error per true head."""
    errs = parameter_errors(truth, model, v_scale_free=task.defense.membership)
    if task.head.head is None:
        return {k: errs[k] for k in ("W", "v", "u", "c")}, [errs[f"W[{h}]"] for h in range(truth.H)]
    return errs, None


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
    if task.module and task.method not in {e.name for e in registry.learners()}:
        try:
            importlib.import_module(task.module)  # registers the learner in this worker
        except Exception as exc:  # noqa: BLE001 - reported in the record like any failed task
            return failed_record(task, f"cannot import {task.module}, which registers the learner "
                                       f"{task.method!r}: {type(exc).__name__}: {exc}")
    rec = failed_record(task, None)
    oracle = None
    try:
        learner = registry.learner(task.learner)
        truth = task.head.target()
        oracle = Oracle(truth, truth.d, budget=task.budget, chain=task.defense.seeded(task.seed))
        options = {"rank": task.rank} if "rank" in learner.option_names else {}
        if task.head.head is None and "heads" in learner.option_names:
            options["heads"] = task.head.checkpoint().heads_per_layer
        res = learner(oracle, seed=task.seed, **options)
        errors, head_w = _errors(task, truth, res.model)
        if head_w is not None:
            rec["head_W_errors"] = head_w
        chk = res.check
        rec.update(kind=res.model.kind, queries=int(res.queries), check_queries=chk.queries if chk else 0,
                   unknowns=int(res.unknowns), relative_error=errors, check_error=chk.error if chk else None,
                   passed=bool(res.passed), arrays={k: np.asarray(v) for k, v in res.model.arrays().items()})
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
