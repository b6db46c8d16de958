"""One audit task = a plain function of (target head, learner, defence, seed) -> a record dict; the learner is
run through the learner registry (:mod:`attnprobe.learners.core.registry`).

The task rebuilds the head from its spec inside the worker, so the process pool and Ray run the very same
code on the very same inputs and give the same numbers for the same seeds.
"""

from __future__ import annotations

import importlib
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnprobe.audit.blocks import block_errors, query_log
from attnprobe.audit.defenses import Defense, answers_left
from attnprobe.errors import AttnprobeError, ConfigError
from attnprobe.learners.core import registry
from attnprobe.models.compare import parameter_errors
from attnprobe.oracles import Oracle


@dataclass(frozen=True)
class TaskKind:
    """What one audit task extracts: a single head at one output row (scalar answers), or a whole layer (every
    head at once, up to permutation: Sec. 7, App. C) answering one output row or its whole output row (K-vector
    answers, the vector layout of :class:`~attnprobe.models.multihead.MultiHeadAttention`)."""

    name: str
    whole_layer: bool
    vector: bool
    help: str
    #: what the tasks extract and which learners read their answers, as messages name them
    extracts: str
    learners: str
    #: what the learners recover (a key of :data:`attnprobe.learners.core.registry.RECOVERS`); None: a head, or a
    #: multi-head layer for whole-layer kinds
    recovers: str | None = None

    @property
    def learner_kind(self) -> str:
        """The registry's ``recovers`` of the learners that run these tasks."""
        return self.recovers or ("multi_head" if self.whole_layer else "head")


#: the task kinds ``attnprobe audit --tasks`` chooses from (the first is the default)
TASK_KINDS = {k.name: k for k in (
    TaskKind("heads", False, False, "one task per head, answering one output row (--row) of its layer "
                                    "(single-head learners)", "heads", "learner"),
    TaskKind("layers", True, True, "one task per layer: all its heads at once from whole output rows (vector "
                                   "answers, K = hidden width; the multi-head learner's vector route)",
             "whole layers from whole output rows (--tasks layers)", "multi-head learner of vector answers"),
    TaskKind("layers-every", True, True, "one task per layer: all its heads at once from whole output rows at "
                                         "every position (every-position answers (B, N, K); bidirectional, no "
                                         "position terms; docs/every-position.md)",
             "whole layers from the output rows at every position (--tasks layers-every)",
             "multi-head learner of vector answers"),
    TaskKind("layer-rows", True, False, "one task per layer: all its heads at once from one output row (--row) "
                                        "(scalar answers; the generic multi-head learner, --rank = head dimension)",
             "whole layers at one output row (--tasks layer-rows)", "multi-head learner"),
    TaskKind("blocks", True, True, "one task per decoder block of a Hugging Face folder (--hf-dir: LLaMA, Qwen2, "
                                   "Mistral, GPT-NeoX): the block learner on the block's every-position answers "
                                   "(hidden states in, the block's output at every position out; docs/block.md), "
                                   "the recovered function measured against the true block; a block the learner "
                                   "cannot read (post-norm BERT, biases) is reported as a refusal with its cause",
             "whole blocks (--tasks blocks)", "block learner", recovers="block"),
)}


