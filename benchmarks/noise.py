"""Noisy answers (Thm 6.1): the paper's algorithm against its guarantee over a grid of d, τ, seeds and both AVQ
oracles; our default against the paper at the same τ and query budget; error against extra queries; error
against τ with the guarantee drawn as a line (docs/robust_tau.png); the same on a real MiniLM head
(docs/minilm_tau.png).

    python benchmarks/noise.py [--tables theorem,minilm]
"""

from __future__ import annotations

import argparse

import numpy as np

from attnprobe.learners.head.robust import (
    extract_robust,
    extract_robust_paper,
    theorem_guarantee,
)
from attnprobe.models import AttentionHead
from attnprobe.oracles import Oracle
from attnprobe.oracles.wrappers import AdversarialNoise, BoundedNoise, FreshNoise
from attnprobe.reports import Table
from sections import DOCS, command_line, write_section
from attnprobe.reports.figures import figure_png, new_figure
from attnprobe.targets import minilm_head
from attnprobe.targets.theorem_heads import margin, theorem_head

W_BOUND = 2.0
ORACLES = {"avq": lambda h, t, s: BoundedNoise(h, t, seed=s), "adversarial": lambda h, t, s: AdversarialNoise(h, t)}

DOC = "noise"  # its results file: docs/benchmarks/noise.md
SECTION = "Noisy answers (Thm 6.1)"


def write_fragment(title, command, table, extra=""):
    """One subsection of docs/benchmarks/noise.md: the table, then what to read in it."""
    write_section(title, f"{table}\n{extra}", command, parent=SECTION, doc=DOC)
    print(table)


def err_w(res, h):
    return float(np.linalg.norm(res.model.W - h.W))


def guarantee_grid():
    rows, worst = [], 0.0
    for d in (4, 8, 16, 32):
        for zero in (0, 1):
            for tau_rel in (1e-6, 1e-4, 1e-2, 0.25):
                ratios, rv, qs, n = [], [], set(), 0
                for seed in range(5):
                    h = theorem_head(d, seed, W_BOUND, zero_v=zero)
                    mu = margin(h)
                    tau = 0.4999 * mu if tau_rel == 0.25 else tau_rel * mu
                    for name, mk in ORACLES.items():
                        o = Oracle(mk(h, tau, seed), d)
                        r = extract_robust_paper(o, w_bound=W_BOUND, margin=mu, tolerance=tau, check=False)
                        g = r.details["guarantee"]
                        ratios.append(err_w(r, h) / g["eps_W"])
                        rv.append(np.linalg.norm(r.model.v - h.v) / g["eps_v"])
                        qs.add(r.queries)
                        n += 1
                worst = max(worst, max(ratios), max(rv))
                ok = max(ratios) <= 1 and max(rv) <= 1 + 1e-9
                rows.append([d, zero, f"{tau_rel:g}·μ" if tau_rel != 0.25 else "≈μ/2", n, f"{max(ratios):.2e}",
                             f"{max(rv):.6f}", "yes" if ok else "NO", ",".join(map(str, sorted(qs))), d + d * d])
    table = Table(["d", "zero v entries", "τ", "runs (5 seeds × avq/adversarial)",
                      "max ‖Ŵ−W‖_F / ε_W", "max ‖v̂−v‖ / ε_v (adversary sits on the bound)", "within guarantee",
                      "queries", "d + d²"], rows).markdown()
    return table, worst


