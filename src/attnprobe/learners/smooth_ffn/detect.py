"""Is the FFN behind the answers piecewise linear (ReLU) or smooth, and is it gated?

Along a short step ``x ± h u`` a ReLU network is affine unless a kink falls inside the step, so the second
difference ``Δ_h = f(x+hu) − 2f(x) + f(x−hu)`` is rounding; a smooth network bends everywhere, with
``Δ_2h ≈ 4 Δ_h``. At :data:`POINTS` random points (h = 3·eps^¼, where ``h²f''`` clears the rounding) the FFN is
smooth when most points bend well above the rounding and by the smooth ratio 4 (a kink inside the step gives a
ratio that depends on where it sits). Kinks denser than the step (a wide ReLU net on float32 answers) look smooth:
give the activation then.
A gated unit ``σ(g·x) (u·x)`` grows quadratically along a ray, a plain one at most linearly: the answers at
``t x`` for t = 8, 16, 32 tell which (:func:`growth`).
"""

from __future__ import annotations

import numpy as np

#: points the bend is measured at (5 queries each)
POINTS = 16
#: a point bends when its second difference exceeds this many roundings of the answers
BEND_FACTOR = 10.0
#: ... and ``Δ_2h / Δ_h`` lies in this range (4 for a smooth function)
RATIO = (3.0, 5.0)
#: rays the growth is measured on (3 queries each)
RAYS = 4


def test_queries() -> int:
    return 5 * POINTS + 3 * RAYS


def smooth_bends(ask, d: int, eps: float, rng: np.random.Generator, scale: float = 1.0) -> tuple[bool, float]:
    """Whether the answers bend at most points (a smooth activation), and the share of points that bend."""
    h = 3.0 * eps ** 0.25 * scale
    X = scale * rng.standard_normal((POINTS, d))
    u = rng.standard_normal((POINTS, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    Y = ask(np.concatenate([X + 2 * h * u, X + h * u, X, X - h * u, X - 2 * h * u])).reshape(5, POINTS, -1)
    near = np.linalg.norm(Y[1] - 2 * Y[2] + Y[3], axis=1)
    far = np.linalg.norm(Y[0] - 2 * Y[2] + Y[4], axis=1)
    rounding = 4.0 * eps * np.max(np.abs(Y), axis=(0, 2)) * np.sqrt(Y.shape[2])
    ratio = far / np.maximum(near, 1e-300)
    bends = (near > BEND_FACTOR * rounding) & (ratio > RATIO[0]) & (ratio < RATIO[1])
    share = float(np.mean(bends))
    return share > 0.5, share


def growth(ask, d: int, rng: np.random.Generator, scale: float = 1.0) -> float:
    """The answers' growth exponent along rays: about 1 for GELU/SiLU units, about 2 for gated ones."""
    x = scale * rng.standard_normal((RAYS, d))
    Y = ask(np.concatenate([8 * x, 16 * x, 32 * x])).reshape(3, RAYS, -1)
    a, b = np.linalg.norm(Y[1] - Y[0], axis=1), np.linalg.norm(Y[2] - Y[1], axis=1)
    return float(np.median(np.log2(np.maximum(b, 1e-300) / np.maximum(a, 1e-300))))
