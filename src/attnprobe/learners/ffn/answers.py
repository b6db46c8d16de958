"""The learner's view of the oracle: length-1 queries at points of the search space, every answer remembered.

Bias-free networks are searched in input space. A network with biases is searched in the lifted space
``z = (x, s)``, ``s > 0``, where ``H(z) = s·f(x/s) = w_oᵀReLU(Aᵀx + b s) + c s`` is a bias-free (positively
homogeneous) network of d + 1 inputs plus the linear term ``c s``: neuron k is the hyperplane ``(a_k, b_k)``
through 0, so the bias-free machinery (segments, gradient jumps, Euler's identity ``H(z) = ∇H·z``) applies, and
the far ends of an input line are points with small s (answers keep their relative precision there).
Answers are vectors of K outputs; the kink search sees one random mix of them (every neuron some output sees
has a kink in the mix, almost surely).
"""

from __future__ import annotations

import numpy as np


class Answers:
    """Asks ``oracle`` at points ``Z`` of the search space (``(n, D)``, D = d or d + 1 when ``lifted``).

    ``vectors(Z)`` returns the ``(n, K)`` answers (lifted: multiplied by s), ``__call__`` their mix (the scalar
    the kink search reads). Every batch first makes sure it leaves ``reserve`` queries of the budget (the
    functional check) untouched. ``top`` is the largest answer seen (the scale of the rounding).
    """

    def __init__(self, oracle, *, lifted: bool, rng: np.random.Generator, reserve: int = 0) -> None:
        self.oracle = oracle
        self.lifted = bool(lifted)
        self.d = oracle.d
        self.dim = self.d + int(self.lifted)
        self.rng = rng
        self.reserve = int(reserve)
        self.points: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.top = 0.0
        self.mix: np.ndarray | None = None
        self.vector = False  # the oracle answers (B, K) rather than (B,)

    @property
    def outputs(self) -> int:
        return 1 if self.mix is None else self.mix.shape[0]

    def inputs(self, Z: np.ndarray) -> np.ndarray:
        """Input-space points of search-space points (``x = z[:d]/s`` when lifted)."""
        return Z[:, : self.d] / Z[:, self.d:] if self.lifted else Z

    def vectors(self, Z) -> np.ndarray:
        Z = np.asarray(Z, dtype=np.float64).reshape(-1, self.dim)
        n = Z.shape[0]
        if n == 0:
            return np.zeros((0, self.outputs))
        self.oracle.require(n + self.reserve, f"a batch of {n} FFN queries (keeping {self.reserve} for the "
                                               "functional check)")
        y = np.asarray(self.oracle(self.inputs(Z)[:, None, :]), dtype=np.float64)
        if self.mix is None:
            self.vector = y.ndim == 2
            K = y.shape[1] if y.ndim == 2 else 1
            g = np.ones(1) if K == 1 else self.rng.standard_normal(K)
            self.mix = g / np.sum(np.abs(g))
        y = y.reshape(n, -1)
        if self.lifted:
            y = y * Z[:, self.d:]
        self.points.append(Z.copy())
        self.values.append(y.copy())  # callers may write into what they get back
        self.top = max(self.top, float(np.max(np.abs(y))))
        return y

    def __call__(self, Z) -> np.ndarray:
        return self.vectors(Z) @ self.mix

    def all(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate(self.points), np.concatenate(self.values)
