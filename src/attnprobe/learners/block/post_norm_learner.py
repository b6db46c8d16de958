"""The post-norm (BERT) block ``y = n2(h + F(h))``, ``h = n1(x + A(X))`` from its answers alone: the stages of
docs/block.md ("Post-norm blocks") chained, as :func:`.learner.extract_block` runs them on a block told apart as
post-norm.

1. ``output norm`` (:func:`.post_norm.output_norm`): n2's weight and bias from the answers' rows.
2. ``first-norm centre`` and 3. ``first-norm input`` (:mod:`.post_norm`): the single token's n1 input
   ``x ↦ K x + c`` (up to the ones gauge), the door to every n1 input.
4. ``attention`` (:mod:`.post_norm_attention`): the heads' value maps and logits from pairs ``[b + t f, b]``, each
   answered row traced back to its n1 input.
5. ``neurons`` (:mod:`.post_norm_neurons`): the FFN's first layer on n1's sphere from first derivatives — the
   Jacobians' (m + 1)-span by alternating least squares, its rank-one elements, each neuron's GELU curve. Its span
   holds ``4m·d²`` numbers (``4m`` points of ``d²``) and is swept hundreds of times: run up to
   :data:`NEURON_NUMBERS` (measured: d = 32, m = 64); beyond, through C probe directions
   (:mod:`.post_norm_probe_neurons`: the probe span by Gauss–Newton, every factor by the deflated pencil, the
   directions past the probes, the curves) up to :data:`PROBE_NEURONS` (``m·d``: MiniLM's d = 384, m = 1536),
   refused in one line beyond.
6. ``ffn`` (:mod:`.post_norm_ffn`): every row's scale, n1's weight, the second layer and the joint bias as one null
   vector.
7. ``polish`` (:mod:`.post_norm_polish`): the block assembled, then Gauss–Newton on every-position answers.

A run longer than one sitting (MiniLM's) keeps its stages in a :class:`.post_norm_store.StageStore` and resumes.

The result (a post-norm :class:`~attnprobe.models.block.TransformerBlock`, LayerNorms, both ε BERT's 1e-12, n1's
bias 0: one member of the gauge family of docs/block.md, "What the answers can fix") claims :data:`CLAIM` at every
position of every length 1 … 64 (the block check's norm), the issue's line for MiniLM.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.block import post_norm
from attnprobe.learners.block.post_norm import FirstNormInput, first_norm_centre, first_norm_input, output_norm
from attnprobe.learners.block.post_norm_attention import NEWTON_STEPS, attention_stage
from attnprobe.learners.block.post_norm_ffn import ffn_points, second_layer
from attnprobe.learners.block.post_norm_neurons import (neuron_curves, neuron_span, rank_one_elements,
                                                        sphere_jacobians)
from attnprobe.learners.block.post_norm_probe_neurons import probe_neurons, probe_plan
from attnprobe.learners.block.post_norm_polish import LENGTHS, PolishReport, assemble, polish_block, polish_data
from attnprobe.models.block import TransformerBlock
from attnprobe.models.positional import PositionalAttention

#: the error a post-norm result claims at every position of every length (largest error over the largest
#: ``|y − x|``): the issue's line for MiniLM's layer; a d = 32 ``BertLayer`` from answers alone measured ~2e-9
CLAIM = 1e-4
#: the neurons stage's span at most (``4m`` points of ``d²`` numbers): measured up to d = 32, m = 64 (262,144)
NEURON_NUMBERS = 4 * 64 * 32 * 32
#: the probe route of the neurons stage at most (``m·d``): MiniLM's d = 384, m = 1,536 (chained from its answers in
#: sittings of a :class:`.post_norm_store.StageStore`: docs/block.md, "Through probes, as library pieces")
PROBE_NEURONS = 1536 * 384
#: the attention stage's key step (MiniLM layer 2: 0.2 kept 45 of 60 pairs; d = 32 measured at 0.1)
PAIR_STEP = 0.2
#: Gauss–Newton steps of the polish, LSMR iterations per step, sequences at least (d = 32: 3 × 200 on 100
#: sequences took the assembled 2.7e-5 to 1.7e-9), and the rms misfit below which no step is taken (the stages
#: alone at d = 12, one head: 1.3e-9)
ROUNDS, ITERATIONS, SEQUENCES, SETTLED = 3, 200, 100, 1e-8
#: past WIDE unknowns, Gauss–Newton steps, LSMR iterations per step and answered numbers per unknown (MiniLM layer 2
#: with its true first layer given: one step of 30 on 300 sequences, 1.2 numbers an unknown, took the misfit
#: 8.8e-6 → 1.1e-6 and every length within 1e-4, 489 s; 200 iterations would take ~1 h a step), and with a store the
#: share of a sitting that must be left to begin a step (a step at MiniLM's size fills half of one)
WIDE, WIDE_ROUNDS, WIDE_ITERATIONS, WIDE_NUMBERS, SITTING_SHARE = 200_000, 1, 30, 1.2, 0.5
#: the neurons' curve fit above which the stage is refused (d = 32 measured 3.5e-8: a GELU neuron fits to the
#: central differences' error)
CURVE_MISFIT = 1e-4


def pairs(d: int, heads: int) -> int:
    """Pairs of the attention stage: each kept pair gives one ``k_h`` per head and ``d_h + 2`` are needed; a
    quarter of MiniLM's were not kept (45 of 60)."""
    return 2 * (d // heads) + 8


def polish_sequences(d: int, unknowns: int) -> int:
    """Sequences of the polish: twice as many answered numbers as unknowns (past :data:`WIDE` unknowns
    :data:`WIDE_NUMBERS` times as many), at least :data:`SEQUENCES`."""
    ratio = 2 if unknowns <= WIDE else WIDE_NUMBERS
    return max(SEQUENCES, math.ceil(ratio * unknowns / (d * float(np.mean(LENGTHS)))))


def unknowns(d: int, m: int) -> int:
    """The post-norm block's weights: attention ``4d² + 4d``, FFN ``2dm + m + d``, two LayerNorms ``4d``."""
    return 4 * d * d + 4 * d + 2 * d * m + m + d + 4 * d


def neurons_refusal(d: int, hidden: int | None) -> str | None:
    """Why stage neurons is not run on a block of width ``d`` and FFN width ``hidden`` (one line), or None when it
    runs: the width unknown, or the span beyond :data:`NEURON_NUMBERS`."""
    if hidden is None:
        return "stage neurons reads the FFN's first layer given its width; give hidden (the FFN's width m: a BERT " \
               "folder's intermediate_size)"
    n = 4 * hidden * d * d
    if on_span(d, hidden) or hidden * d <= PROBE_NEURONS:
        return None
    return (f"stage neurons not run at d = {d}, m = {hidden}: its span holds 4m·d² = {n:.1e} numbers, measured up "
            f"to {NEURON_NUMBERS:.1e} (d = 32, m = 64), and its probe route m·d = {hidden * d:,} up to "
            f"{PROBE_NEURONS:,} (MiniLM: d = 384, m = 1,536)")


def too_large(d: int, hidden: int | None, said: str) -> None:
    """Refuse (one line) before any stage a block whose neurons stage is not run (:func:`neurons_refusal`)."""
    cause = neurons_refusal(d, hidden)
    if cause is not None:
        raise UnidentifiableError(f"{said}: {cause}")


def on_span(d: int, hidden: int) -> bool:
    """Whether stage neurons reads the d² span (its ``4m·d²`` numbers within :data:`NEURON_NUMBERS`), not probes."""
    return 4 * hidden * d * d <= NEURON_NUMBERS


def neuron_queries(d: int, hidden: int) -> int:
    """Single tokens of stage neurons: ``4m(2d + 1)`` on the d² route, :func:`.post_norm_probe_neurons.probe_plan`'s
    through probes."""
    if on_span(d, hidden):
        return 4 * hidden * (2 * d + 1)
    return probe_plan(d, hidden)[3]


def post_norm_queries(d: int, heads: int, hidden: int) -> tuple[int, int, int]:
    """Queries of :func:`extract_post_norm` and the 3 that told the block apart, the check not counted:
    ``(low, typical, high)``. Fixed: output norm ``4(d + 3)``, centre ``2d`` a point and ``3(2d + 2)`` a ray step,
    input ``4d`` a point, neurons :func:`neuron_queries`, ffn ``2(m + d + 1)``, the polish's sequences; adaptive: a pair
    ``2 + 4d + 2d(J + 1)`` and its chord steps, J the Jacobians its row took (1, 2, 3; MiniLM layer 2: 2 … 3)."""
    fixed = 3 + post_norm.ROWS * (d + 3) + sum(2 * d * p for _, p in post_norm.ROUNDS)
    fixed += post_norm.RAY_NEWTON[1] * 3 * (2 * d + 2) + post_norm.INPUT_POINTS * 4 * d
    fixed += neuron_queries(d, hidden) + 2 * (hidden + d + 1)
    fixed += polish_sequences(d, unknowns(d, hidden))
    n = pairs(d, heads)
    return tuple(fixed + n * (2 + 4 * d + 2 * d * (J + 1) + steps)
                 for J, steps in ((1, 1), (2, 4), (3, NEWTON_STEPS)))


def notes(said: str, store=None) -> list[str]:
    """The post-norm result's notes: what is identifiable, and the stages a resumed run loaded from ``store``."""
    out = [f"{said}: the post-norm route (docs/block.md), n1's weight up to one positive factor and its bias folded "
           "into the FFN's (bias 0), both LayerNorms' ε BERT's 1e-12 (not read)"]
    if store is not None and store.resumed:
        out.append(f"resumed from {store.folder}: stages {', '.join(dict.fromkeys(store.resumed))} loaded, their "
                   f"queries asked in earlier sittings and not counted here ({store.queries():,} over every sitting "
                   "up to its last save, the check not included)")
    return out


def extract_post_norm(run, *, heads: int, hidden: int, said: str, seed=0, store=None):
    """Stages 1–7 (module docstring) on ``run``'s oracle, each charged to its phase. Returns ``(model, unknowns,
    details)``; a stage that fails refuses in one line prefixed by ``said`` (how the block was told apart).
    ``store``: a :class:`.post_norm_store.StageStore` — stages 1–5 saved as read and loaded when present (a run past
    one sitting resumes; :class:`.post_norm_store.Paused` at its deadline)."""
    rows, d = run.oracle.answer_rows, run.oracle.d
    rng = np.random.default_rng([seed, 11])
    try:
        with run.phase("output norm"):
            if store is not None:  # a folder of another block or setting is refused before any stage is loaded
                store.bind(rows, d, {"heads": heads, "hidden": -1 if hidden is None else hidden, "seed": seed},
                           count=lambda: run.oracle.queries)
            prep = store.get("prep") if store is not None else None
            if prep is None:
                n2 = output_norm(rows, d, rng)
        with run.phase("first-norm input"):
            if prep is None:
                affine = first_norm_input(rows, first_norm_centre(rows, d, rng), rng)
                prep = dict(w2=n2[0], b2=n2[1], K=affine.K, c=affine.c, misfit=affine.misfit, queries=affine.queries)
                if store is not None:
                    store.put("prep", **prep)
            n2 = (prep["w2"], prep["b2"])
            affine = FirstNormInput(prep["K"], prep["c"], float(prep["misfit"]), int(prep["queries"]))
        with run.phase("attention"):
            att = _attention(rows, affine, heads, rng, store)
        got = store.get("ffn") if store is not None else None  # the block assembled: the neurons are in it
        with run.phase("neurons"):
            if got is None:
                A, a, *neurons = read_neurons(rows, affine, n2, hidden, rng, store)
            else:
                neurons = [int(got["sweeps"]), float(got["span"]), float(got["curves"])]
        with run.phase("ffn"):
            if got is None:
                got = _ffn(rows, (affine, n2), (A, a), att.attention, rng)
                got.update(sweeps=neurons[0], span=neurons[1], curves=neurons[2])
                if store is not None:
                    store.put("ffn", **got)
            block, second = _block_of(got), {k: float(got[k]) for k in ("null", "gap", "misfit")}
    except UnidentifiableError as exc:
        raise UnidentifiableError(f"{said}: {exc}") from exc
    n = unknowns(d, hidden)
    with run.phase("polish"):
        model, report, count = _polish(rows, block, rng, n, store)
    details = {"layout": "post", "n2_weight_rms": float(np.sqrt(np.mean(n2[0] ** 2))),
               "first_norm_input_misfit": affine.misfit,
               "attention": {"pairs_kept": att.kept, "logit_misfit": att.misfit, "queries": att.queries},
               "neurons": dict(zip(("sweeps", "span_residual", "curve_misfit"), neurons)),
               "ffn": {"hidden": hidden, "activation": "gelu", **second},
               "polish": {"history": report.history, "iterations": report.iterations, "sequences": count},
               "resumed": list(store.resumed) if store is not None else [],
               "claim": {"error": CLAIM, "norm": "worst",
                         "cause": "every position of every length 1 … 64, relative to the largest |y − x|"}}
    return model, n, details


def _attention(rows, affine, heads: int, rng, store):
    """Stage attention (:func:`.post_norm_attention.attention_stage`), or the one ``store`` saved: ``(attention,
    kept, misfit, queries)`` as a namespace."""
    got = store.get("attention") if store is not None else None
    if got is None:
        att = attention_stage(rows, affine, heads, rng, pairs(affine.K.shape[0], heads), PAIR_STEP)
        got = {f"attention_{k}": v for k, v in att.attention.arrays().items()}
        got.update(kept=len(att.split.kept), misfit=att.misfit, queries=att.queries)
        if store is not None:
            store.put("attention", **got)
    attention = PositionalAttention.from_arrays({k[10:]: v for k, v in got.items() if k.startswith("attention_")})
    return SimpleNamespace(attention=attention, kept=int(got["kept"]), misfit=float(got["misfit"]),
                           queries=int(got["queries"]))


def _ffn(rows, norms, first, attention, rng) -> dict:
    """Stage ffn (:func:`.post_norm_ffn.second_layer` given the first layer ``(A, a)``) and the block assembled:
    its arrays (``block_…``) and the stage's ``null``, ``gap``, ``misfit``."""
    (affine, n2), (A, a) = norms, first
    d, m = affine.K.shape[0], len(A)
    second = second_layer(*ffn_points(rows, affine, n2, rng, 2 * (m + d + 1)), A, a)
    block = assemble(attention, second.w1, second.ffn, n2)
    got = {f"block_{k}": v for k, v in block.arrays().items()}
    got.update(null=second.null, gap=second.gap, misfit=second.misfit)
    return got


def _block_of(arrays: dict) -> TransformerBlock:
    return TransformerBlock.from_arrays({k[6:]: v for k, v in arrays.items() if k.startswith("block_")})


def polish_plan(n: int) -> tuple[int, int]:
    """Polish steps and LSMR iterations a step: :data:`ROUNDS`, :data:`ITERATIONS`; past :data:`WIDE` unknowns
    :data:`WIDE_ROUNDS`, :data:`WIDE_ITERATIONS`."""
    return (ROUNDS, ITERATIONS) if n <= WIDE else (WIDE_ROUNDS, WIDE_ITERATIONS)


def _polish(rows, block, rng, n: int, store):
    """Stage polish: ``(block, report, sequences)``; with ``store``, one Gauss–Newton step a sitting at most (each
    on fresh sequences), the block saved after each (``polish``), a step begun only at a sitting's start."""
    d = block.d
    if store is None:
        data = polish_data(rows, d, rng, polish_sequences(d, n))
        rounds, iterations = polish_plan(n)
        model, report = polish_block(block, data, rounds=rounds, iterations=iterations, target=SETTLED)
        return model, report, sum(len(X) for X, _ in data)
    got = store.get("polish")
    if got is not None:
        block = _block_of(got)
    report = PolishReport([float(h) for h in got["history"]] if got is not None else [],
                          [int(i) for i in got["iterations"]] if got is not None else [])
    count, done = (int(got["sequences"]), bool(got["done"])) if got is not None else (0, False)
    rounds, iterations = polish_plan(n)
    while not done:
        store.pause_if_due(f"stage polish: {len(report.iterations)} of {rounds} steps", share=SITTING_SHARE)
        data = polish_data(rows, d, rng, polish_sequences(d, n))
        block, one = polish_block(block, data, rounds=1, iterations=iterations, target=SETTLED)
        count += sum(len(X) for X, _ in data)
        report.history.extend(one.history[len(report.history) > 0:])
        report.iterations.extend(one.iterations)
        done = len(one.history) < 2 or len(report.iterations) >= rounds or report.history[-1] < SETTLED
        store.put("polish", **{f"block_{k}": v for k, v in block.arrays().items()}, history=report.history,
                  iterations=report.iterations, sequences=count, done=done)
    return block, report, count


def read_neurons(rows, affine, n2, m: int, rng, store=None):
    """Stage neurons (:mod:`.post_norm_neurons`) from ``4m`` points, or through probes past :data:`NEURON_NUMBERS`
    (:mod:`.post_norm_probe_neurons`): ``(A, a, sweeps or Gauss–Newton steps, span residual, curve misfit)``; refused
    (one line) when fewer than ``m`` rank-one elements are found (through probes: the factors not the whole span) or
    a neuron's curve is not a GELU's (:data:`CURVE_MISFIT`)."""
    d = affine.K.shape[0]
    if not on_span(d, m):
        A, a, det = probe_neurons(rows, affine, n2, m, rng, store)
        _curve_check(det["curve_misfit"])
        return A, a, det["gauss_newton_steps"], det["span_residual"], det["curve_misfit"]
    Z, Q, O = sphere_jacobians(rows, affine, n2, rng, 4 * m)
    B, Y, res = neuron_span(Z, Q, O, m)
    elements = rank_one_elements(B, m, rng)
    if len(elements) < m:
        raise UnidentifiableError(f"stage neurons: {len(elements)} of m = {m} rank-one elements found in the "
                                  f"Jacobians' span (residual {res[-1]:.1e} after {len(res)} sweeps)")
    A, a, misfit = neuron_curves(B, Y, elements, Z)
    _curve_check(misfit)
    return A, a, len(res), res[-1], misfit


def _curve_check(misfit: float) -> None:
    if not misfit < CURVE_MISFIT:
        raise UnidentifiableError(f"stage neurons: a neuron's derivative along its direction is {misfit:.1e} off "
                                  "the nearest GELU curve (BERT's FFN activation)")
