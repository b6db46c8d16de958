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


def protection(errors: list[float]) -> str:
    """Measured protection of a defence from the recovered heads' W errors (none / partial / strong)."""
    if not errors:
        return "strong: no head was recovered"
    worst_case = min(errors)  # the attacker's best head is the defender's worst case
    if worst_case < NO_PROTECTION:
        return "none"
    return "partial" if worst_case < PROTECTS else "strong"


def verdicts(run) -> Table:
    """One row per defence: what an attacker recovers and at what query cost."""
    t = Table(["defence", "heads recovered / tasks", "W rel. error (median)", "W rel. error (best for the "
               "attacker)", "queries per head (median)", "protection", "verdict"])
    for name in run.defenses:
        recs = [r for r in run.records if r["defense"] == name]
        ok = [r for r in recs if not r["error"]]
        errs = [r["relative_error"]["W"] for r in ok]
        queries = [r["queries"] for r in ok]
        label = "undefended" if name == "none" else name
        if ok:
            verdict = (f"{label} answers: W recovered to {np.median(errs):.0e} with {_k(np.median(queries))} "
                       f"queries ({sum(r['passed'] for r in ok)}/{len(ok)} pass the functional check)")
        else:
            first = recs[0]["error"].splitlines()[0] if recs else "no task finished"
            verdict = f"{label} answers: no head recovered ({first})"
        t.add(name, f"{len(ok)}/{len(recs)}", float(np.median(errs)) if errs else None,
              float(min(errs)) if errs else None, int(np.median(queries)) if queries else None,
              protection(errs), verdict)
    return t


def _grid(run, defense: str, value) -> tuple[np.ndarray, list[int], list[int]]:
    layers = sorted({t.head.layer for t in run.tasks})
    heads = sorted({t.head.head for t in run.tasks})
    grid = np.full((len(layers), len(heads)), np.nan)
    for r in run.records:
        if r["defense"] == defense and not r["error"]:
            grid[layers.index(r["layer"]), heads.index(r["head"])] = value(r)
    return grid, layers, heads


def write_report(run, path: str | Path) -> Path:
    rep = HtmlReport(f"attnprobe audit: {run.info.get('model', 'model')}")
    failed = [r for r in run.records if r["error"]]
    rep.paragraph(f"{len(run.records)} of {len(run.tasks)} tasks finished on the {run.engine} engine in "
                  f"{run.seconds:.1f} s; {len(failed)} failed. Method {run.info.get('method', '?')}, seed "
                  f"{run.info.get('seed', 0)}. Errors are relative errors against the true weights, which "
                  "the auditor has and the attacker does not.")
    if run.interrupted:
        rep.paragraph("The audit was interrupted: only the finished tasks are shown.", cls="fail")
    rep.heading("Verdict per defence")
    rep.table(verdicts(run))
    rep.paragraph(f"Protection: none when some head's W is recovered to better than {NO_PROTECTION:g}, partial "
                  f"when the best is below {PROTECTS:g}, strong otherwise (or when no head is recovered).")
    for name in run.defenses:
        rep.heading(f"Defence: {name}")
        err, layers, heads = _grid(run, name, lambda r: r["relative_error"]["W"])
        rep.image(heatmap_png(err, title=f"{name}: relative error of W", xlabel="head", ylabel="layer",
                              colorbar="‖Ŵ−W‖/‖W‖", vmin=-16, vmax=1), alt=f"{name}: W error per head")
        q, _, _ = _grid(run, name, lambda r: r["queries"])
        rep.image(heatmap_png(q, title=f"{name}: queries per head", xlabel="head", ylabel="layer",
                              colorbar="queries"), alt=f"{name}: queries per head")
        rep.paragraph(f"Rows: layers {layers}; columns: heads {heads}; grey × = failed or not run.")
    if failed:
        rep.heading("Failures")
        t = Table(["layer", "head", "defence", "queries spent", "error"])
        for r in failed:
            t.add(r["layer"], r["head"], r["defense"], r["queries"], r["error"].splitlines()[0])
        rep.table(t)
    rep.heading("Every task")
    t = Table(["layer", "head", "defence", "method", "queries", "unknowns", "W", "v", "u", "c", "check error",
               "passed", "seconds"])
    for r in run.records:
        e = r["relative_error"]
        t.add(r["layer"], r["head"], r["defense"], r["method"], r["queries"], r["unknowns"], e.get("W"),
              e.get("v"), e.get("u"), e.get("c"), r["check_error"], r["passed"] if not r["error"] else "failed",
              round(r["seconds"], 2))
    rep.table(t)
    return rep.write(path)
