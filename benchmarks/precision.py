"""Answer precision on a real MiniLM-L6 head: relative error of W against answer precision for
``exact`` with each probe design and for ``robust``; and the best error reachable from float16/bfloat16
answers with more queries.

float64/float32/bfloat16 rows compute the whole head in that precision (AttentionHead dtype); the float16 and
"bfloat16 answers" rows compute in float32 and cast inputs and answers (numpy's float16 matmul is ~100x slower
than float32 here, so full float16 compute is left out). ``round k`` rows round float64 answers to k
decimals. Writes docs/precision_study.png and the subsections of "Answer precision" in docs/benchmarks/precision.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners import extract_exact
from attnprobe.learners.head.robust import extract_robust
from attnprobe.oracles import Oracle
from attnprobe.oracles.wrappers import Precision, Rounded
from attnprobe.reports import Table
from sections import DOCS, command_line, write_section
from attnprobe.reports import relative_error as rel
from attnprobe.reports.figures import figure_png, new_figure
from attnprobe.targets import minilm_head

DOC = "precision"  # its results file: docs/benchmarks/precision.md
SECTION = "Answer precision"


def write_fragment(title, command, table, extra=""):
    """One subsection of docs/benchmarks/precision.md: the table, then what to read in it."""
    write_section(title, f"{table}\n{extra}", command, parent=SECTION, doc=DOC)
    print(table)


def make_oracle(truth64, spec):
    if spec.startswith("round"):
        k = int(spec.split()[1])
        o = Oracle(Rounded(truth64, decimals=k), truth64.d, name=spec)
        return o
    if spec in ("float16", "bfloat16 answers"):
        dt = spec.split()[0]
        return Oracle(Precision(truth64.with_dtype("float32"), dt), truth64.d, precision=dt, name=spec)
    if spec == "float16 (full)":
        return Oracle(truth64.with_dtype("float16"), truth64.d, precision="float16", name=spec)
    return Oracle(truth64.with_dtype(spec), truth64.d, precision=spec, name=spec)


def run(truth, spec, method, mult=1):
    o = make_oracle(truth, spec)
    t0 = time.perf_counter()
    try:
        if method.startswith("exact"):
            res = extract_exact(o, probes=method.split("-")[1], check=False)
        else:
            unknowns = truth.d ** 2 + 2 * truth.d + 1
            res = extract_robust(o, queries=mult * unknowns, check=False)
    except AttnprobeError as exc:
        return None, o.queries, type(exc).__name__, time.perf_counter() - t0
    return rel(res.model.W, truth.W), res.queries, "", time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--head", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="fewer precisions (smoke run)")
    ap.add_argument("--best-only", type=int, nargs="+", metavar="MULT",
                    help="only the best-reachable table, at these query multiples (float16, bfloat16 answers)")
    args = ap.parse_args()
    if args.best_only:
        return best_only(args)
    truth = minilm_head(args.layer, args.head, 0)
    specs = (["float64", "float32", "float16", "bfloat16 answers", "bfloat16"]
             + [f"round {k}" for k in (3, 4, 6, 8, 10, 12)])
    methods = ["exact-orthogonal", "exact-basis", "exact-gaussian", "robust"]
    if args.quick:
        specs = ["float64", "bfloat16", "round 6"]
    rows, data = [], {}
    for spec in specs:
        row = [spec]
        for m in methods:
            err, q, fail, sec = run(truth, spec, m)
            data[(spec, m)] = err
            row.append(f"{err:.2e} ({q})" if err is not None else f"fails: {fail} after {q}")
            print(spec, m, err, q, fail, f"{sec:.1f}s", flush=True)
        rows.append(row)
    table = Table(["answers"] + [f"{m}: rel. err of W (queries)" for m in methods], rows).markdown()

    best_rows = []
    for spec in (["float16", "bfloat16 answers", "round 4"] if not args.quick else ["bfloat16"]):
        for mult in (1, 2, 4, 8):
            err, q, fail, sec = run(truth, spec, "robust", mult)
            best_rows.append([spec, f"{mult}x", q, f"{err:.3e}" if err is not None else fail, f"{sec:.0f}"])
            print(spec, mult, err, q, f"{sec:.1f}s", flush=True)
    best = Table(["answers", "queries planned", "queries used", "rel. err of W", "seconds (noisy: shared 2 cores)"],
                    best_rows).markdown()
    write_fragment(f"Precision study: MiniLM-L6 layer {args.layer} head {args.head} (d = 384, "
                   "unknowns d²+2d+1 = 148225)", command_line(), table,
                   "\nBest error reachable from low-precision or rounded answers (robust, more queries = more W "
                   "passes in "
                   "fresh frames, averaged):\n\n" + best + "\n\n![precision study](../precision_study.png)\n")

    fig, ax = new_figure(8, 4.5)
    x = np.arange(len(specs))
    for m, mk in zip(methods, "osD^"):
        ys = [data[(s, m)] if data[(s, m)] is not None else np.nan for s in specs]
        ax.semilogy(x, ys, marker=mk, label=m)
    ax.set_xticks(x, specs, rotation=30)
    ax.set_ylabel("relative error of W")
    ax.set_title(f"MiniLM-L6 L{args.layer}H{args.head}: error of W vs answer precision (missing = failed)")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    figure_png(fig, DOCS / "precision_study.png", dpi=120)


def best_only(args):
    truth = minilm_head(args.layer, args.head, 0)
    rows = []
    for spec in ("float16", "bfloat16 answers"):
        for mult in args.best_only:
            err, q, fail, sec = run(truth, spec, "robust", mult)
            rows.append([spec, f"{mult}x", q, f"{err:.3e}" if err is not None else fail, f"{sec:.0f}"])
            print(rows[-1], flush=True)
    table = Table(["answers", "queries planned", "queries used", "rel. err of W", "seconds (noisy: shared 2 cores)"],
                     rows).markdown()
    write_fragment("Best error reachable from float16 / bfloat16 answers, larger budgets",
                   command_line(), table)


if __name__ == "__main__":
    main()
