"""Prop. 7.1 made visible: different multi-head parameters with the same function, and a search for a gap.

- :func:`tied_groups` finds heads sharing ``(W_h, u_h)``; only their value sum ``Σ v_h`` reaches the output.
- :func:`witness` returns another parameter set computing the same function: values redistributed inside a tied
  group (Prop. 7.1's construction: same H, not a permutation), or, when no heads are tied, one head split into
  two copies carrying ``λ v`` and ``(1 − λ) v`` (H + 1 heads).
- :func:`equivalent` evaluates two models on random inputs of many lengths and scales and then climbs
  ``|a(X) − b(X)|`` from the worst ones (Nelder–Mead over X), reporting the largest gap found. A gap at rounding
  level is evidence, not proof, of equality (deciding equivalence is open, Sec. 7.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.optimize

from attnprobe.errors import ConfigError
from attnprobe.models.multihead import MultiHeadAttention


def tied_groups(model: MultiHeadAttention, tol: float = 1e-12) -> list[list[int]]:
    """Groups (size ≥ 2) of heads whose ``W_h`` and ``u_h`` agree to relative ``tol``."""
    groups: list[list[int]] = []
    scale = max(float(np.abs(model.W).max()), float(np.abs(model.u).max()), 1e-300)
    for h in range(model.H):
        for g in groups:
            k = g[0]
            if (np.abs(model.W[h] - model.W[k]).max() <= tol * scale
                    and np.abs(model.u[h] - model.u[k]).max() <= tol * scale):
                g.append(h)
                break
        else:
            groups.append([h])
    return [g for g in groups if len(g) > 1]


def witness(model: MultiHeadAttention, rng: np.random.Generator) -> MultiHeadAttention:
    """A different parameter set with the same function as ``model`` (Prop. 7.1; see the module docstring)."""
    groups = tied_groups(model)
    if groups:
        v = model.v.copy()
        for g in groups:
            shift = rng.standard_normal((len(g), model.d))
            shift -= shift.mean(axis=0)  # zero sum: Σ_{h∈g} v_h unchanged
            v[g] += shift * (np.linalg.norm(model.v[g]) / max(np.linalg.norm(shift), 1e-300))
        return MultiHeadAttention(model.W, v, model.u, model.c, model.dtype)
    h = int(rng.integers(model.H))
    lam = float(rng.uniform(0.2, 0.8))
    W = np.concatenate([model.W, model.W[h:h + 1]])
    u = np.concatenate([model.u, model.u[h:h + 1]])
    v = np.concatenate([model.v, (1.0 - lam) * model.v[h:h + 1]])
    v[h] = lam * model.v[h]
    return MultiHeadAttention(W, v, u, model.c, model.dtype)


@dataclass
class EquivalenceReport:
    """Largest ``|a(X) − b(X)|`` found, also relative to the RMS answer of ``a``; where it was found; and how
    many sequences were evaluated (random and during the search)."""

    max_gap: float
    relative_gap: float
    worst: np.ndarray
    evaluations: int
    random_gap: float

    def as_dict(self) -> dict:
        return {"max_gap": self.max_gap, "relative_gap": self.relative_gap, "random_gap": self.random_gap,
                "evaluations": self.evaluations, "worst_shape": list(self.worst.shape)}


def equivalent(a, b, rng: np.random.Generator, *, lengths=(1, 2, 3, 5, 8), scales=(0.1, 1.0, 10.0),
               per: int = 64, climbs: int = 4, climb_iters: int = 400) -> EquivalenceReport:
    """Search for inputs where two models (any callables ``(B, N, d) -> (B,)`` with a width ``d``) differ."""
    if a.d != b.d:
        raise ConfigError(f"the models have different widths {a.d} and {b.d}", param="b")
    d = a.d
    starts, gaps, answers = [], [], []
    for N in lengths:
        for s in scales:
            X = s * rng.standard_normal((per, N, d))
            ya = a(X)
            g = np.abs(ya - b(X))
            answers.append(ya)
            for i in np.argsort(g)[-climbs:]:
                starts.append(X[i])
                gaps.append(float(g[i]))
    rms = float(np.sqrt(np.mean(np.concatenate(answers) ** 2))) or 1.0
    evaluations = per * len(lengths) * len(scales)
    random_gap = max(gaps)
    best, best_X = random_gap, starts[int(np.argmax(gaps))]
    order = np.argsort(gaps)[::-1][:climbs]
    for i in order:
        X0 = starts[i]
        shape = X0.shape
        count = [0]

        def neg_gap(x, shape=shape, count=count):
            # normalised so the climb cannot win by inflating the inputs (rounding grows with |f|)
            count[0] += 1
            X = x.reshape((1,) + shape)
            ya, yb = a(X)[0], b(X)[0]
            return -abs(ya - yb) / (1.0 + abs(ya) + abs(yb))

        res = scipy.optimize.minimize(neg_gap, X0.ravel(), method="Nelder-Mead",
                                      options={"maxiter": climb_iters, "xatol": 1e-12, "fatol": 1e-18})
        evaluations += count[0]
        X = res.x.reshape((1,) + shape)
        gap = float(np.abs(a(X) - b(X))[0])
        if gap > best:
            best, best_X = gap, X[0]
    return EquivalenceReport(best, best / rms, best_X, evaluations, random_gap)
