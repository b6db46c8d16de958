"""The hidden width of a smooth or gated FFN: the rank of its first derivatives (every Jacobian lies in the span of
the units' rank-one terms ``w2_i w1_iᵀ``), read on a grid of points and directions that doubles until the rank
shows a drop below the grid's size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.smooth_ffn.decompose import hidden_width
from attnprobe.learners.smooth_ffn.derivatives import first_derivatives

#: the rank counts as shown when it is below this share of the grid's smaller side
SHOWN = 0.8


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
