"""The antisymmetric oracle ``TF(X) − TF(−X)`` of Sec. 4.1: a single-head value oracle with ``v = A w_o``."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.oracles.base import Oracle

#: each antisymmetric answer is the difference of two underlying answers that can be much larger than it (the even
#: part of TF cancels), so its rounding is budgeted at 64 of theirs (measured: 4 left W errors of 2e-9 at d = 8, m = 32)
ROUNDING_FACTOR = 64.0


class AntisymmetricOracle(Oracle):
    """``X ↦ TF(X) − TF(−X)``. Softmax scores are even in X, ``ReLU(z) − ReLU(−z) = z``, so this is exactly the
    single-head regressor ``α(X, W)ᵀ X v`` with ``v = A w_o`` (Sec. 4.1).

    Every query here asks ``base`` for two sequences in one batch ``[X; −X]``; ``queries`` counts antisymmetric
    queries and ``base.queries`` the underlying ones (exactly twice as many). Budgets are the base's.
    """

    def __init__(self, base: Oracle) -> None:
        if not isinstance(base, Oracle):
            raise ConfigError(f"the antisymmetric oracle wraps an Oracle; got {type(base).__name__}", param="base")
        self.base = base
        super().__init__(self._answer, base.d, precision=base.precision, max_batch=max(1, base.max_batch // 2),
                         name=f"antisymmetric({base.name})", eps_floor=ROUNDING_FACTOR * base.eps)

    @property
    def remaining(self) -> float:
        return self.base.remaining / 2

    def require(self, n: int, what: str = "this step") -> None:
        self.base.require(2 * n, f"{what} (antisymmetric: 2 underlying queries each)")

    @property
    def noise(self):
        """A difference of two answers: twice the base's absolute noise (Sec. 4.1)."""
        return self.base.noise.scaled(2.0)

    @contextmanager
    def phase(self, name: str, *, absorb: bool = False, fresh: bool = False):
        """Charge both this oracle's and the base's queries to ``name`` (``fresh``: see :meth:`Oracle.phase`)."""
        with super().phase(name, absorb=absorb), self.base.phase(name, absorb=absorb, fresh=fresh):
            yield

    def _answer(self, X: np.ndarray) -> np.ndarray:
        B = X.shape[0]
        y = self.base(np.concatenate([X, -X]))
        return y[:B] - y[B:]
