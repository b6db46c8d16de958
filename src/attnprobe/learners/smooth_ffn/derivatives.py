"""Derivatives of a vector-valued FFN read off its answers by central finite differences.

For ``f(x) = W2 σ(W1 x + b1) + b2`` the directional derivatives are sums over the neurons,

    Df(x)[u]      = Σ_i σ'(a_i(x))  (w1_i·u)          w2_i,
    D²f(x)[u, v]  = Σ_i σ''(a_i(x)) (w1_i·u)(w1_i·v)  w2_i,      a_i(x) = w1_i·x + b1_i,

so with C directions u_c the pair (output k, direction c) sees neuron i through the fixed vector
``w2_i ⊗ (U w1_i)`` (the learner's factor ``A``), and the points and the second directions only reweight it.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError

#: steps tried for the finite differences, relative to the unit directions (the one with the smallest
#: disagreement between the step and half of it is used)
STEPS = (3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4)
#: points the step is chosen on
STEP_POINTS = 4
#: answers whose rounding floor (``oracle.eps``) is at least this are coarse (float32 and coarser): their
#: differences are read by three-level Richardson extrapolation from a step of :data:`COARSE_STEPS`
COARSE_EPS = 1e-12
#: base steps tried for the extrapolated differences on coarse answers (a doubling grid: the differences at each
#: step serve the extrapolations from it and from the two below it); up to 20.48 so that the largest base step
#: judged is 1.28 (ending at 2.56, MiniLM layer 2's FFN on float32 answers took 0.32, the largest it could judge,
#: where 0.64 leaves a quarter of the factor array's error: 3.1e-4 against 1.2e-3)
COARSE_STEPS = tuple(0.02 * 2.0 ** k for k in range(11))
#: points and direction pairs (C = E) the coarse step is judged on: 4 points and one pair took 0.32 for MiniLM's
#: first 192 units under one seed of two, 0.64 under the other
COARSE_STEP_POINTS, COARSE_STEP_PAIRS = 16, 2


class Asker:
    """Length-1 vector queries ``(n, d) -> (n, K)`` that always leave ``reserve`` queries of the budget (the
    functional check) untouched; answers of a single output ``(n,)`` are read as ``(n, 1)``."""

    def __init__(self, oracle, reserve: int = 0, chunk: int = 8192) -> None:
        self.oracle = oracle
        self.d = oracle.d
        self.reserve = int(reserve)
        self.chunk = int(chunk)
        self.outputs: int | None = None
        self.vector = True  # the oracle answers (B, K) rather than (B,)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64).reshape(-1, self.d)
        self.oracle.require(X.shape[0] + self.reserve, f"a batch of {X.shape[0]} FFN queries (keeping "
                                                       f"{self.reserve} for the functional check)")
        out = []
        for s in range(0, X.shape[0], self.chunk):
            y = np.asarray(self.oracle(X[s:s + self.chunk, None, :]), dtype=np.float64)
            if self.outputs is None:
                self.vector = y.ndim == 2
            out.append(y.reshape(y.shape[0], -1))
        Y = np.concatenate(out) if out else np.zeros((0, self.outputs or 1))
        if self.outputs is None:
            self.outputs = Y.shape[1]
        elif Y.shape[1] != self.outputs:
            raise ConfigError(f"the oracle answered {Y.shape[1]} outputs after {self.outputs}; an FFN answers a "
                              "fixed number K of outputs per input", param="oracle")
        return Y


def first_derivatives(ask: Asker, X: np.ndarray, U: np.ndarray, h: float) -> np.ndarray:
    """``Df(x_j)[u_c]`` as an array ``(K, C, n)`` (2·C·n queries)."""
    n, C = X.shape[0], U.shape[0]
    P = np.concatenate([X[None] + h * U[:, None, :], X[None] - h * U[:, None, :]]).reshape(-1, X.shape[1])
    Y = ask(P).reshape(2, C, n, -1)
    return np.transpose((Y[0] - Y[1]) / (2 * h), (2, 0, 1))


def second_derivatives(ask: Asker, X: np.ndarray, U: np.ndarray, V: np.ndarray, h: float) -> np.ndarray:
    """``D²f(x_j)[u_c, v_e]`` as an array ``(K, C, E, n)`` from the central four-point stencil (4·C·E·n queries)."""
    n, C, E, d = X.shape[0], U.shape[0], V.shape[0], X.shape[1]
    out = None
    for e in range(E):  # one batch per second direction keeps the batch at 4·C·n points
        hv = h * V[e]
        Xp = X[None] + h * U[:, None, :]
        Xm = X[None] - h * U[:, None, :]
        P = np.concatenate([Xp + hv, Xp - hv, Xm + hv, Xm - hv]).reshape(-1, d)
        Y = ask(P).reshape(4, C, n, -1)
        D = (Y[0] - Y[1] - Y[2] + Y[3]) / (4 * h * h)
        if out is None:
            out = np.zeros((D.shape[2], C, E, n))
        out[:, :, e, :] = np.transpose(D, (2, 0, 1))
    return out


def richardson(derivative, h: float, levels: int = 3) -> np.ndarray:
    """Richardson's extrapolation of a central difference ``derivative(step)`` (error ``c₂h² + c₄h⁴ + …``) from the
    steps ``h, 2h, …, 2^(levels−1) h``: two levels cancel the h² term, three the h⁴ term too."""
    if levels == 1:
        return derivative(h)
    if levels == 2:
        return (4 * derivative(h) - derivative(2 * h)) / 3
    if levels == 3:
        return (64 * derivative(h) - 20 * derivative(2 * h) + derivative(4 * h)) / 45
    raise ValueError("levels must be 1, 2 or 3")


def choose_step(ask: Asker, d: int, rng: np.random.Generator, scale: float) -> tuple[float, float]:
    """The finite-difference step (relative to unit directions) whose second differences agree best with those
    of half the step, on :data:`STEP_POINTS` random points; returns the step and the relative disagreement there
    (an estimate of the second derivatives' error)."""
    X = scale * rng.standard_normal((STEP_POINTS, d))
    u = rng.standard_normal((1, d))
    v = rng.standard_normal((1, d))
    u /= np.linalg.norm(u)
    v /= np.linalg.norm(v)
    steps = sorted(set(STEPS) | {h / 2 for h in STEPS}, reverse=True)
    vals = {h: second_derivatives(ask, X, u, v, h)[:, 0, 0, :] for h in steps}
    best, err = STEPS[0], np.inf
    for h in STEPS:
        a, b = vals[h], vals[h / 2]
        e = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))
        if e < err:
            best, err = h, e
    return best, err


