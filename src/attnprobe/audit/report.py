"""The audit's ``report.html``: a verdict per defence, heatmaps of W's error and of the queries over
(layer, head), failures, and every task — one self-contained page (figures embedded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnprobe.reports import HtmlReport, Table, heatmap_png

#: W's relative error below which a defence gives no protection, and above which it protects W
NO_PROTECTION, PROTECTS = 1e-3, 1e-1


def _k(n: float) -> str:
    return f"{n / 1000:.0f}k" if n >= 10_000 else f"{n:.0f}"


def protection(errors: list[float], tried: list[str] | None = None, passed: list[bool] | None = None,
               untried: list[str] | None = None, unit: str = "head", undefended: bool = False) -> str:
    """Measured protection of a defence from the recovered heads' W errors (none / partial / strong): the
    attacker's best head over every learner ``tried`` is the defender's worst case. A recovered model that
    passes its functional check imitates the defended answers, so the defence is at most partial then; "strong"
    means that every learner tried failed, and only when no learner that fits the answers was left ``untried``
    (then it is "unknown", naming them: an audit narrowed by ``--method`` measured less than the attacker has).
    Nothing recovered from ``undefended`` answers is a limit of the learners, not a protection: "unknown"."""
    by = f" by {', '.join(tried)}" if tried else ""
    left = f"; not tried, though they fit these answers: {', '.join(untried)}" if untried else ""
    if not errors:
        if undefended:
            return f"unknown: no {unit} was recovered{by} from undefended answers (a limit of the learners){left}"
        return f"unknown: no {unit} was recovered{by}{left}" if untried else f"strong: no {unit} was recovered{by}"
    worst_case = min(errors)
    if worst_case < NO_PROTECTION:
        return "none"
    if worst_case < PROTECTS or any(passed or ()):
        return f"partial at most{left}" if untried else "partial"
    if untried:
        return f"unknown: every learner tried failed ({', '.join(tried or [])}){left}"
    return f"strong: every learner failed ({', '.join(tried or [])})"


def untried_learners(run, defense: str, tried: list[str]) -> list[str]:
    """The learners that fit the answers ``defense`` leaves and could run with the audit's options, but were not
    among those ``tried`` (``--method`` narrowed the list)."""
    from attnprobe.audit.tasks import fitting_learners
    from attnprobe.learners.core import registry

    tasks = [t for t in run.tasks if t.defense.name == defense]
    if not tasks:
        return []
    kind, rank = tasks[0].head.kind, tasks[0].rank
    fits = fitting_learners(tasks[0].defense, kind.whole_layer, kind.vector, recovers=kind.learner_kind)
    given = {"rank": rank, "heads": tasks[0].head.heads_per_layer}
    return [n for n in fits if n not in tried and registry.learner(n).ready(given)]


def score(r) -> float:
    """What a record is ranked by: W's relative error, or a block's function error (a block's weights are fixed
    by the answers only up to gauges: norm weights folded, RoPE pairs, heads; docs/block.md)."""
    e = r["relative_error"]
    return e["W"] if "W" in e else e["function"]


def unit(run) -> str:
    """What one task of the run covers, as the report names it: ``block``, ``layer`` or ``head``."""
    if any(t.head.block for t in run.tasks):
        return "block"
    return "layer" if any(t.head.head is None for t in run.tasks) else "head"


def best_records(run, defense: str) -> dict:
    """Per (layer, head): the finished record of ``defense`` with the smallest W error over the learners that
    ran on it (the attacker keeps the best)."""
    best: dict = {}
    for r in run.records:
        if r["defense"] == defense and not r["error"]:
            key = (r["layer"], r["head"])
            if key not in best or score(r) < score(best[key]):
                best[key] = r
    return best


def cheapest_records(run, defense: str) -> dict:
    """Per (layer, head): the finished record of ``defense`` that passed its functional check with the fewest
    queries (the cheapest attack that succeeds: what a defender must price)."""
    cheap: dict = {}
    for r in run.records:
        if r["defense"] == defense and not r["error"] and r["passed"]:
            key = (r["layer"], r["head"])
            if key not in cheap or r["queries"] < cheap[key]["queries"]:
                cheap[key] = r
    return cheap


def _cheapest(run, defense: str, per: str) -> str:
    """The verdict's clause on the cheapest attack that succeeds (per head or layer)."""
    cheap = list(cheapest_records(run, defense).values())
    if not cheap:
        return "; no attack passed its functional check"
    learners = ", ".join(f"{m} ×{n}" for m, n in _counts(r["method"] for r in cheap))
    errs = [e for r in cheap for e in _head_w_errors(r)]
    return (f"; cheapest attack that succeeds per {per}: {learners}, {_k(np.median([r['queries'] for r in cheap]))} "
            f"queries (median), {'function' if per == 'block' else 'W'} to {np.median(errs):.0e}")


