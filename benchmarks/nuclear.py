"""The nuclear-norm route (Thm 5.1): phase transition and exact recovery.

    python benchmarks/nuclear.py [--quick]

Writes benchmarks/results/nuclear.json, docs/nuclear_phase_transition.png and the subsections "Nuclear norm:
phase transition" and "Nuclear norm: exact recovery at the default m" of "Low-rank heads (Thm 5.1)" in
docs/benchmarks/lowrank.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners.head.scaling import LogitProbe
from attnprobe.learners.head.nuclear import (
    PHASE_OFFSET,
    PHASE_SLOPE,
    extract_nuclear,
    nuclear_solve,
    polish,
    rop_measurements,
)
from attnprobe.oracles import Oracle
from attnprobe.reports import Table
from sections import write_section
from attnprobe.reports.figures import figure_png, new_figure
from attnprobe.targets import random_head

DOC = "lowrank"  # its results file: docs/benchmarks/lowrank.md
SECTION = "Low-rank heads (Thm 5.1)"

ROOT = Path(__file__).resolve().parents[1]
#: SCS iteration cap for the phase-transition trials: failing instances otherwise grind for many minutes
MAX_ITERS = 20000
warnings.simplefilter("ignore")


def phase_trial(d, r, C, seed, eps):
    """One trial on a bias-free rank-r head with float64 answers: m = C·r·2d queries → (convex err, final err)."""
    h = random_head(d, rank=r, seed=1000 + seed, bias=False)
    o = Oracle(h, d)
    rng = np.random.default_rng(seed)
    m = int(np.ceil(C * r * 2 * d))
    Ga, Gb = rng.standard_normal((m, d)), rng.standard_normal((m, d))
    A, B, t, _ = rop_measurements(LogitProbe(o, h.v, 0.0), Ga, Gb, 1.0, 1.0, np.zeros(d))
    t0 = time.perf_counter()
    W0, _, info = nuclear_solve(A, B, t, "SCS", eps, max_iters=MAX_ITERS)
    secs = time.perf_counter() - t0
    e0 = float(np.linalg.norm(W0 - h.W) / np.linalg.norm(h.W))
    W1, _ = polish(W0, A, B, t, r)
    e1 = float(np.linalg.norm(W1 - h.W) / np.linalg.norm(h.W))
    return m, e0, e1, secs


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--part", choices=["phase", "exact", "all"], default="all",
                   help="run only the phase transition or only the exact-recovery table (the other part is "
                        "read from the previous results file)")
    p.add_argument("--report-only", action="store_true", help="rewrite the tables and plot from the results file")
    p.add_argument("--from-log", help="take phase rows printed by an earlier run (its log) instead of re-running them")
    p.add_argument("--sizes", default="16,32,64", help="d values of the phase grid to run")
    args = p.parse_args(argv)
    if args.report_only:
        prev = json.loads((ROOT / "benchmarks" / "results" / "nuclear.json").read_text())
        return write_report(prev["phase"], prev["exact"], prev["commands"], stamp=False)
    eps = 1e-8
    grid = {16: ([1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0], 6),
            32: ([1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0], 4),
            64: ([1.5, 2.0, 2.5, 3.0, 4.0], 1)}
    if args.quick:
        grid = {16: ([1.0, 2.0, 3.0], 2)}
    out = ROOT / "benchmarks" / "results"
    prev = json.loads((out / "nuclear.json").read_text()) if (out / "nuclear.json").exists() else {}
    rows = prev.get("phase", []) if args.part == "exact" else []
    if args.from_log:
        for line in Path(args.from_log).read_text().splitlines():
            if line.startswith("d="):
                f = line.split()
                rows.append(dict(d=int(f[0][2:]), r=int(f[1][2:]), C=float(f[2][2:]), seed=int(f[3][5:]),
                                 m=int(f[4][2:]), convex_err=float(f[6]), final_err=float(f[8]),
                                 solve_seconds=float(f[9][:-1])))
    sizes = {int(x) for x in args.sizes.split(",")}
    for d, (Cs, trials) in (grid.items() if args.part != "exact" else []):
        if d not in sizes:
            continue
        for r in (1, 2, 4):
            for C in Cs:
                for s in range(trials):
                    m, e0, e1, secs = phase_trial(d, r, C, s, eps)
                    rows.append(dict(d=d, r=r, C=C, seed=s, m=m, convex_err=e0, final_err=e1, solve_seconds=secs))
                    print(f"d={d} r={r} C={C} seed={s} m={m} convex {e0:.2e} polished {e1:.2e} {secs:.1f}s",
                          flush=True)
    # exact recovery through the full learner (biased heads, default m)
    exact = prev.get("exact", []) if args.part == "phase" else []
    for d in ((16, 32, 64) if args.part != "phase" else ()):
        for r in (1, 2, 4):
            h = random_head(d, rank=r, seed=7)
            o = Oracle(h, d)
            try:
                res = extract_nuclear(o, rank=r, seed=0, solver_eps=eps)
                errW = float(np.linalg.norm(res.model.W - h.W) / np.linalg.norm(h.W))
                row = dict(d=d, r=r, m=res.details["measurements"], queries=res.queries, errW=errW,
                           erru=float(np.linalg.norm(res.model.u - h.u) / np.linalg.norm(h.u)),
                           check=res.check.error, seconds=res.seconds,
                           solve=res.details["solver_info"]["solve_seconds"], status="ok")
            except AttnprobeError as exc:
                row = dict(d=d, r=r, status=f"{type(exc).__name__}: {exc}")
            exact.append(row)
            print(row, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nuclear.json").write_text(json.dumps({"phase": rows, "exact": exact, "eps": eps}, indent=1))
    cmds = prev.get("commands", {}) if args.part != "all" else {}
    cmd = " ".join(["python benchmarks/nuclear.py"] + (argv or sys.argv[1:]))
    for part in (("phase", "exact") if args.part == "all" else (args.part,)):
        cmds[part] = cmd
    (out / "nuclear.json").write_text(json.dumps({"phase": rows, "exact": exact, "eps": eps,
                                                         "commands": cmds}, indent=1))
    write_report(rows, exact, cmds)


def write_report(rows, exact, cmds, stamp=True):
    fig, ax = new_figure(7, 4.2)
    phase = Table(["d", "r", "C = m/(2dr) grid", "success after polish", "success, convex program alone",
                   "smallest C with 100 % (convex) from there on"])
    for (d, r) in sorted({(x["d"], x["r"]) for x in rows}):
        sel = [x for x in rows if x["d"] == d and x["r"] == r]
        Cs = sorted({x["C"] for x in sel})
        rate = [np.mean([x["final_err"] <= 1e-6 for x in sel if x["C"] == C]) for C in Cs]
        rate0 = [np.mean([x["convex_err"] <= 1e-4 for x in sel if x["C"] == C]) for C in Cs]
        color = {1: "C0", 2: "C1", 4: "C2"}.get(r, "C3")
        style = {16: ("o", "-"), 32: ("s", "--"), 64: ("^", "-.")}.get(d, ("x", "-"))
        ax.plot(Cs, rate0, marker=style[0], ls=style[1], color=color, label=f"d={d}, r={r}")
        ax.plot(Cs, rate, ls=":", color=color, alpha=0.5)
        first = next((C for C in Cs if all(q >= 1.0 for C2, q in zip(Cs, rate0) if C2 >= C)), None)
        phase.add(d, r, ", ".join(f"{C:g}" for C in Cs), ", ".join(f"{s:.2f}" for s in rate),
                  ", ".join(f"{s:.2f}" for s in rate0), first if first is not None else "—")
    ax.axvline(1.0, color="grey", ls="--", lw=1)
    ax.text(1.02, 0.5, "m = 2dr\n(≈ degrees of freedom)", fontsize=7, color="grey")
    ax.set_xlabel("m / (r · 2d)")
    ax.set_ylabel("success rate")
    ax.set_title("nuclear-norm recovery (Thm 5.1): solid = convex program alone (err ≤ 1e-4),\n"
                 "dotted = after the rank-r polish (err ≤ 1e-6)", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    figure_png(fig, ROOT / "docs" / "nuclear_phase_transition.png", dpi=120)
    write_section("Nuclear norm: phase transition", "(float64 answers, SCS eps 1e-8; success = relative error of W "
                  "≤ 1e-6 after the polish; the convex solution alone is also shown as ≤ 1e-4)\n\n" + phase.markdown()
                  + "\n\n![phase transition](../nuclear_phase_transition.png)", cmds.get("phase", "?"),
                  parent=SECTION, stamp=stamp, doc=DOC)
    ex = Table(["d", "r", "m", "queries", "rel. error W", "rel. error u", "functional check",
                "seconds (noisy, shared 2 cores)"])
    for x in exact:
        if x["status"] == "ok":
            ex.add(x["d"], x["r"], x["m"], x["queries"], f"{x['errW']:.1e}", f"{x['erru']:.1e}", f"{x['check']:.1e}",
                   f"{x['seconds']:.1f}")
        else:
            ex.add(x["d"], x["r"], "—", "—", x["status"], "", "", "")
    write_section("Nuclear norm: exact recovery at the default m", "Exact recovery through `extract_nuclear` "
                  f"(biased random heads, default m = ⌈2d·({PHASE_SLOPE}·r + {PHASE_OFFSET})⌉, float64 answers):\n\n"
                  + ex.markdown(), cmds.get("exact", "?"), parent=SECTION, stamp=stamp, doc=DOC)


if __name__ == "__main__":
    main()
