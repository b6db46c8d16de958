"""Each gated neuron ``w2 σ(g·x + bg)(u·x + bu)`` from its 2-D block of factors (:func:`.decompose.block_factors`).

* Plane: at a few points the second derivatives along the C directions and every coordinate direction, unmixed
  by the blocks' pseudo-inverse, give two rows per point of the neuron's Hessian ``H = [g u] [[σ''·s, σ'], [σ', 0]]
  [g u]ᵀ`` (s = u·x + bu) — their row space is the plane ``Π = span{g, u}``.
* Gate and up: in plane coordinates ``z = Qᵀx`` the first derivatives unmixed by the blocks are
  ``c = κ Qᵀ∇φ = σ'(γ·z + β)(ν·z + η) γ + σ(γ·z + β) ν`` (κ = ±‖w2‖ absorbed in ν, η: the free up/down scale);
  linear in ``(ν, η)`` given the gate ``(γ, β)``, so a grid over the gate with ``(ν, η)`` by least squares
  starts a Levenberg–Marquardt fit of all six numbers per neuron, for every candidate gate activation.
"""

from __future__ import annotations

import numpy as np

from attnprobe.models.smooth_ffn import ACTIVATIONS, Activation
from attnprobe.learners.smooth_ffn.neurons import marquardt_steps

#: LM rounds of the per-neuron fit
FIT_ROUNDS = 80
#: points the grid start reads
GRID_POINTS = 128
#: gate directions, gate scales (relative to 1/std of the plane coordinates) and gate biases of the grid
GRID_ANGLES, GRID_SCALES, GRID_BIASES = 24, np.geomspace(0.25, 4.0, 7), np.linspace(-2.0, 2.0, 7)


def planes(Z: np.ndarray) -> np.ndarray:
    """Orthonormal bases ``(m, d, 2)`` of the neurons' planes from ``Z`` ``(points, m, 2, d)`` (the unmixed
    Hessian rows): each neuron's top two right singular vectors."""
    P, m, _, d = Z.shape
    Zi = np.transpose(Z, (1, 0, 2, 3)).reshape(m, 2 * P, d)
    _, _, vt = np.linalg.svd(Zi, full_matrices=False)
    return np.transpose(vt[:, :2, :], (0, 2, 1))


def _model(theta, z, act: Activation):
    """``c`` (m, 2, n) and the pieces the Jacobian needs, for ``theta`` (m, 6) = (γ1, γ2, β, ν1, ν2, η)."""
    g, beta, nu, eta = theta[:, 0:2], theta[:, 2:3], theta[:, 3:5], theta[:, 5:6]
    a = np.einsum("mk,mkn->mn", g, z) + beta
    s = np.einsum("mk,mkn->mn", nu, z) + eta
    f0, f1, f2 = act.f(a), act.d1(a), act.d2(a)
    c = (f1 * s)[:, None, :] * g[:, :, None] + f0[:, None, :] * nu[:, :, None]
    return c, (a, s, f0, f1, f2)


def _jacobian(theta, z, parts):
    """∂c/∂theta: (m, 2, n, 6)."""
    _, s, f0, f1, f2 = parts
    g, nu = theta[:, 0:2], theta[:, 3:5]
    m, _, n = z.shape
    J = np.zeros((m, 2, n, 6))
    for k in range(2):  # γ_k
        J[:, :, :, k] = ((f2 * s) * z[:, k])[:, None, :] * g[:, :, None] + (f1 * z[:, k])[:, None, :] * nu[:, :, None]
        J[:, k, :, k] += f1 * s
    J[:, :, :, 2] = (f2 * s)[:, None, :] * g[:, :, None] + f1[:, None, :] * nu[:, :, None]  # β
    for k in range(2):  # ν_k
        J[:, :, :, 3 + k] = (f1 * z[:, k])[:, None, :] * g[:, :, None]
        J[:, k, :, 3 + k] += f0
    J[:, :, :, 5] = f1[:, None, :] * g[:, :, None]  # η
    return J


