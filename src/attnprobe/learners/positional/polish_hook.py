"""The positional learners' polish hook (:func:`polish_extraction`): after a learner, the joint polish of
:mod:`.polish` on fresh last-position answers, or of :mod:`.row_polish` on every-position rows when the oracle
answers causal rows; the polished model kept only when a fresh check says it is closer."""

from __future__ import annotations

import math
import time

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.positional import PositionalAttention
from attnprobe.learners.positional.polish import (CHECKED, HOOK_CG_STEPS, HOOK_ROUNDS, MIN_GAIN, POLISH_LENGTHS,
                                                  POLISH_MODES, POLISH_SEQUENCES, POLISH_TARGET, absent_biases,
                                                  capped_steps, fresh_answers, held_at_zero, polish)
from attnprobe.learners.positional.row_polish import ROW_LENGTH, chunk_precision, fresh_rows, polish_rows


def serves_causal_rows(oracle) -> bool:
    """Whether ``oracle`` is known to answer every position of a causal layer (declared, or already read from its
    answers: reading it here would ask queries)."""
    known = getattr(oracle, "every_position", False) is not False and getattr(oracle, "positions_source", None)
    return bool(known) and oracle.positions == "causal"


def causal_rows(oracle, model) -> bool:
    """Whether ``oracle`` serves causal rows (:func:`serves_causal_rows`) and ``model`` is causal: the polish can
    read every row."""
    return serves_causal_rows(oracle) and bool(getattr(model, "causal", False))


def polish_sequences(unknowns: int, outputs: int, per: float = POLISH_SEQUENCES) -> int:
    """The hook's default number of fresh sequences: ``per · ⌈unknowns / K⌉`` (each answers K numbers)."""
    return int(math.ceil(per * math.ceil(unknowns / max(1, outputs))))


def polish_queries(unknowns: int, outputs: int, check_queries: int, sequences: int | None = None) -> int:
    """Queries :func:`polish_extraction` asks when it polishes: the fresh sequences and the polished model's check."""
    return (sequences or polish_sequences(unknowns, outputs)) + check_queries


def rows_polished(model: PositionalAttention, data, *, slow_mixing: bool, pair_signs: int, biases: bool,
                  rounds: int, **options):
    """The hook's polish on every-position rows ``data`` (one batch): the slow pairs' split refitted first
    (``slow_mixing``: :func:`~.slow_mixing.fit_slow_mixing`, the q/k biases mixed with their rows when ``biases``),
    ``rounds`` rounds of :func:`~.row_polish.polish_rows` with ``options``; then, with ``pair_signs`` (a number of
    sequences), the slow pairs' signs tested on that many of the rows (:func:`~.pair_signs.choose_pair_signs`) and,
    when one flipped, the tested model polished ``TEST_ROUNDS`` more rounds on every row. The signs are read here,
    after the rows have settled the slow pairs: the route's own test (``rows_start``, 16 sequences) runs while they
    are still 1.1 … 1.9 off either way, and on Qwen2 d = 128 it left a group's lowest pair conjugated, which the
    polish never turns back (docs/positional.md, "The sign test after the hook's polish"). Returns the model, the
    polish's :class:`~.polish.PolishReport` and a dict of what was measured."""
    measured = {}
    if slow_mixing:
        from attnprobe.learners.positional.slow_mixing import fit_slow_mixing, mixing_pairs

        model, measured["polish_slow_mixing"] = fit_slow_mixing(model, data, mixing_pairs(model, ROW_LENGTH),
                                                                compute=options["compute"], biases=biases)
    model, report = polish_rows(model, data, rounds=rounds, **options)
    if pair_signs:
        from dataclasses import replace

        from attnprobe.learners.positional.pair_signs import TEST_ROUNDS, choose_pair_signs

        (X, Y), = data
        tested, signs = choose_pair_signs(model, [(X[:pair_signs], Y[:pair_signs])], polish_options=options)
        measured["polish_pair_signs"] = signs
        if signs["flipped"]:  # else the polish on every row stands (the test's own rounds saw fewer)
            model, after = polish_rows(tested, data, rounds=TEST_ROUNDS, **options)
            report = replace(report, misfit_after=after.misfit_after, rounds=report.rounds + after.rounds)
    return model, report, measured