@dataclass(frozen=True)
class HeadSpec:
    """Which head to audit: ``source`` is ``"minilm"`` (the installed MiniLM-L6 weights) or a path to a
    BERT-family ``.safetensors`` checkpoint split into ``heads_per_layer`` heads; ``head=None`` is the whole
    layer (all its heads as one multi-head oracle), answering output row ``row`` or, with ``row=None``, the whole
    output row (K-vector answers)."""

    source: str
    layer: int
    head: int | None
    row: int | None = 0
    heads_per_layer: int | None = None
    #: the layer answers the output row at every position (a whole-layer task with row None)
    every_position: bool = False
    #: the whole block ``layer`` of the Hugging Face folder ``source`` (norms, attention, residuals, FFN): hidden
    #: states in, every position out (:mod:`attnprobe.oracles.hf_block`)
    block: bool = False

    def __post_init__(self) -> None:
        if self.block and (self.head is not None or self.row is not None or self.every_position):
            raise ConfigError("a block is audited whole, at every position (head=None, row=None, every_position "
                              "False)", param="block")
        if self.head is not None and self.row is None:
            raise ConfigError("a single head is audited at one output row; give row (whole output rows are read "
                              "by whole-layer tasks, head=None)", param="row")
        if self.every_position and (self.head is not None or self.row is not None):
            raise ConfigError("every-position answers are audited for whole layers at whole output rows (head=None, "
                              "row=None)", param="row")

    @property
    def kind(self) -> TaskKind:
        """The :data:`TASK_KINDS` entry of this spec."""
        if self.head is not None:
            return TASK_KINDS["heads"]
        if self.block:
            return TASK_KINDS["blocks"]
        if self.every_position:
            return TASK_KINDS["layers-every"]
        return TASK_KINDS["layers" if self.row is None else "layer-rows"]

    def checkpoint(self):
        from attnprobe.targets.bert import BertCheckpoint
        from attnprobe.targets.minilm import HEADS, minilm_checkpoint

        if self.source == "minilm":
            if self.heads_per_layer not in (None, HEADS):
                raise ConfigError(f"MiniLM-L6 has {HEADS} heads per layer; got heads_per_layer={self.heads_per_layer}",
                                  param="heads_per_layer")
            return minilm_checkpoint()
        if Path(self.source).is_dir():  # a Hugging Face folder: its config says the family and the heads
            from attnprobe.targets.hf import hf_checkpoint

            ckpt = hf_checkpoint(self.source)
            if self.heads_per_layer not in (None, ckpt.heads_per_layer):
                raise ConfigError(f"{self.source} has {ckpt.heads_per_layer} heads per layer; got "
                                  f"heads_per_layer={self.heads_per_layer}", param="heads_per_layer")
            return ckpt
        if self.heads_per_layer is None:
            raise ConfigError(f"say how many heads per layer {self.source} has (heads_per_layer)",
                              param="heads_per_layer")
        return BertCheckpoint(self.source, self.heads_per_layer)

    def heads(self) -> int:
        """The attention heads per layer (``heads_per_layer``, else read from the checkpoint or the folder's
        config.json)."""
        if self.heads_per_layer is not None:
            return self.heads_per_layer
        if self.block:
            from attnprobe.oracles.hf_block import block_spec

            return block_spec(self.source)[0].heads
        return self.checkpoint().heads_per_layer

    def block_oracle(self, **kwargs):
        """The every-position oracle of block ``layer`` of the folder ``source`` (float64; ``kwargs`` go to the
        :class:`~attnprobe.oracles.Oracle`: budget, chain, log)."""
        from attnprobe.oracles.hf_block import oracle_from_hf_block

        return oracle_from_hf_block(self.source, self.layer, **kwargs)

    def target(self, oracle=None):
        """The true model: a head, a layer at one output row, or a layer in the vector layout (App. C with K
        outputs: ``V_h = W_O[:, h] W_V[h]``, ``c = W_O b_V + b_O``); for a block, its float64
        :class:`~attnprobe.models.block.TransformerBlock` read from the live layer module (that of ``oracle``, a
        :meth:`block_oracle`, when given: the folder is not loaded twice)."""
        if self.block:
            from attnprobe.oracles.hf_block import block_model, hf_block
            from attnprobe.oracles.wrappers import declared_attribute

            victim = declared_attribute(oracle.fn, "module") if oracle is not None else None
            victim = victim if victim is not None else hf_block(self.source, self.layer)
            return block_model(victim)
        ckpt = self.checkpoint()
        if self.head is not None:
            return ckpt.head(self.layer, self.head, self.row)
        if self.row is not None:
            return ckpt.layer(self.layer, self.row)
        from attnprobe.models.multihead import MultiHeadAttention

        p = ckpt.layer_weights(self.layer)
        spec = getattr(ckpt, "spec", None)  # a Hugging Face folder knows its family's logit scale
        scale = spec.logit_scale(self.layer) if spec is not None else 1.0 / np.sqrt(ckpt.head_dim)
        return MultiHeadAttention.from_projections(p["Q"], p["K"], p["V"], p["WO"], p["bO"], b_Q=p["bQ"],
                                                   b_V=p["bV"], scale=scale)

    @property
    def name(self) -> str:
        """``L{layer}H{head}``, ``L{layer}`` (whole output rows), ``L{layer}R{row}`` (one output row) or
        ``B{layer}`` (a whole block)."""
        if self.head is not None:
            return f"L{self.layer}H{self.head}"
        if self.block:
            return f"B{self.layer}"
        return f"L{self.layer}" if self.row is None else f"L{self.layer}R{self.row}"


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
    #: where the task keeps its query log (:class:`~attnprobe.oracles.querylog.QueryLog`; the audit gives one to
    #: block tasks, which run for minutes): a task killed mid-way and run again takes the answers it paid for from
    #: it. Not part of what makes two tasks the same work.
    log: str | None = None

    def __post_init__(self) -> None:
        if self.module is None and self.method in {e.name for e in registry.learners()}:
            object.__setattr__(self, "module", registry.learner(self.method).fn.__module__)

    @property
    def learner(self) -> str:
        """The learner actually run: ``method`` when its capabilities fit the defence, else the first registered
        learner of the same kind that fits (yes/no answers leave only a membership learner, App. B); a whole
        layer needs a multi-head learner (Sec. 7, App. C)."""
        kind = self.head.kind
        fits = fitting_learners(self.defense, whole_layers=kind.whole_layer, vector=kind.vector,
                                recovers=kind.learner_kind)
        if self.method in fits or not fits:
            return self.method
        return fits[0]


