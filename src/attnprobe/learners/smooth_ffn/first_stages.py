"""The first stages both smooth FFN learners (plain and gated) share: the run, its finite-difference step, and the
hidden width, the rank of the first derivatives (every Jacobian lies in the span of the units' rank-one terms
``w2_i w1_iᵀ``), read on a grid of points and directions that doubles until the rank shows a drop below the grid's
size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.smooth_ffn.decompose import hidden_width
from attnprobe.learners.smooth_ffn.derivatives import Asker, choose_step, first_derivatives

#: the rank counts as shown when it is below this share of the grid's smaller side
SHOWN = 0.8


def start_run(oracle, *, seed: int, check: bool, progress, scale: float, check_queries: int):
    """The run of an FFN learner on length-1 queries, its :class:`Asker` (the check's queries reserved), and the
    finite-difference step ``h`` with its estimated error, chosen on inputs of standard deviation ``scale``."""
    if not (np.isfinite(scale) and scale > 0):
        raise ConfigError(f"The 'scale' parameter must be a finite number > 0; got {scale}", param="scale")
    run = Run(oracle, "ffn", seed=seed, check=check, check_lengths=(1,), check_per_length=check_queries,
              progress=progress)
    ask = Asker(oracle, reserve=run.check_queries)
    with run.phase("step"):
        h, fd_error = choose_step(ask, oracle.d, run.rng, scale)
    return run, ask, h, fd_error


@dataclass
class Width:
    """The width ``m`` found (or given), the largest singular-value drop, and the grid's directions ``U`` (C, d),
    points ``X`` (n, d) and first derivatives ``D1`` (K, C, n) the later stages reuse."""

    m: int
    drop: float
    U: np.ndarray
    X: np.ndarray
    D1: np.ndarray


def search_width(run, ask, *, scale: float, h: float, hidden: int | None, first_guess: int, max_width: int,
                 grid: Callable[[int], tuple[int, int]], units: Callable[[int], int],
                 replan: Callable[[int], int], what: str) -> Width:
    """First derivatives on ``grid(guess) = (C, n)``, doubling ``guess`` from ``first_guess`` up to ``max_width``
    (each time ``run.plan`` is told ``replan(guess)`` more queries) until their rank ``r`` shows; ``units(r)`` turns
    it into the number of units (or refuses). With ``hidden`` given, one grid of that width is read."""
    d, K, rng = ask.d, ask.outputs, run.rng
    guess = hidden or first_guess
    while True:
        C, n = grid(guess)
        U = rng.standard_normal((C, d))
        U /= np.linalg.norm(U, axis=1, keepdims=True)
        X = scale * rng.standard_normal((n, d))
        D1 = first_derivatives(ask, X, U, h)
        r, drop = hidden_width(D1.reshape(K * C, n))
        if hidden is not None:
            return Width(hidden, drop, U, X, D1)
        if r is not None and r < min(K * C, n) * SHOWN:
            return Width(units(r), drop, U, X, D1)
        if guess >= max_width:
            raise UnidentifiableError(f"the first derivatives show no hidden width up to {max_width} {what} (largest "
                                      f"drop of their singular values {drop:.1f}); give the hidden width")
        guess *= 2
        run.plan(run.queries + replan(guess), f"the {what} learner at m ≥ {guess}", at_least=True)
