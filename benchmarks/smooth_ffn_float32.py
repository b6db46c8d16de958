"""Where the smooth FFN learner's float32 route loses MiniLM layer 2's real GELU FFN (its first k hidden units):
the stages measured one by one against the truth, on the same float32 answers the learner reads.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/smooth_ffn_float32.py [--units 192] [--steps 0.32 0.64]

Per base step h of the three-level extrapolated second differences (the learner chooses one,
:func:`attnprobe.learners.smooth_ffn.derivatives.choose_extrapolated_step`): the factor array's relative error
against the exact one, and the factors ``w2_i ⊗ U w1_i`` of Jennrich's diagonalisation as the learner runs it
(:func:`attnprobe.learners.smooth_ffn.decompose.factors` without sweeps), then refined by alternating least squares
(:func:`~attnprobe.learners.smooth_ffn.decompose.refine_factors`: from those factors, as the learner does on coarse
answers, and from the true ones: what the answers support). Then the
Jacobian from extrapolated first differences along the coordinates (what a direction stage could read instead of
second differences), and the Gauss–Newton polish (:func:`attnprobe.learners.smooth_ffn.polish.gauss_newton`)
started from the true first layer perturbed by 5 % per neuron (whether the polish is the limit).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from attnprobe.learners.smooth_ffn import learner as plain
from attnprobe.learners.smooth_ffn.decompose import factors, refine_factors
from attnprobe.learners.smooth_ffn.derivatives import Asker, choose_extrapolated_step, richardson, second_derivatives
from attnprobe.learners.smooth_ffn.polish import gauss_newton, output_layer
from attnprobe.models.smooth_ffn import ACTIVATIONS, SmoothFFN
from attnprobe.oracles import Oracle
from attnprobe.targets import minilm_ffn


def factor_errors(A: np.ndarray, truth: np.ndarray) -> tuple[float, float, int, bool]:
    """Median and largest ``1 − |cos|`` of each true factor to its nearest found one, how many exceed 1e-2, and
    whether the matching is one to one."""
    cos = np.abs(truth.T @ A)
    err = 1 - cos.max(1)
    return float(np.median(err)), float(err.max()), int(np.sum(err > 1e-2)), len(set(cos.argmax(1))) == A.shape[1]


def jacobians(ask: Asker, X: np.ndarray, h: float) -> np.ndarray:
    """``J(x_j)`` ``(N, K, d)`` from two-level extrapolated central differences along the coordinates."""
    N, d = X.shape

    def diff(s):
        E = s * np.eye(d)
        Y = ask(np.concatenate([X[:, None] + E[None], X[:, None] - E[None]]).reshape(-1, d)).reshape(2, N, d, -1)
        return np.transpose((Y[0] - Y[1]) / (2 * s), (0, 2, 1))

    return (4 * diff(h) - diff(2 * h)) / 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=192)
    ap.add_argument("--steps", type=float, nargs="*", default=[0.64])
    ap.add_argument("--sweeps", type=int, default=30)
    args = ap.parse_args()
    truth = minilm_ffn(2, "float32", neurons=args.units)
    t64, act = truth.with_dtype("float64"), ACTIVATIONS["gelu"]
    d, m = truth.d, truth.m
    ask = Asker(Oracle(truth, d, precision="float32"))
    rng = np.random.default_rng(0)
    K = ask(np.zeros((1, d))).shape[1]
    chosen, gap = choose_extrapolated_step(ask, d, rng, 1.0)
    print(f"step chosen by the learner: {chosen} (its extrapolations disagree by {gap:.1e})\n")
    C, n, E = plain._directions(K, m), plain._points(m), plain.COARSE_SECOND_DIRECTIONS
    U = rng.standard_normal((C, d))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    V = rng.standard_normal((E, d))
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    X = rng.standard_normal((n, d))
    a = X @ t64.W1.T + t64.b1
    exact = np.einsum("km,cm,em,nm->kcen", t64.W2, U @ t64.W1.T, V @ t64.W1.T, act.d2(a))
    Atrue = np.einsum("km,cm->kcm", t64.W2, U @ t64.W1.T).reshape(K * C, m)
    Atrue /= np.linalg.norm(Atrue, axis=0)
    print("| base step h | factor array error | factors (learner): 1−cos median / max, > 1e-2, one to one | "
          f"+ {args.sweeps} ALS sweeps: residual, 1−cos median / max, > 1e-2 | ALS from the true factors: "
          "residual, 1−cos max |")
    print("|---|---|---|---|---|")
    for h in args.steps:
        T = richardson(lambda s: second_derivatives(ask, X, U, V, s), h, 3).reshape(K * C, E, n)
        err = np.linalg.norm(T - exact.reshape(T.shape)) / np.linalg.norm(exact)
        A, _ = factors(T, m, np.random.default_rng(1))
        f = factor_errors(A, Atrue)
        Aals, res = refine_factors(T, A, args.sweeps)
        g = factor_errors(Aals, Atrue)
        Atr, res_t = refine_factors(T, Atrue, args.sweeps)
        print(f"| {h} | {err:.1e} | {f[0]:.1e} / {f[1]:.2f}, {f[2]}, {'yes' if f[3] else 'no'} | {res:.1e}, "
              f"{g[0]:.1e} / {g[1]:.2f}, {g[2]} | {res_t:.1e}, {factor_errors(Atr, Atrue)[1]:.1e} |", flush=True)
    NJ = max(8, math.ceil(3 * m / K))
    J = jacobians(ask, X[:NJ], args.steps[-1] / 2)
    Jt = np.einsum("km,nm,md->nkd", t64.W2, act.d1(a[:NJ]), t64.W1)
    print(f"\nJacobians at {NJ} points (extrapolated first differences from h = {args.steps[-1] / 2}): relative error "
          f"{np.linalg.norm(J - Jt) / np.linalg.norm(Jt):.1e}")
    N = math.ceil(plain.ANSWER_FACTOR * SmoothFFN.unknowns(d, m, K) / K)
    Xa = rng.standard_normal((N, d))
    Ya = ask(Xa)
    P = np.hstack([t64.W1, t64.b1[:, None]])
    P = P + 0.05 * np.linalg.norm(P, axis=1, keepdims=True) * rng.standard_normal(P.shape) / np.sqrt(d + 1)
    W1, b1 = P[:, :d], P[:, d]
    t0 = time.perf_counter()
    params, history, _ = gauss_newton(Xa, Ya, (W1, b1, *output_layer(Xa, Ya, W1, b1, act, True)), act, True,
                                      rounds=plain.GN_ROUNDS, iterations=plain.GN_ITERATIONS)
    Xf = np.random.default_rng(1).standard_normal((1000, d))
    yf = t64.forward(Xf)
    fresh = np.abs(SmoothFFN(*params).forward(Xf) - yf).max() / np.abs(yf).max()
    print(f"Gauss–Newton on {N} float32 answers from the true first layer perturbed by 5 % per neuron: residuals "
          f"{', '.join(f'{r:.1e}' for r in history)}; fresh max error {fresh:.1e} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
