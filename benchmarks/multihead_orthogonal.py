"""Multi-head layers whose heads live in mutually orthogonal subspaces (Prop. C.2, App. C).

Three learners on seeded random layers (``random_orthogonal_multihead``, biases on, unit logit scale, float64):
known subspaces (Prop. C.2), unknown subspaces with H given (the App. C Hessian + block-diagonalisation learner
held to ``4Hd² − 2H + 1`` queries), and unknown subspaces with H detected (no query cap). A head counts as
recovered when its W, v and u are all within 1e-6 relative error after matching heads (Hungarian assignment).

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_orthogonal.py [--seeds 20] [--write]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnprobe.reports import Table  # noqa: E402
from sections import write_section  # noqa: E402


DOC = "multihead"  # its results file: docs/benchmarks/multihead.md


def table(headers, rows) -> str:
    """Markdown through the one formatter (:class:`attnprobe.reports.Table`)."""
    return Table(headers, rows).markdown()


from attnprobe.learners.multihead import extract_multihead  # noqa: E402
from attnprobe.models import MultiHeadAttention, match_heads  # noqa: E402
from attnprobe.oracles import Oracle  # noqa: E402
from attnprobe.targets import random_orthogonal_multihead  # noqa: E402

CONFIGS = [(2, 4), (2, 8), (4, 4), (4, 8), (8, 4), (8, 8)]
MODES = ("known subspaces", "unknown, H given", "unknown, H detected")
TOL = 1e-6


def run_one(H: int, dh: int, seed: int, mode: str) -> dict:
    d = H * dh
    model, E = random_orthogonal_multihead(d, H, dh, seed=seed)
    oracle = Oracle(model, d)
    t0 = time.perf_counter()
    try:
        if mode == "known subspaces":
            res = extract_multihead(oracle, subspaces=E, seed=seed)
        elif mode == "unknown, H given":
            res = extract_multihead(oracle, method="orthogonal", heads=H, seed=seed)
        else:
            res = extract_multihead(oracle, method="orthogonal", seed=seed)
    except Exception as exc:  # a failure is a data point, reported as such
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "worst": np.inf, "queries": oracle.queries,
                "H_ok": False, "seconds": time.perf_counter() - t0, "check": False}
    secs = time.perf_counter() - t0
    H_ok = res.model.H == H
    worst = match_heads(model, res.model).worst if H_ok else np.inf
    return {"ok": worst <= TOL, "worst": worst, "queries": res.queries, "H_ok": H_ok, "seconds": secs,
            "check": bool(res.check.passed), "richardson": np.mean(res.details.get("richardson", [True]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--write", action="store_true", help="write the section of docs/benchmarks/multihead.md")
    args = ap.parse_args()
    rows, failures = [], []
    for mode in MODES:
        for H, dh in CONFIGS:
            d = H * dh
            runs = [run_one(H, dh, s, mode) for s in range(args.seeds)]
            bound = MultiHeadAttention.query_bound(d, H)
            worst = np.array([r["worst"] for r in runs])
            q = np.array([r["queries"] for r in runs])
            row = [mode, H, dh, d, f"{sum(r['ok'] for r in runs)}/{len(runs)}",
                   f"{sum(r['H_ok'] for r in runs)}/{len(runs)}", float(np.median(worst)), float(worst.max()),
                   f"{sum(r['check'] for r in runs)}/{len(runs)}", int(np.median(q)), int(q.max()), bound,
                   float(q.max() / bound), float(np.median([r["seconds"] for r in runs]))]
            rows.append(row)
            for s, r in enumerate(runs):
                if not r["ok"]:
                    why = r.get("error") or f"worst head error {r['worst']:.2e}"
                    failures.append(f"{mode}, H={H}, d_h={dh}, seed {s}: {why}")
            print(table(HEADERS, [row]).splitlines()[-1], flush=True)
    body = table(HEADERS, rows)
    if failures:
        body += "\n\nFailures:\n" + "\n".join(f"- {f}" for f in failures)
    else:
        body += f"\n\nNo failures: every head of every run within {TOL:g}."
    print(body)
    if args.write:
        write_section("Multi-head: orthogonal head subspaces (Prop. C.2, App. C conjecture)", INTRO + body,
                      f"OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_orthogonal.py "
                      f"--seeds {args.seeds} --write", doc=DOC)


HEADERS = ["mode", "H", "d_h", "d", f"all heads ≤ {TOL:g}", "H right", "median worst head err",
           "max worst head err", "check passed", "median queries", "max queries", "4Hd²−2H+1", "max q / bound",
           "median s"]
INTRO = """Random layers with every head's W_h (rank d_h), v_h, u_h inside its own subspace of a random \
orthogonal family
(`random_orthogonal_multihead`, biases, logit scale 1, float64 answers), one seed per run. "known subspaces": Prop. C.2,
the exact single-head learner inside each given subspace. "unknown": the App. C conjecture as implemented in
`learners/multihead/hessian.py` — Hessians of `F_y(z) = f([y+z; y]) − f([y; y])` at z = 0 (one value query per
quadratic form, Richardson-extrapolated when the budget allows), finest simultaneous block diagonalisation
(`learners/multihead/blocks.py`), then the known-subspace learner with small probe logits. With H given, the \
learner is held
to `4Hd² − 2H + 1` queries; with H detected it has no cap. "worst head err" is the largest relative error of W, v or u
over the heads after Hungarian matching; "H right" counts runs that found exactly H blocks.

"""


if __name__ == "__main__":
    main()