def compare():
    rows = []
    for d in (16, 64):
        for tau in (1e-6, 1e-4, 1e-3):
            for name, mk in ORACLES.items():
                ep, eo, qp, qo, e0, q0 = [], [], [], [], [], []
                for seed in range(3):
                    h = theorem_head(d, seed, W_BOUND)
                    mu = margin(h)
                    rp = extract_robust_paper(Oracle(mk(h, tau, seed), d), w_bound=W_BOUND, margin=mu,
                                              tolerance=tau, check=False)
                    ro = extract_robust(Oracle(mk(h, tau, seed), d), bias=False, tolerance=tau, seed=seed,
                                        check=False)
                    r0 = extract_robust(Oracle(mk(h, tau, seed), d), bias=False, tolerance=tau, seed=seed,
                                        check=False, retries=0)
                    ep.append(err_w(rp, h))
                    eo.append(err_w(ro, h))
                    qp.append(rp.queries)
                    qo.append(ro.queries)
                    e0.append(err_w(r0, h))
                    q0.append(r0.queries)
                ratio = min(np.array(ep) / np.array(eo))
                ratio0 = min(np.array(ep) / np.array(e0))
                rows.append([d, f"{tau:g}", name, f"{np.mean(ep):.3e}", f"{np.mean(eo):.3e}", f"{ratio:.1f}",
                             f"{min(qp)}–{max(qp)}", f"{min(qo)}–{max(qo)}", f"{np.mean(e0):.3e}", f"{ratio0:.1f}",
                             f"{min(q0)}–{max(q0)}"])
    return Table(["d", "τ", "oracle", "paper ‖Ŵ−W‖_F (mean of 3 seeds)", "default ‖Ŵ−W‖_F",
                     "min ratio paper/default", "paper queries", "default queries", "default, retries=0: ‖Ŵ−W‖_F",
                     "min ratio paper/(retries=0)", "retries=0 queries"], rows).markdown()


def extra_queries():
    rows = []
    d, tau = 16, 1e-4
    for name, mk in (("avq", lambda h: BoundedNoise(h, tau)), ("gaussian σ=τ/3", lambda h: FreshNoise(h, tau / 3))):
        for ms in (None, 1.0):
            for mult in (1, 2, 4, 8):
                h = theorem_head(d, 0, W_BOUND)
                r = extract_robust(Oracle(mk(h), d), bias=False, queries=mult * (d * d + d), max_scale=ms,
                                   check=False)
                rows.append([name, "none" if ms is None else ms, f"{mult}x", r.queries, f"{err_w(r, h):.3e}",
                             f"{np.linalg.norm(r.model.v - h.v):.3e}"])
    return Table(["oracle (τ = 1e-4, d = 16)", "max probe norm", "planned", "queries", "‖Ŵ−W‖_F", "‖v̂−v‖"],
                 rows).markdown()


