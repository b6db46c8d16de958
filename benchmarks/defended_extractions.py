"""Extractions through the command line under every kind of defence flag (casts, rounding, noise, membership,
declared precision), so the behaviour of the answer chain can be compared before and after a change: run it
once with the old tree on PYTHONPATH and once with the new, and diff the two tables.

    PYTHONPATH=src python benchmarks/defended_extractions.py

Prints one markdown table: the extract flags, exit code, queries, check error and tolerance, the answers'
precision and rounding floor (``details.oracle``), and ``sum |W|`` of the result (a fingerprint of the arrays).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from attnprobe.models import save_model
from attnprobe.targets import random_head

RUNS = [
    "--target t.npz",
    "--target t.npz --cast float16",
    "--target t.npz --cast float32",
    "--target t.npz --cast bfloat16 --method lowrank",
    "--target t.npz --round 4",
    "--target t.npz --round-digits 5",
    "--target t.npz --round-digits 5 --cast float32",
    "--target t32.npz --dtype float32",
    "--target t32.npz --dtype float32 --cast float16",
    "--target t.npz --answer-precision float32",
    "--target nb.npz --method robust --no-bias --noise avq:1e-4",
    "--target nb.npz --method robust --no-bias --noise adversarial:1e-5",
    "--target t.npz --method robust --noise gaussian:1e-6 --noise-seed 3",
    "--target t.npz --method robust --noise uniform:1e-6 --round 7",
    "--target nb.npz --method membership",
    "--target t.npz --method lowrank --round-digits 7",
    "--target t.npz --method robust --round 5",
    "--target nb.npz --method robust --probes paper --w-bound 20 --margin 0.01 --noise avq:1e-6",
]


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="defended-"))
    save_model(random_head(8, seed=0), folder / "t.npz")
    save_model(random_head(6, seed=0, bias=False), folder / "nb.npz")
    save_model(random_head(8, seed=1, dtype="float32"), folder / "t32.npz")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    print("| flags | exit | queries | check error | tolerance | precision | eps | sum abs W | last stderr line |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, flags in enumerate(RUNS):
        out = folder / f"r{i}.npz"
        proc = subprocess.run([sys.executable, "-m", "attnprobe", "extract", *flags.split(), "--out", str(out),
                               "--quiet"], cwd=folder, env=env, capture_output=True, text=True)
        summary = out.with_suffix(".json")
        js = json.loads(summary.read_text()) if summary.exists() else {}
        chk, oracle = js.get("check") or {}, (js.get("details") or {}).get("oracle", {})
        W = float(np.abs(np.load(out)["W"]).sum()) if out.exists() else None
        err = proc.stderr.strip().splitlines()
        print(f"| `{flags}` | {proc.returncode} | {js.get('queries')} | {chk.get('relative_error')} | "
              f"{chk.get('tolerance')} | {oracle.get('precision')} | {oracle.get('eps')} | {W!r} | "
              f"{err[-1][:60] if err else ''} |", flush=True)


if __name__ == "__main__":
    main()
