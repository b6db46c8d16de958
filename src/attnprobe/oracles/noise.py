"""One description of what an oracle does to its answers (``Oracle.noise``), composed along a wrapper chain.

Like scikit-learn's estimator tags, a wrapper derives its noise from the callable it wraps: each wrapper adds its
own term to its inner callable's ``noise`` (:func:`noise_of`), so the chain never has to be walked by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class AnswerNoise:
    """What a chain does to answers: ``|error| ≤ tolerance + rel_eps·|f|`` plus fresh noise of scale ``sigma``.

    ``membership``: answers are 0/1 labels (App. B); ``fresh``: the noise is redrawn on every call, so asking
    again helps (Thm 6.1's AVQ noise is not fresh).
    """

    tolerance: float = 0.0
    rel_eps: float = 0.0
    sigma: float = 0.0
    membership: bool = False
    fresh: bool = False

    def __add__(self, other: "AnswerNoise") -> "AnswerNoise":
        """Noise of two independent stages applied one after the other (bounds add, fresh noise in quadrature)."""
        return AnswerNoise(self.tolerance + other.tolerance, self.rel_eps + other.rel_eps,
                           math.hypot(self.sigma, other.sigma), self.membership or other.membership,
                           self.fresh or other.fresh)

    def scaled(self, factor: float) -> "AnswerNoise":
        """The noise of ``factor`` × an answer (e.g. 2 for a difference of two answers, Sec. 4.1)."""
        return AnswerNoise(factor * self.tolerance, self.rel_eps, factor * self.sigma, self.membership, self.fresh)

    def additive(self) -> str:
        """The additive part in words (``""`` when none): ``"error up to 5.0e-05"``, ``"fresh noise of scale …"``."""
        parts = ([f"error up to {self.tolerance:.1e}"] if self.tolerance else []) + (
            [f"fresh noise of scale {self.sigma:.1e}"] if self.sigma else [])
        return " plus ".join(parts)

    @property
    def exact(self) -> bool:
        return not (self.tolerance or self.rel_eps or self.sigma or self.membership)


EXACT = AnswerNoise()


def noise_of(fn) -> AnswerNoise:
    """The noise a callable declares (``fn.noise``), or none for a plain function."""
    noise = getattr(fn, "noise", None)
    return noise if isinstance(noise, AnswerNoise) else EXACT