def _kinds(run) -> str:
    """The task kinds of the run, each with what one task extracts (:data:`attnprobe.audit.tasks.TASK_KINDS`)."""
    kinds = dict.fromkeys(t.head.kind for t in run.tasks)
    return "; ".join(f"{k.name} ({k.help})" for k in kinds)


def _head_w_errors(r) -> list[float]:
    """W's error of each head a record recovered: one for a head task, one per true head for a whole layer (a
    block's function error for a block)."""
    return list(r.get("head_W_errors") or [score(r)])


def _heads_asked(run, name: str) -> int:
    """Heads the tasks of defence ``name`` cover (a whole-layer task covers every head of its layer)."""
    heads = set()
    for spec in {t.head for t in run.tasks if t.defense.name == name}:
        count = spec.checkpoint().heads_per_layer if spec.head is None and not spec.block else 1
        heads.update((spec.layer, h) for h in ([spec.head] if spec.head is not None else range(count)))
    return len(heads)


def verdicts(run) -> Table:
    """One row per defence: the learners tried, what the best of them recovers and at what query cost (a
    whole-layer task's heads are counted one by one, matched to the true heads up to permutation)."""
    per = unit(run)
    what, err = ("blocks", "function") if per == "block" else ("heads", "W")
    t = Table(["defence", "learners tried", f"{what} recovered / {what}", f"{err} rel. error (median)",
               f"{err} rel. error (best for the attacker)", f"queries per {per} (median)", "protection", "verdict"])
    for name in run.defenses:
        recs = [r for r in run.records if r["defense"] == name]
        tried = list(dict.fromkeys(t.learner for t in run.tasks if t.defense.name == name))
        best = list(best_records(run, name).values())
        errs = [e for r in best for e in _head_w_errors(r)]
        queries = [r["queries"] for r in best]
        label = "undefended" if name == "none" else name
        if best:
            winners = ", ".join(f"{m} ×{n}" for m, n in _counts(r["method"] for r in best))
            got = (f"the block's function recovered to {np.median(errs):.0e} (worst position of N = 1 … 64, over "
                   f"|y − x|)" if per == "block" else f"W recovered to {np.median(errs):.0e}")
            verdict = (f"{label} answers: {got} with {_k(np.median(queries))} "
                       f"queries{'' if per == 'head' else f' per {per}'} ({sum(r['passed'] for r in best)}/{len(best)} "
                       f"pass the functional check); best learner per {per}: {winners}"
                       + _cheapest(run, name, per))
        else:
            first = recs[0]["error"].splitlines()[0] if recs else "no task finished"
            verdict = f"{label} answers: no {'block' if per == 'block' else 'head'} recovered ({first})"
        t.add(name, ", ".join(tried), f"{len(errs)}/{_heads_asked(run, name)}",
              float(np.median(errs)) if errs else None, float(min(errs)) if errs else None,
              int(np.median(queries)) if queries else None,
              protection(errs, tried, [bool(r["passed"]) for r in recs if not r["error"]],
                         untried_learners(run, name, tried), per, undefended=name == "none"), verdict)
    return t


def _counts(items) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return list(out.items())


def _grid(run, defense: str, value) -> tuple[np.ndarray, list[int], list[int]]:
    """(layers × heads) array of ``value(record, head)`` over the best record of each head; a whole-layer task
    fills every head of its layer."""
    layers = sorted({t.head.layer for t in run.tasks})
    heads = sorted({h for t in run.tasks for h in ([t.head.head] if t.head.head is not None else [0] if t.head.block
                                                    else range(t.head.checkpoint().heads_per_layer))})
    grid = np.full((len(layers), len(heads)), np.nan)
    for r in best_records(run, defense).values():
        for h in ([r["head"]] if r["head"] is not None else heads):
            grid[layers.index(r["layer"]), heads.index(h)] = value(r, h)
    return grid, layers, heads


def _w_error(r, h) -> float:
    """W's error of head h: per head for a whole-layer task (heads matched up to permutation); a block's function
    error."""
    return r["head_W_errors"][h] if r.get("head_W_errors") else score(r)