def _cost(theta, c, z, act):
    r = _model(theta, z, act)[0] - c
    return np.einsum("mkn,mkn->m", r, r)


def fit_gates(c: np.ndarray, z: np.ndarray, act: Activation, bias: bool, rng: np.random.Generator) -> dict:
    """Fit ``c ≈ σ'(γ·z + β)(ν·z + η) γ + σ(γ·z + β) ν`` per neuron (``c``, ``z`` of shape (m, 2, n); β = η = 0
    when not ``bias``). Returns ``theta`` (m, 6) and each neuron's relative residual ``res``."""
    m, _, n = c.shape
    sub = rng.choice(n, size=min(n, GRID_POINTS), replace=False)
    cs, zs = c[:, :, sub], z[:, :, sub]
    sd = np.maximum(zs.std(axis=(1, 2)), 1e-300)
    best = np.full(m, np.inf)
    theta = np.zeros((m, 6))
    cols = [0, 1, 2] if bias else [0, 1]  # (ν1, ν2, η)
    for ang in np.linspace(0, 2 * np.pi, GRID_ANGLES, endpoint=False):
        for rho in GRID_SCALES:
            for B in (GRID_BIASES if bias else (0.0,)):
                g = np.stack([np.cos(ang) * rho / sd, np.sin(ang) * rho / sd], axis=1)
                a = np.einsum("mk,mkn->mn", g, zs) + B
                f0, f1 = act.f(a), act.d1(a)
                # design (m, 2, n, 3): columns ν1, ν2, η
                D = np.zeros((m, 2, zs.shape[2], 3))
                for k in range(2):
                    D[:, :, :, k] = (f1 * zs[:, k])[:, None, :] * g[:, :, None]
                    D[:, k, :, k] += f0
                D[:, :, :, 2] = f1[:, None, :] * g[:, :, None]
                D = D[..., cols].reshape(m, -1, len(cols))
                y = cs.reshape(m, -1)
                G = np.einsum("mnp,mnq->mpq", D, D) + 1e-12 * np.eye(len(cols))
                sol = np.linalg.solve(G, np.einsum("mnp,mn->mp", D, y)[:, :, None])[:, :, 0]
                r = np.linalg.norm(np.einsum("mnp,mp->mn", D, sol) - y, axis=1)
                better = r < best
                best = np.where(better, r, best)
                cand = np.zeros((m, 6))
                cand[:, 0:2], cand[:, 2] = g, B
                cand[:, 3:5] = sol[:, :2]
                if bias:
                    cand[:, 5] = sol[:, 2]
                theta = np.where(better[:, None], cand, theta)
    free = [0, 1, 2, 3, 4, 5] if bias else [0, 1, 3, 4]
    k = len(free)
    cost = _cost(theta, c, z, act)
    nu = np.full(m, 1e-3)
    for _ in range(FIT_ROUNDS):
        pred, parts = _model(theta, z, act)
        r = (pred - c).reshape(m, -1)
        J = _jacobian(theta, z, parts)[..., free].reshape(m, -1, k)
        step = marquardt_steps(J, r, nu)
        trial = theta.copy()
        trial[:, free] += step
        new = _cost(trial, c, z, act)
        ok = new < cost
        theta = np.where(ok[:, None], trial, theta)
        cost = np.where(ok, new, cost)
        nu = np.where(ok, nu / 3, nu * 4)
    res = np.sqrt(cost) / np.maximum(np.linalg.norm(c.reshape(m, -1), axis=1), 1e-300)
    return {"theta": theta, "res": res}


def pick_gate(c, z, bias, rng, candidates: tuple[str, ...]) -> tuple[str, dict, dict[str, float]]:
    """Fit every candidate gate activation; the smallest median residual wins (name, its fit, every median)."""
    fits = {name: fit_gates(c, z, ACTIVATIONS[name], bias, rng) for name in candidates}
    scores = {name: float(np.median(f["res"])) for name, f in fits.items()}
    name = min(scores, key=scores.get)
    return name, fits[name], scores