def tau_plot():
    d = 16
    h = theorem_head(d, 0, W_BOUND)
    mu = margin(h)
    taus = np.logspace(-8, np.log10(0.4999 * mu), 12)
    res = {"paper (avq)": [], "paper (adversarial)": [], "default (avq)": [], "default (adversarial)": [], "g": []}
    for tau in taus:
        for name, mk in ORACLES.items():
            rp = extract_robust_paper(Oracle(mk(h, tau, 0), d), w_bound=W_BOUND, margin=mu, tolerance=tau, check=False)
            res[f"paper ({name})"].append(err_w(rp, h))
            try:
                ro = extract_robust(Oracle(mk(h, tau, 0), d), bias=False, tolerance=tau, check=False)
                res[f"default ({name})"].append(err_w(ro, h))
            except Exception:
                res[f"default ({name})"].append(np.nan)
        res["g"].append(theorem_guarantee(d, tau, W_BOUND, mu)["eps_W"])
    fig, ax = new_figure(7, 4.5)
    ax.loglog(taus, res["g"], "k-", lw=2, label="Thm 6.1 guarantee ε_W = 80 W² d τ / μ")
    for k, st in (("paper (avq)", "o-"), ("paper (adversarial)", "s--"), ("default (avq)", "^-"),
                  ("default (adversarial)", "v--")):
        ax.loglog(taus, res[k], st, label=k)
    ax.set_xlabel("tolerance τ")
    ax.set_ylabel("‖Ŵ − W‖_F")
    ax.set_title(f"AVQ oracle, d = {d}, ‖W‖_F = W = 2, ‖v‖ = 1, μ = {mu:.3f}; d + d² = {d + d * d} queries",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    figure_png(fig, DOCS / "robust_tau.png", dpi=120)


def theorem_tables():
    grid, worst = guarantee_grid()
    cmp_ = compare()
    extra = extra_queries()
    tau_plot()
    write_fragment("Thm 6.1: approximate value queries", command_line(),
                   "Paper's algorithm (`--probes paper`) against the theorem's guarantee "
                   f"(W = {W_BOUND}, ‖W‖_F = W, ‖v‖ = 1; worst ratio over the grid: {worst:.3f}):\n\n" + grid +
                   "\n\nDefault estimator (no bound on W) against the paper at the same τ (d + d² planned; "
                   "re-measured probes add the few extra queries shown):\n\n" + cmp_ +
                   "\n\nExtra queries (value pass at a large scale + W passes in fresh frames):\n\n" + extra,
                   "\n![error vs τ](../robust_tau.png)\n")


def minilm_table():
    """Error against τ on the bias-free part of a real head (MiniLM-L6 layer 0, head 0, row 0)."""
    full = minilm_head(0, 0, 0)
    h = AttentionHead(full.W, full.v)
    d = h.d
    wb = max(2.0, float(np.linalg.norm(h.W)))
    mu = float(np.abs(h.v).min())
    taus = np.logspace(-12, np.log10(0.49 * mu), 6)
    rows, series = [], {"paper": [], "default": [], "paper adv": [], "default adv": [], "g": []}
    for tau in taus:
        g = theorem_guarantee(d, tau, wb, mu)["eps_W"]
        series["g"].append(g)
        for tag, mk in (("", lambda: BoundedNoise(h, tau)), (" adv", lambda: AdversarialNoise(h, tau))):
            rp = extract_robust_paper(Oracle(mk(), d), w_bound=wb, margin=mu, tolerance=tau, check=False)
            ro = extract_robust(Oracle(mk(), d), bias=False, tolerance=tau, check=False)
            ep, eo = np.linalg.norm(rp.model.W - h.W), np.linalg.norm(ro.model.W - h.W)
            series["paper" + tag].append(ep)
            series["default" + tag].append(eo)
            rows.append([f"{tau:.2e}", "avq" if not tag else "adversarial", f"{g:.3e}", f"{ep:.3e}", rp.queries,
                         f"{eo:.3e}", ro.queries])
            print(rows[-1], flush=True)
    table = Table(["τ", "oracle", "Thm 6.1 ε_W", "paper ‖Ŵ−W‖_F", "paper queries", "default ‖Ŵ−W‖_F",
                      "default queries"], rows).markdown()
    write_fragment(f"Error vs τ on a real head: MiniLM-L6 L0H0 without biases (d = {d}, "
                   f"‖W‖_F = {wb:.3f} used as W, μ = min|v_i| = {mu:.2e})", command_line(), table,
                   "\nThe real head's smallest value entry makes μ tiny, so the theorem's guarantee is loose (and "
                   "τ ≤ μ/2 is required); both learners stay far below it.\n\n"
                   "![MiniLM error vs τ](../minilm_tau.png)\n")
    fig, ax = new_figure(7, 4.5)
    ax.loglog(taus, series["g"], "k-", lw=2, label="Thm 6.1 guarantee 80 W² d τ / μ")
    for k, st in (("paper", "o-"), ("paper adv", "s--"), ("default", "^-"), ("default adv", "v--")):
        ax.loglog(taus, series[k], st, label=k.replace("adv", "(adversarial)"))
    ax.set_xlabel("tolerance τ")
    ax.set_ylabel("‖Ŵ − W‖_F")
    ax.set_title(f"MiniLM-L6 L0H0 (bias-free part), d = {d}: d + d² = {d + d * d} queries")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    figure_png(fig, DOCS / "minilm_tau.png", dpi=120)


TABLES = {"theorem": theorem_tables, "minilm": minilm_table}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tables", default=",".join(TABLES), help="comma-separated: " + ", ".join(TABLES))
    for name in p.parse_args().tables.split(","):
        TABLES[name]()


if __name__ == "__main__":
    main()