def write_report(run, path: str | Path) -> Path:
    rep = HtmlReport(f"attnprobe audit: {run.info.get('model', 'model')}")
    failed = [r for r in run.records if r["error"]]
    rep.paragraph(f"{len(run.records)} of {len(run.tasks)} tasks finished on the {run.engine} engine in "
                  f"{run.seconds:.1f} s; {len(failed)} failed. Tasks: {_kinds(run)}. Learners: "
                  f"{run.info.get('method', '?')}, seed "
                  f"{run.info.get('seed', 0)}. Errors are relative errors against the true weights, which "
                  "the auditor has and the attacker does not.")
    if run.interrupted:
        rep.paragraph("The audit was interrupted: only the finished tasks are shown.", cls="fail")
    rep.heading("Verdict per defence")
    rep.table(verdicts(run))
    rep.paragraph(f"Protection: none when some head's W is recovered to better than {NO_PROTECTION:g} by some "
                  f"learner, partial when the best is below {PROTECTS:g} or a recovered model passes its functional "
                  "check (it imitates the defended answers), strong only when every learner tried failed and every "
                  "learner that fits the answers was tried (else unknown, naming those not tried).")
    blocks = unit(run) == "block"
    for name in run.defenses:
        rep.heading(f"Defence: {name}")
        err, layers, heads = _grid(run, name, _w_error)
        cols, xlabel = (["block"], "") if blocks else (heads, "head")
        what, bar = ("the block's function", "max|ŷ−y| / max|y−x|") if blocks else ("W", "‖Ŵ−W‖/‖W‖")
        rep.image(heatmap_png(err, title=f"{name}: relative error of {what}", xlabel=xlabel, ylabel="layer",
                              colorbar=bar, vmin=-16, vmax=1, rows=layers, cols=cols),
                  alt=f"{name}: {what} error per {unit(run)}")
        q, _, _ = _grid(run, name, lambda r, h: r["queries"])
        per = {"block": "block", "layer": "layer (whole-layer tasks)", "head": "head"}[unit(run)]
        rep.image(heatmap_png(q, title=f"{name}: queries per {per}", xlabel=xlabel, ylabel="layer",
                              colorbar="queries", rows=layers, cols=cols), alt=f"{name}: queries per {per}")
        rep.paragraph(f"Rows: layers {layers}; " + ("one cell per block" if blocks else f"columns: heads {heads}")
                      + f"; each cell shows the best learner's {unit(run)}; grey × = failed or not run.")
    if failed:
        rep.heading("Failures")
        t = Table(["layer", "head", "defence", "queries spent", "error"])
        for r in failed:
            t.add(r["layer"], r["head"], r["defense"], r["queries"], r["error"].splitlines()[0])
        rep.table(t)
    rep.heading("Every task")
    if blocks:
        rep.table(block_rows(run))
        rep.paragraph("Function error: the recovered block against the true one at every position of 2 fresh "
                      "sequences of each length 1 … 64, the largest error over the largest entry of the block's own "
                      "part y − x, at the worst length (N); the check error is the learner's own, against the "
                      "answers. A refused block names its cause.")
        return rep.write(path)
    t = Table(["layer", "head", "defence", "method", "queries", "unknowns", "W", "v", "u", "c", "check error",
               "passed", "seconds"])
    for r in run.records:
        e = r["relative_error"]
        t.add(r["layer"], r["head"], r["defense"], r["method"], r["queries"], r["unknowns"], e.get("W"),
              e.get("v"), e.get("u"), e.get("c"), r["check_error"], r["passed"] if not r["error"] else "failed",
              round(r["seconds"], 2))
    rep.table(t)
    return rep.write(path)


def block_rows(run) -> Table:
    """One row per block task: verdict, queries (the check's apart), the function error against the true block and
    its worst length, the check error, ε read, seconds; a refused or failed block its cause."""
    t = Table(["block", "defence", "method", "verdict", "queries", "check queries", "unknowns", "function error",
               "worst N", "check error", "ε", "seconds"])
    for r in run.records:
        e = r["relative_error"].get("function")
        verdict = ("passed" if r["passed"] else "check failed") if not r["error"] else \
            ("refused: " if r["error"].startswith("UnidentifiableError") else "failed: ") + \
            r["error"].splitlines()[0].split(": ", 1)[-1]
        t.add(r["layer"], r["defense"], r["method"], verdict, r["queries"], r["check_queries"], r["unknowns"], e,
              r.get("worst_length"), r["check_error"], r.get("eps"), round(r["seconds"], 2))
    return t
