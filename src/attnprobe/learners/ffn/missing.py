"""Neurons the search line missed, found in the answers the polish already holds (no query).

On float32 answers a weak neuron whose kink falls next to a strong one hides on the search line, and the polished
network then misses answers. The polish asked ``(3 + 1)·D·m`` answers at spread-out inputs, and every one of them
saw the missing neuron ``w·ReLU(nᵀz)``. With the found neurons' activation patterns fixed, their answers are linear
in their unknowns (the columns ``1[dir_kᵀz > 0]·z`` of the polish's least-squares problem); projecting the answers
and a candidate neuron's columns off that span leaves what the found neurons cannot explain even after moving, and
one missing neuron explains it with a single hinge. The direction ``n`` is fitted by alternating: with ``n``'s
pattern fixed, the projected least squares gives ``B = n wᵀ``, whose leading singular vector is the next ``n``
(from random starts; the projection keeps the found neurons' compensation out of the fit, which without it took a
wrong direction for three of six weak neurons). The learner polishes the found neurons with the best candidates
and keeps a set only when it explains every answer (:func:`~.more_lines.needs_another_line`), as any search line's
set must; otherwise it searches the repair line as before.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

#: alternating steps per start (the fit settles in 3–8 when it converges)
FIT_STEPS = 12
#: random starts of the one-neuron fit at most ...
MAX_STARTS = 100
#: ... and at least, whatever the size
MIN_STARTS = 8
#: floating-point work of all starts together (rows × span × D per step), which sets the starts for large networks
SEARCH_WORK = 1e10
#: distinct candidates (directions apart by more than this cosine) handed to the polish
CANDIDATES = 3
DISTINCT_COS = 0.999


def found_span(dirs: np.ndarray, Z: np.ndarray, lifted: bool) -> np.ndarray:
    """Orthonormal basis of the answers the found neurons (columns of ``dirs``), and the output bias when
    ``lifted``, can give with their activation patterns on the inputs ``Z`` fixed: columns ``1[dir_kᵀz > 0]·z``
    (and ``s``)."""
    on = Z @ dirs > 0
    F = (on[:, :, None] * Z[:, None, :]).reshape(Z.shape[0], -1)
    if lifted:
        F = np.concatenate([F, Z[:, -1:]], axis=1)
    Q, R, _ = scipy.linalg.qr(F, mode="economic", pivoting=True, check_finite=False)
    diag = np.abs(np.diag(R))
    rank = int(np.sum(diag > 1e-10 * max(float(diag[0]), 1e-300))) if diag.size else 0
    return Q[:, :rank]


def _projected_fit(Z: np.ndarray, rest: np.ndarray, Q: np.ndarray, n: np.ndarray) -> tuple[float, np.ndarray]:
    """Least squares of the projected answers ``rest`` on a neuron of direction ``n`` (its pattern fixed), projected
    off ``Q``: (squared misfit, B (D × K))."""
    G = (Z @ n > 0)[:, None] * Z
    G = G - Q @ (Q.T @ G)
    B = np.linalg.lstsq(G, rest, rcond=None)[0]
    return float(np.sum((rest - G @ B) ** 2)), B


def _leading(B: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``B ≈ u wᵀ``: the leading singular pair, u on n's side."""
    U, S, Vt = np.linalg.svd(B, full_matrices=False)
    u, w = U[:, 0], S[0] * Vt[0]
    return (u, w) if u @ n >= 0 else (-u, -w)


def missing_neuron_candidates(dirs: np.ndarray, Z: np.ndarray, Y: np.ndarray, lifted: bool,
                              rng: np.random.Generator):
    """Up to :data:`CANDIDATES` distinct neurons ``(n, w)`` (unit n, w: K) that best explain the answers ``Y`` at
    ``Z`` beyond the found neurons ``dirs`` (best first), and the share of the projected answers' energy the best
    one leaves (near 0: one neuron missing; near 1: nothing a single hinge explains)."""
    Q = found_span(dirs, Z, lifted)
    rest = Y - Q @ (Q.T @ Y)
    energy = float(np.sum(rest ** 2))
    D = Z.shape[1]
    if energy == 0.0 or Q.shape[1] + D >= Z.shape[0]:
        return [], 1.0
    work = FIT_STEPS * Z.shape[0] * Q.shape[1] * D
    starts = int(np.clip(SEARCH_WORK // max(work, 1), MIN_STARTS, MAX_STARTS))
    fits = []
    for _ in range(starts):
        n = rng.standard_normal(D)
        n /= np.linalg.norm(n)
        for _ in range(FIT_STEPS):
            _, B = _projected_fit(Z, rest, Q, n)
            u, _ = _leading(B, n)
            if np.linalg.norm(u - n) < 1e-10:
                break
            n = u
        misfit, B = _projected_fit(Z, rest, Q, n)
        fits.append((misfit, n, _leading(B, n)[1]))
    fits.sort(key=lambda f: f[0])
    picked = []
    for misfit, n, w in fits:
        if all(abs(n @ p[0]) < DISTINCT_COS for p in picked):
            picked.append((n, w))
        if len(picked) == CANDIDATES:
            break
    return picked, fits[0][0] / energy
