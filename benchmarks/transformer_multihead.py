"""Multi-head one-layer transformers with a biased K-output ReLU FFN: the region learner (``--method transformer``).

    python benchmarks/transformer_multihead.py --tables grid --d 8 --seeds 5
    python benchmarks/transformer_multihead.py --tables eprint,mha26,separate --seeds 5
    python benchmarks/transformer_multihead.py --tables grid-table --d 32        # tabulate what the runs file holds
    python benchmarks/transformer_multihead.py --tables compare --d 8,12 --before benchmarks/results/...jsonl

``grid``: success per cell over d, H ∈ {1, 2, 4, 6}, m ∈ {8, 16, 64}, biases on/off, K ∈ {1, 3, 10}: a run succeeds
when its functional check passes and the model's relative error on fresh N(0, I) sequences of every length 1–16
(against the true model) is ≤ 1e-8. ``eprint``: d = 8, H = 6 (the ePrint 2026/1678 experiment's size) beside its
2⁻⁵¹. ``mha26``: bias-free FFN, one output. ``separate``: our queries against the unknowns and against the
multi-head generic learner plus the FFN learner run on their own. ``grid`` appends every run to a JSON-lines file
(``benchmarks/results/transformer_grid_d*.jsonl``; a rerun resumes), seed by seed over all cells; ``grid-table``
tabulates it; ``compare`` sets the queries of the runs two such files share side by side. Each run has a budget
of 10⁶ queries. Timings are wall-clock seconds on a shared 2-core machine. Tables go to docs/benchmarks/transformer.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.learners.transformer.regions import extract_transformer_multihead
from attnprobe.models import MultiHeadAttention, MultiHeadTransformer
from attnprobe.models.transformer import transformer_errors
from attnprobe.oracles import Oracle
from attnprobe.reports import Table
from sections import command_line, write_section
from attnprobe.targets import random_multihead, random_multihead_transformer, random_relu_net

BUDGET = 1_000_000
TOL = 1e-8


DOC = "transformer"  # its results file: docs/benchmarks/transformer.md


def one_run(d, H, m, K, bias, seed, residual=False, polish="auto"):
    """One extraction: (success, function error, W error, u error, queries, unknowns, seconds, why-failed, polish
    levels run)."""
    t = random_multihead_transformer(d, H, m, outputs=K, bias=bias, residual=residual, seed=seed)
    o = Oracle(t, d, budget=BUDGET)
    t0 = time.perf_counter()
    try:
        res = extract_transformer_multihead(o, seed=seed, polish=polish)
    except AttnprobeError as exc:
        return False, np.inf, np.inf, np.inf, o.queries, None, time.perf_counter() - t0, type(exc).__name__, ""
    secs = time.perf_counter() - t0
    errs = transformer_errors(t, res.model, seed=seed + 1)
    ok = bool(res.passed) and errs["function"] <= TOL and res.model.H == H
    why = "" if ok else ("check" if not res.passed else ("heads" if res.model.H != H else "error"))
    levels = "+".join(p["level"] for p in res.details["polish"])
    return ok, errs["function"], errs["W"], errs["u"], res.queries, res.unknowns, secs, why, levels


CELLS = [(H, m, bias, K) for H in (1, 2, 4, 6) for m in (8, 16, 64) for bias in (True, False) for K in (1, 3, 10)]


def grid_runs(ds, seeds, path):
    """Every cell's runs, seed by seed (all cells of seed 0 first: a grid cut short still has whole seeds), one JSON
    line each in ``path``; runs already in the file are skipped (a rerun resumes)."""
    done = set()
    if os.path.exists(path):
        with open(path) as fh:
            done = {tuple(json.loads(line)["key"]) for line in fh if line.strip()}
    for s in range(seeds):
        for d in ds:
            for H, m, bias, K in CELLS:
                key = [d, H, m, bias, K, s]
                if tuple(key) in done:
                    continue
                r = one_run(d, H, m, K, bias, 1000 * d + 100 * H + m + 7 * K + s)
                rec = {"key": key, "ok": r[0], "fn": r[1], "W": r[2], "u": r[3], "queries": r[4], "seconds": r[6],
                       "why": r[7], "polish": r[8]}
                with open(path, "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                print(rec, flush=True)


def grid_table(ds, path):
    """The table of :func:`grid_runs`' file for widths ``ds`` (every seed found there)."""
    t = Table(["d", "H", "m", "bias", "K", "runs", "success", "max fn error (ok runs)", "median queries",
               "unknowns", "queries / unknown", "median s", "all-parameter polish", "failures"])
    with open(path) as fh:
        recs = [json.loads(line) for line in fh if line.strip()]
    for d in ds:
        for H, m, bias, K in CELLS:
            out = [r for r in recs if r["key"][:5] == [d, H, m, bias, K]]
            if not out:
                continue
            ok = [r for r in out if r["ok"]]
            unk = MultiHeadTransformer.unknowns(d, H, m, K)
            q = float(np.median([r["queries"] for r in out]))
            fails = {}
            for r in out:
                if not r["ok"]:
                    fails[r["why"]] = fails.get(r["why"], 0) + 1
            t.add(d, H, m, "yes" if bias else "no", K, len(out), f"{len(ok)}/{len(out)}",
                  max((r["fn"] for r in ok), default=float("nan")), q, unk, q / unk,
                  float(np.median([r["seconds"] for r in out])), sum("all" in r["polish"] for r in out),
                  ", ".join(f"{k} {v}" for k, v in fails.items()) or "-")
    return t