def audit_learners(whole_layers: bool = False, vector: bool = False, recovers: str | None = None) -> list[str]:
    """The learners an audit can run: every registered head learner (multi-head learners for whole layers; those
    that read K-vector answers for whole output rows; ``recovers`` names another kind: ``block``)."""
    return [e.name for e in registry.learners(recovers or ("multi_head" if whole_layers else "head"))
            if not vector or e.capabilities.vector_answers]


def fitting_learners(defense: Defense, whole_layers: bool = False, vector: bool = False,
                     recovers: str | None = None) -> list[str]:
    """The audit learners whose capabilities fit the answers ``defense`` leaves (with the packages installed)."""
    recovers = recovers or ("multi_head" if whole_layers else "head")
    return [e.name for e in registry.learners(recovers) if e.fits(**answers_left(defense), vector=vector)]


def _errors(task: Task, truth, model) -> tuple[dict[str, float], dict]:
    """The record's parameter errors (:func:`parameter_errors`) and, for a whole layer, per true head (heads
    matched up to permutation, Sec. 7): ``head_W_errors`` (W's error) and ``head_errors`` (the largest of its W,
    v or V_h, u errors)."""
    errs = parameter_errors(truth, model, v_scale_free=task.defense.membership)
    if task.head.head is not None:
        return errs, {}
    per_head = {"head_W_errors": [errs[f"W[{h}]"] for h in range(truth.H)],
                "head_errors": [next(v for k, v in errs.items() if k.startswith(f"head{h}<-"))
                                for h in range(truth.H)]}
    return {k: errs[k] for k in ("W", "v", "u", "c")}, per_head


def failed_record(task: Task, error: str | None) -> dict:
    """The record of a task that did not produce a model (also the blank a task fills in)."""
    return {"layer": task.head.layer, "head": task.head.head, "row": task.head.row, "defense": task.defense.name,
            "method": task.learner, "seed": task.seed, "queries": 0, "check_queries": 0, "unknowns": None,
            "relative_error": {}, "check_error": None, "passed": False, "seconds": 0.0, "error": error,
            "arrays": None}


def _victim(task: Task):
    """The oracle a task attacks, a function giving the truth (for a block read from the oracle's own layer
    module, once the learner has finished: a refused block loads nothing more) and why the task runs without the
    query log it was given (None: it has it, or was given none)."""
    spec, chain = task.head, task.defense.seeded(task.seed)
    if spec.block:
        log, why = query_log(task, chain)
        oracle = spec.block_oracle(budget=task.budget, chain=chain, log=log)
        return oracle, lambda: spec.target(oracle), why
    truth = spec.target()
    outputs = truth.v.shape[1] if spec.kind.vector else None  # K known: no query spent to find it
    fn = truth
    if spec.every_position:  # the layer's output row at every position (bidirectional, no position terms)
        from attnprobe.models.every_position import EveryPositionLayer

        fn = EveryPositionLayer(truth)
    return Oracle(fn, truth.d, budget=task.budget, chain=chain, outputs=outputs), lambda: truth, None


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
        oracle, truth, log_note = _victim(task)
        options = {"rank": task.rank} if "rank" in learner.option_names else {}
        if task.head.head is None and "heads" in learner.option_names:
            options["heads"] = task.head.heads()
        if task.head.block and "hidden" in learner.option_names:
            from attnprobe.oracles.hf_block import post_norm_width

            if width := post_norm_width(task.head.source):  # a BERT block: its neurons stage needs the width
                options["hidden"] = width
        res = learner(oracle, seed=task.seed, **options)
        if task.head.block:
            errors, extra = block_errors(truth(), res.model, task.seed)
            extra["eps"] = res.details.get("eps")
            extra["ffn_hidden"] = (res.details.get("ffn") or {}).get("hidden")
        else:
            errors, extra = _errors(task, truth(), res.model)
        rec.update(extra)
        chk = res.check
        rec.update(kind=res.model.kind, queries=int(res.queries), check_queries=chk.queries if chk else 0,
                   unknowns=int(res.unknowns), relative_error=errors, check_error=chk.error if chk else None,
                   passed=bool(res.passed), arrays={k: np.asarray(v) for k, v in res.model.arrays().items()})
        rec.update(rows=int(oracle.rows), positions=oracle.positions)  # output rows answered; what they are
        if task.log is not None:  # answers taken from the task's query log (paid for by a run that was killed)
            rec.update(from_log=int(oracle.from_log), log_note=log_note)
        phases = getattr(res, "queries_by_phase", None)  # learners on the skeleton charge queries to phases
        if phases:
            rec["queries_by_phase"] = {str(k): int(v) for k, v in dict(phases).items()}
    except Exception as exc:  # reported in the record: one failing head must not end a 72-head audit
        rec["error"] = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, AttnprobeError):  # not a refusal we raise on purpose: keep where it came from
            rec["traceback"] = traceback.format_exc(limit=6)
    if oracle is not None and rec["error"] is not None:
        rec["queries"] = int(oracle.queries)
    if oracle is not None and oracle.log is not None:
        oracle.log.close()
    rec["seconds"] = time.perf_counter() - t0
    return rec
