"""MiniLM layer 2's whole GELU FFN on float32 answers: the polish round by round, from a cached start (prototype;
prints one line per step). ``--start PATH`` runs the learner (drive start, seed 0) to its second layer with no
polish and saves the start there; ``--rounds R --iterations I --state PATH`` then runs R Gauss–Newton rounds of I
LSMR iterations each with float32 products (:func:`attnprobe.learners.smooth_ffn.polish.gauss_newton`,
``single=True``) on 12,308 float32 answers (the learner's count) and saves the result back, so rounds can run one
process at a time. Reported: the relative residual on the answers, the fresh max error (as in
``benchmarks/smooth_ffn.py``) and the check norm (RMS error over RMS of ``f − mean``, the functional check's
measure) on the same 1000 fresh N(0, I) rows.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/research/minilm_float32_polish.py --start /tmp/s.npz
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/research/minilm_float32_polish.py --state /tmp/s.npz \
        --rounds 1 --iterations 20
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from smooth_ffn import target  # noqa: E402

from attnprobe.learners.smooth_ffn.learner import extract_smooth_ffn  # noqa: E402
from attnprobe.learners.smooth_ffn.polish import gauss_newton  # noqa: E402
from attnprobe.models.smooth_ffn import ACTIVATIONS, SmoothFFN, nearest_rows  # noqa: E402
from attnprobe.oracles import Oracle  # noqa: E402

ANSWERS = 12308

ap = argparse.ArgumentParser()
ap.add_argument("--start", help="run the learner to its unpolished start and save it here")
ap.add_argument("--state", help="the saved parameters to polish (overwritten)")
ap.add_argument("--rounds", type=int, default=1)
ap.add_argument("--iterations", type=int, default=20)
ap.add_argument("--neurons", action="store_true", help="with --state: the neurons' errors against the truth, no polish")
args = ap.parse_args()
fn, truth = target("minilm2", "float32")
exact = truth.with_dtype("float64")
X = np.random.default_rng(1).standard_normal((1000, truth.d))
y = exact.forward(X)


def report(params) -> str:
    yh = SmoothFFN(*params, "gelu").forward(X)
    return (f"fresh max error {np.abs(yh - y).max() / np.abs(y).max():.2e}, check norm "
            f"{np.linalg.norm(yh - y) / np.linalg.norm(y - y.mean(0)):.2e}")


def neurons(params) -> None:
    """Each true neuron against the nearest found (by ``(w1, b1)``): direction (sine), scale, bias (over
    ``‖(w1, b1)‖``) and ``w2`` errors; then the fresh error with the worst k neurons put right from the truth."""
    W1, b1, W2, b2 = params
    j = nearest_rows(np.hstack([exact.W1, exact.b1[:, None]]), np.hstack([W1, b1[:, None]]))
    nt, nh = np.linalg.norm(exact.W1, axis=1), np.linalg.norm(W1[j], axis=1)
    cos = np.abs(np.sum(exact.W1 * W1[j], 1)) / nt / nh
    errors = {"direction": np.sqrt(np.maximum(0, 1 - cos ** 2)), "scale": np.abs(nh - nt) / nt,
              "bias": np.abs(b1[j] - exact.b1) / np.hypot(nt, exact.b1),
              "w2": np.linalg.norm(W2[:, j] - exact.W2, axis=0) / np.linalg.norm(exact.W2, axis=0)}
    print(f"one to one: {len(set(j.tolist())) == len(j)}")
    for name, e in errors.items():
        print(f"{name}: median {np.median(e):.1e}, 90th percentile {np.quantile(e, 0.9):.1e}, worst {e.max():.1e}, "
              f"above 1e-2: {np.sum(e > 1e-2)}, above 1e-3: {np.sum(e > 1e-3)}")
    worst = np.argsort(-np.maximum.reduce(list(errors.values())))
    for k in (5, 20, 100):
        fixed = [p.copy() for p in (W1[j], b1[j], W2[:, j])]
        idx = worst[:k]
        fixed[0][idx], fixed[1][idx], fixed[2][:, idx] = exact.W1[idx], exact.b1[idx], exact.W2[:, idx]
        print(f"worst {k} put right: {report((*fixed, b2))}")


t0 = time.perf_counter()
if args.neurons:
    z = np.load(args.state)
    neurons((z["W1"], z["b1"], z["W2"], z["b2"]))
elif args.start:
    oracle = Oracle(fn, truth.d, precision="float32")
    res = extract_smooth_ffn(oracle, hidden=truth.m, activation="gelu", start="drive", polish_rounds=0,
                             polish_iterations=1, check=False)
    params = (res.model.W1, res.model.b1, res.model.W2, res.model.b2)
    np.savez(args.start, W1=params[0], b1=params[1], W2=params[2], b2=params[3])
    floor = np.abs(np.asarray(fn.forward(X), dtype=np.float64) - y).max() / np.abs(y).max()
    print(f"start: queries {oracle.queries:,}, {report(params)}, {time.perf_counter() - t0:.0f} s; the float32 "
          f"module's own fresh max error (the floor) {floor:.1e}")
else:
    z = np.load(args.state)
    params = (z["W1"], z["b1"], z["W2"], z["b2"])
    Xa = np.random.default_rng(5).standard_normal((ANSWERS, truth.d))
    Ya = np.asarray(fn.forward(Xa), dtype=np.float32).astype(np.float64)
    params, history, used = gauss_newton(Xa, Ya, params, ACTIVATIONS["gelu"], True, rounds=args.rounds,
                                         iterations=args.iterations, single=True)
    np.savez(args.state, W1=params[0], b1=params[1], W2=params[2], b2=params[3])
    print(f"rounds {args.rounds} × {args.iterations}: residuals {[f'{r:.2e}' for r in history]}, {report(params)}, "
          f"{time.perf_counter() - t0:.0f} s")