def compare_table(before, after):
    """Median queries per (d, H, K) over the runs both JSON-lines files hold (same cells and seeds): the learner
    before and after a change."""
    def load(path):
        with open(path) as fh:
            return {tuple(r["key"]): r for r in map(json.loads, filter(str.strip, fh))}
    old, new = load(before), load(after)
    common = sorted(set(old) & set(new))
    t = Table(["d", "H", "K", "runs", "median queries before", "median queries after", "after / before",
               "success before", "success after"])
    for d, H, K in sorted({(k[0], k[1], k[4]) for k in common}):
        keys = [k for k in common if (k[0], k[1], k[4]) == (d, H, K)]
        qo = float(np.median([old[k]["queries"] for k in keys]))
        qn = float(np.median([new[k]["queries"] for k in keys]))
        t.add(d, H, K, len(keys), qo, qn, qn / qo, f"{sum(old[k]['ok'] for k in keys)}/{len(keys)}",
              f"{sum(new[k]['ok'] for k in keys)}/{len(keys)}")
    return t


def eprint_table(seeds):
    t = Table(["setting", "seeds", "success", "max W error", "max u error", "max fn error", "paper's precision",
               "median queries", "unknowns", "median s"])
    for name, kw in (("d=8, H=6, m=16, K=1, biases", dict(m=16, K=1, bias=True)),
                     ("d=8, H=6, m=16, K=3, biases, residual", dict(m=16, K=3, bias=True, residual=True)),
                     ("d=8, H=6, m=16, K=1, biases, polish=all", dict(m=16, K=1, bias=True, polish="all")),
                     ("d=8, H=6, m=16, K=3, biases, residual, polish=all",
                      dict(m=16, K=3, bias=True, residual=True, polish="all"))):
        out = [one_run(8, 6, kw["m"], kw["K"], kw["bias"], 7000 + s, kw.get("residual", False),
                       kw.get("polish", "auto")) for s in range(seeds)]
        ok = [r for r in out if r[0]]
        t.add(name, seeds, f"{len(ok)}/{seeds}", max((r[2] for r in ok), default=np.nan),
              max((r[3] for r in ok), default=np.nan), max((r[1] for r in ok), default=np.nan), 2.0 ** -51,
              float(np.median([r[4] for r in out])), MultiHeadTransformer.unknowns(8, 6, kw["m"], kw["K"]),
              float(np.median([r[6] for r in out])))
        print(t.rows[-1], flush=True)
    return t