def coarse_answers(oracle) -> bool:
    """Whether the oracle's answers are rounded at :data:`COARSE_EPS` or coarser (float32, bfloat16, ...)."""
    return float(getattr(oracle, "eps", 0.0)) >= COARSE_EPS


def choose_extrapolated_step(ask: Asker, d: int, rng: np.random.Generator, scale: float, *,
                             tolerance: float = 1.0) -> tuple[float, float]:
    """The base step of three-level Richardson second differences (steps h, 2h, 4h: the h² and h⁴ terms cancel,
    so the step can be large and the rounding small) on coarse answers: the :data:`COARSE_STEPS` entry whose
    extrapolation agrees best with those from half and twice the step, on :data:`COARSE_STEP_POINTS` random points
    and :data:`COARSE_STEP_PAIRS` squared pairs of directions;
    returns the step and the larger of those relative disagreements (measured on float32 answers of a 64-128-64
    GELU net: 1.4e-3 error from 0.1, 8e-5 from 0.5, against 1e-2 for a plain difference at 0.03). With
    ``tolerance`` > 1 the largest step whose disagreement is within that factor of the best is taken."""
    X = scale * rng.standard_normal((COARSE_STEP_POINTS, d))
    u, v = rng.standard_normal((2, COARSE_STEP_PAIRS, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    D = [second_derivatives(ask, X, u, v, h) for h in COARSE_STEPS]
    ext = [(64 * D[k] - 20 * D[k + 1] + D[k + 2]) / 45 for k in range(len(D) - 2)]
    gap = [float(np.linalg.norm(ext[k] - ext[k + 1]) / max(np.linalg.norm(ext[k + 1]), 1e-300))
           for k in range(len(ext) - 1)]
    # each inner step is judged by its disagreement with both neighbours (one pair alone picked 0.08 where
    # 0.16 was better and half of 16-48-16 float32 runs failed)
    score = [gap[k - 1] + gap[k] for k in range(1, len(gap))]
    # the largest step within ``tolerance`` of the best agreement (less rounding where the judgement is noise)
    k = 1 + max(i for i, v in enumerate(score) if v <= tolerance * min(score))
    return COARSE_STEPS[k], max(gap[k - 1], gap[k])


def step_queries(coarse: bool = False) -> int:
    """Queries :func:`choose_step` asks, and with ``coarse`` those of :func:`choose_extrapolated_step` too."""
    return 4 * STEP_POINTS * len(set(STEPS) | {h / 2 for h in STEPS}) + (
        4 * COARSE_STEP_POINTS * COARSE_STEP_PAIRS ** 2 * len(COARSE_STEPS) if coarse else 0)
