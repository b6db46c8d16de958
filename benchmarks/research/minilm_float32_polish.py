"""MiniLM layer 2's whole GELU FFN on float32 answers through the drive start, with more Gauss–Newton rounds than
the capped default: does the polish, not the start, limit the function error? (prototype; prints one line)."""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from smooth_ffn import target  # noqa: E402

from attnprobe.learners.smooth_ffn.learner import extract_smooth_ffn  # noqa: E402
from attnprobe.oracles import Oracle  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, nargs="*", default=[8])
args = ap.parse_args()
fn, truth = target("minilm2", "float32")
X = np.random.default_rng(1).standard_normal((1000, truth.d))
y = truth.with_dtype("float64").forward(X)
for rounds in args.rounds:
    oracle = Oracle(fn, truth.d, precision="float32")
    t0 = time.perf_counter()
    res = extract_smooth_ffn(oracle, hidden=truth.m, activation="gelu", start="drive", polish_rounds=rounds)
    err = float(np.abs(res.model.forward(X) - y).max() / np.abs(y).max())
    print(f"rounds {rounds}: queries {oracle.queries:,}, fresh max error {err:.1e}, check "
          f"{res.check.error:.1e} {'passed' if res.passed else 'FAILED'}, residuals "
          f"{[f'{r:.1e}' for r in res.details['polish_residuals']]}, {time.perf_counter() - t0:.0f} s", flush=True)