def mha26_table(seeds):
    t = Table(["d", "H", "m", "seeds", "success", "median queries", "4Hd² − 2H + 1 (attention only)",
               "unknowns", "max fn error"])
    for d, H, m in ((8, 2, 16), (12, 4, 16), (16, 4, 32), (32, 4, 64)):
        out = [one_run(d, H, m, 1, False, 9000 + 10 * d + s) for s in range(seeds)]
        ok = [r for r in out if r[0]]
        t.add(d, H, m, seeds, f"{len(ok)}/{seeds}", float(np.median([r[4] for r in out])),
              MultiHeadAttention.query_bound(d, H), MultiHeadTransformer.unknowns(d, H, m, 1),
              max((r[1] for r in ok), default=np.nan))
        print(t.rows[-1], flush=True)
    return t


def separate_table(seeds):
    """Our transformer learner against the multi-head generic learner and the FFN learner run on their own."""
    t = Table(["d", "H", "m", "K", "transformer queries", "unknowns", "generic multi-head alone", "FFN alone",
               "sum of the two", "ratio"])
    for d, H, m, K in ((8, 2, 16, 1), (12, 4, 16, 3), (16, 4, 32, 10), (32, 4, 64, 3)):
        tq, gq, fq = [], [], []
        for s in range(seeds):
            seed = 5000 + 10 * d + s
            tq.append(one_run(d, H, m, K, True, seed)[4])
            mh = Oracle(random_multihead(d, H, max(2, d // H), seed=seed), d, budget=BUDGET)
            extract_generic(mh, seed=s, check=False)
            gq.append(mh.queries)
            fo = Oracle(random_relu_net(d, m, seed=seed, bias=True, outputs=K), d, budget=BUDGET)
            extract_ffn(fo, seed=s, check=False)
            fq.append(fo.queries)
        q, g, f = (float(np.median(x)) for x in (tq, gq, fq))
        t.add(d, H, m, K, q, MultiHeadTransformer.unknowns(d, H, m, K), g, f, g + f, q / (g + f))
        print(t.rows[-1], flush=True)
    return t


SECTION = "Multi-head transformers: biased K-output FFN, residual (region learner)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", default="grid")
    ap.add_argument("--d", default="8,12,32")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--before", default=None, help="--tables compare: the JSON-lines file of the runs before")
    ap.add_argument("--runs", default=None, help="JSON-lines file of the grid's runs (default: results/ beside "
                    "this script); --tables grid-table only tabulates it")
    args = ap.parse_args()
    ds = [int(x) for x in args.d.split(",")]
    fname = f"transformer_grid_d{args.d.replace(',', '_')}.jsonl"
    runs = args.runs or os.path.join(os.path.dirname(__file__), "results", fname)

    def grid():
        grid_runs(ds, args.seeds, runs)
        return grid_table(ds, runs)

    makers = {"grid": grid, "grid-table": lambda: grid_table(ds, runs),
              "compare": lambda: compare_table(args.before, runs), "eprint": lambda: eprint_table(args.seeds),
              "mha26": lambda: mha26_table(args.seeds), "separate": lambda: separate_table(args.seeds)}
    grid_title = f"grid d ∈ {{{args.d}}}"
    titles = {"grid": grid_title, "grid-table": grid_title,
              "compare": "queries before and after the maps stage's change",
              "eprint": "the ePrint 2026/1678 size (d = 8, H = 6)",
              "mha26": "bias-free FFN, one output (the MHA'26 setting)",
              "separate": "queries against the learners run separately"}
    for name in args.tables.split(","):
        table = makers[name]()
        print(table.markdown())
        if not args.no_write:
            write_section(titles[name], table.markdown(), command_line(), parent=SECTION, doc=DOC)


if __name__ == "__main__":
    main()
