"""Each neuron's first layer ``(w1_i, b1_i)`` and the activation, once the factors ``A`` are known.

* Direction: at a few points the second derivatives along the C directions and every coordinate direction,
  unmixed by ``A⁺``, give ``σ''(a_i(x)) (w1_i)_l`` up to a factor per neuron — ``w1_i``'s direction.
* Scale, bias and activation: the first derivatives unmixed by ``A⁺`` are ``p_ij = μ_i σ'(λ_i t_ij + b1_i)`` with
  ``t_ij = ŵ1_i·x_j`` known: a three-parameter curve per neuron, fitted for every candidate σ (a grid start, then
  Levenberg–Marquardt on all neurons at once); the activation is the one that fits best.
"""

from __future__ import annotations

import numpy as np

from attnprobe.models.smooth_ffn import ACTIVATIONS, Activation

#: LM rounds of the per-neuron curve fit
FIT_ROUNDS = 60
#: points the grid start reads (a subsample of the n points)
GRID_POINTS = 256
#: points the candidate activations are compared on (the winner is then fitted on all; MiniLM's 1536 neurons
#: at 1928 points cost ~75 s a candidate on the shared machine)
SELECT_POINTS = 512


def directions(Z: np.ndarray) -> np.ndarray:
    """Unit ``w1`` directions ``(m, d)`` from ``Z`` of shape ``(points, m, d)``: for each neuron the top right
    singular vector of its rows (each row is ``w1_i`` times that point's ``σ''``)."""
    Zi = np.transpose(Z, (1, 0, 2))
    _, _, vt = np.linalg.svd(Zi, full_matrices=False)
    return vt[:, 0, :]


def marquardt_steps(J: np.ndarray, r: np.ndarray, nu: np.ndarray) -> np.ndarray:
    """Marquardt's damped Gauss–Newton steps for many small fits at once: ``J (m, n, k)``, residuals ``r (m, n)``,
    damping ``nu (m,)`` scaling each fit's ``diag(JᵀJ)``; returns the steps ``(m, k)`` (pseudo-inverse where a
    damped system is singular)."""
    k = J.shape[2]
    H = np.einsum("inp,inq->ipq", J, J)
    g = np.einsum("inp,in->ip", J, r)
    Hd = H + nu[:, None, None] * (np.eye(k) * np.einsum("ipp->ip", H)[:, :, None] + 1e-300 * np.eye(k))
    try:
        return -np.linalg.solve(Hd, g[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:
        return -np.einsum("ipq,iq->ip", np.linalg.pinv(Hd), g)


def fit_curves(p: np.ndarray, t: np.ndarray, act: Activation, bias: bool, rng: np.random.Generator) -> dict:
    """Fit ``p_ij ≈ μ_i σ'(λ_i t_ij + b_i)`` for every neuron i (``p``, ``t`` of shape ``(m, n)``); ``b = 0`` when
    not ``bias``. Returns ``lam``, ``b``, ``mu`` and each neuron's relative residual ``res``."""
    m, n = p.shape
    sub = rng.choice(n, size=min(n, GRID_POINTS), replace=False)
    ts, ps = t[:, sub], p[:, sub]
    sd = np.maximum(ts.std(axis=1), 1e-300)
    best = np.full(m, np.inf)
    lam, b, mu = np.ones(m), np.zeros(m), np.zeros(m)
    for L in np.r_[-np.geomspace(0.2, 6, 12), np.geomspace(0.2, 6, 12)]:
        for B in (np.linspace(-3, 3, 13) if bias else (0.0,)):
            S = act.d1(L / sd[:, None] * ts + B)
            mus = np.einsum("ij,ij->i", S, ps) / np.maximum(np.einsum("ij,ij->i", S, S), 1e-300)
            r = np.linalg.norm(S * mus[:, None] - ps, axis=1)
            better = r < best
            best = np.where(better, r, best)
            lam = np.where(better, L / sd, lam)
            b = np.where(better, B, b)
            mu = np.where(better, mus, mu)
    theta = np.stack([lam, b, mu], axis=1)
    cost = _cost(theta, p, t, act)
    nu = np.full(m, 1e-3)
    for _ in range(FIT_ROUNDS):
        z = theta[:, :1] * t + theta[:, 1:2]
        s1, s2 = act.d1(z), act.d2(z)
        r = theta[:, 2:3] * s1 - p
        J = np.stack([theta[:, 2:3] * s2 * t, theta[:, 2:3] * s2, s1], axis=2)
        if not bias:
            J = J[:, :, [0, 2]]
        step = marquardt_steps(J, r, nu)
        if not bias:
            step = np.stack([step[:, 0], np.zeros(m), step[:, 1]], axis=1)
        trial = theta + step
        new = _cost(trial, p, t, act)
        ok = new < cost
        theta = np.where(ok[:, None], trial, theta)
        cost = np.where(ok, new, cost)
        nu = np.where(ok, nu / 3, nu * 4)
    res = np.sqrt(cost) / np.maximum(np.linalg.norm(p, axis=1), 1e-300)
    return {"lam": theta[:, 0], "b": theta[:, 1], "mu": theta[:, 2], "res": res}


def _cost(theta, p, t, act) -> np.ndarray:
    r = theta[:, 2:3] * act.d1(theta[:, :1] * t + theta[:, 1:2]) - p
    return np.einsum("ij,ij->i", r, r)


def pick_activation(p: np.ndarray, t: np.ndarray, bias: bool, rng: np.random.Generator,
                    candidates: tuple[str, ...]) -> tuple[str, dict, dict[str, float]]:
    """Fit every candidate activation on at most :data:`SELECT_POINTS` of the points; the one with the smallest
    median relative residual wins and is fitted again on all points (three numbers per neuron: the choice needs
    few points, the start's precision all of them). Returns its name, its fit and every candidate's median
    residual on the subsample (the detection's evidence)."""
    n = p.shape[1]
    sub = np.sort(rng.choice(n, size=SELECT_POINTS, replace=False)) if len(candidates) > 1 and n > SELECT_POINTS \
        else slice(None)
    fits = {name: fit_curves(p[:, sub], t[:, sub], ACTIVATIONS[name], bias, rng) for name in candidates}
    scores = {name: float(np.median(f["res"])) for name, f in fits.items()}
    name = min(scores, key=scores.get)
    if isinstance(sub, slice):
        return name, fits[name], scores
    return name, fit_curves(p, t, ACTIVATIONS[name], bias, rng), scores
