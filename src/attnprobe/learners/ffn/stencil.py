"""A point of a search segment with its two-sided stencil, and the straight lines through answers that the kink
search and the kink pinning intersect (a ReLU network is piecewise linear along any line)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stencil:
    """An evaluated point t of a segment: ``f(t)``, ``f(t − δ)``, ``f(t + δ)`` and δ."""

    t: float
    f: float
    left: float
    right: float
    delta: float

    @property
    def slope_out_left(self) -> float:  # slope of the piece arriving at t from the left
        return (self.f - self.left) / self.delta

    @property
    def slope_out_right(self) -> float:  # slope of the piece leaving t to the right
        return (self.right - self.f) / self.delta


def line_through(t0: float, f0: float, t1: float, f1: float) -> tuple[float, float, float]:
    """The line through two answers, as (point t, value there, slope)."""
    return t0, f0, (f1 - f0) / (t1 - t0)


def meet_lines(a, b) -> float | None:
    """Where two lines ``(t, f, slope)`` meet (None when parallel or not finite)."""
    if a[2] == b[2]:
        return None
    t = (b[1] - a[1] + a[2] * a[0] - b[2] * b[0]) / (a[2] - b[2])
    return float(t) if np.isfinite(t) else None


def value_on(line, t: float) -> float:
    """The line ``(t, f, slope)`` at t."""
    return line[1] + line[2] * (t - line[0])