def polish_extraction(oracle, res, *, mode: str = "auto", target: float = POLISH_TARGET, sequences: int | None = None,
                      seed: int = 0, lengths=POLISH_LENGTHS, rounds: int = HOOK_ROUNDS, cg_steps: int = HOOK_CG_STEPS,
                      frequencies: bool = True, relative: bool = False, progress=None, rows: bool | None = None,
                      work: float | None = None, slow_mixing: bool = False, pair_signs: int = 0,
                      min_gain: float = MIN_GAIN):
    """The learners' hook: polish ``res.model`` (a :class:`PositionalAttention` result of ``oracle``) on
    ``sequences`` fresh last-position answers (default :func:`polish_sequences`) when ``mode`` is ``always``, or
    ``auto`` and the check's error is above ``target``; then a fresh functional check (the lengths and count of
    ``res.check``, in its norm) of the polished model, kept only when its error is below the learner's;
    ``relative``: residuals weighed relative to each length's spread (:func:`length_weights`); ``rows``: polish on
    every-position answers (:func:`~.row_polish.polish_rows`: ``sequences`` counts rows, asked in sequences of
    :data:`~.row_polish.ROW_LENGTH` tokens, computed in float32 for answers no finer; default: when the oracle is
    known to answer causal rows and the model is causal); ``work``: the last-position polish's rounds and
    conjugate-gradient steps cut to this work cap (:func:`~.polish.capped_steps`); ``slow_mixing``: on rows, the
    slow pairs' split refitted first (:func:`~.slow_mixing.fit_slow_mixing`), ``pair_signs``: on rows, their signs
    tested after the polish (:func:`rows_polished`), and ``min_gain`` (0: every round) as
    :func:`~.row_polish.polish_rows` takes it; the biases the oracle's layer declares
    it has not are held at zero (:func:`~.polish.absent_biases`). The result's check is
    the returned model's (counted apart, as every learner's); every other query the hook asks, and the learner's
    check when its model is replaced, is counted in ``res.queries`` and ``res.queries_by_phase`` (``polish``,
    ``polish check``); ``res.details["polish"]`` and a note say what happened. Returns ``res`` (changed in
    place)."""
    from attnprobe.learners.core.check import functional_check
    from attnprobe.learners.core.skeleton import without_check_notes

    if mode not in POLISH_MODES:
        raise ConfigError(f"polish must be one of {', '.join(POLISH_MODES)}; got {mode!r}", param="polish")
    if not (isinstance(target, (int, float)) and math.isfinite(target) and target >= 0):
        raise ConfigError(f"polish_target must be a finite number ≥ 0; got {target!r}", param="polish_target")
    if mode == "never" or not isinstance(res.model, PositionalAttention):
        return res
    learner_check = check = res.check
    if mode == "auto":
        if check is None:
            res.details["polish"] = {"ran": False, "why": "no functional check to compare with"}
            return res
        if check.error <= target:
            res.details["polish"] = {"ran": False, "why": f"check error {check.error:.1e} ≤ target {target:.1e}"}
            return res
    n = sequences or polish_sequences(res.unknowns, res.model.outputs)
    rng = np.random.default_rng([int(seed), 0x9011])
    lengths_checked = tuple(check.lengths) if check is not None else CHECKED
    per_length = max(1, check.queries // max(1, len(check.lengths))) if check is not None else 8
    before = oracle.queries
    t0 = time.perf_counter()
    if rows is None:
        rows = causal_rows(oracle, res.model)
    with oracle.phase("polish", fresh=True):
        if rows:
            n = -(-n // ROW_LENGTH)
            data = fresh_rows(oracle, n, rng)
        else:
            data = fresh_answers(oracle, n, rng, lengths)
    if progress is not None:
        progress(res.queries + oracle.queries - before, res.queries + oracle.queries - before)
    held = absent_biases(oracle)
    if rows:
        model, report, measured = rows_polished(
            held_at_zero(res.model, held), data, slow_mixing=slow_mixing, pair_signs=pair_signs,
            biases=bool(res.details.get("biases")), frequencies=frequencies, rounds=rounds, cg_steps=cg_steps,
            relative=relative, compute=chunk_precision(oracle.precision), held=held, min_gain=min_gain)
        res.details.update(measured)
    else:
        if work is not None:
            rounds, cg_steps = capped_steps(n, res.unknowns, rounds, cg_steps, work)
        model, report = polish(res.model, data, frequencies=frequencies, rounds=rounds, cg_steps=cg_steps,
                               relative=relative, held=held)
    with oracle.phase("check", fresh=True):
        if check is None:
            check = functional_check(oracle, res.model, rng, lengths_checked, per_length)
        norm = check.extra.get("norm", "rms")  # the learner's check's norm: the error it claims
        new = functional_check(oracle, model, rng, lengths_checked, per_length, norm=norm)
    kept = bool(np.isfinite(new.error) and new.error < check.error)
    # the result carries one check, counted apart (Extraction); every other query is the extraction's own: what the
    # hook asked, plus the check counted apart before, less the check counted apart now
    returned = new if kept else check
    other = (oracle.queries - before - n + (learner_check.queries if learner_check is not None else 0)
             - returned.queries)
    res.queries += n + other
    for phase, count in (("polish", n), ("polish check", other)):
        if count:
            res.queries_by_phase[phase] = res.queries_by_phase.get(phase, 0) + count
    res.check = returned
    res.details["polish"] = {"ran": True, "kept": kept, "check_before": check.error, "check_after": new.error,
                             "seconds": time.perf_counter() - t0, "planned_rounds": rounds, "cg_steps": cg_steps,
                             **report.to_dict()}
    if kept:
        res.model = model
        if not check.passed:  # the learner's failed-check note no longer describes the result
            res.notes = without_check_notes(res.notes)
        if not new.passed:
            res.notes.append(f"functional check FAILED after the polish: {new.describe()}")
    res.seconds += time.perf_counter() - t0
    res.notes.append(f"joint polish on {report.sequences} fresh sequences ({report.unknowns} unknowns, "
                     f"{report.rounds} rounds): misfit {report.misfit_before:.1e} → {report.misfit_after:.1e}, "
                     f"fresh check {check.error:.1e} → {new.error:.1e}; "
                     + ("kept" if kept else "not kept (no better on fresh sequences)"))
    return res
