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
set must; otherwise it searches the repair line as before. :func:`tidy` joins a neuron the polish left on another's
hyperplane and drops one fitted to rounding.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from attnprobe.learners.ffn.fit import Neurons

#: alternating steps per start (the fit settles in 3–8 when it converges)
FIT_STEPS = 12
#: random starts of the one-neuron fit at most ...
MAX_STARTS = 100
#: ... and at least, whatever the size
MIN_STARTS = 8
#: floating-point work of all starts together (rows × span × D per step), which sets the starts for large networks
SEARCH_WORK = 1e10
#: a neuron whose output weight times norm is below this share of the largest is a fit to rounding (the weakest
#: ones the search misses are 1e-3 of the largest)
FAINT = 1e-4
#: two neurons facing the same way whose directions agree to this cosine are one (:func:`tidy`)
SAME_HYPERPLANE = 1.0 - 1e-8
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


def tidy(neurons: Neurons, added: int) -> tuple[Neurons, int]:
    """Neurons on one hyperplane facing the same way (an added neuron and a found one the polish moved onto it)
    joined into one (``B = Σ dir_k w_kᵀ``), and neurons fainter than :data:`FAINT` dropped. Returns the neurons and
    how many of the last ``added`` are still new (each join or drop takes one off the count)."""
    dirs, W = neurons.dirs.copy(), neurons.weights.copy()
    m = dirs.shape[1]
    unit = dirs / np.maximum(np.linalg.norm(dirs, axis=0), 1e-300)
    alive = np.ones(m, dtype=bool)
    for k in range(m - 1, -1, -1):  # the added ones (last) join earlier columns
        same = np.flatnonzero(alive[:k] & (unit[:, :k].T @ unit[:, k] > SAME_HYPERPLANE))
        if same.size:
            j = same[0]
            W[j] += W[k] * np.linalg.norm(dirs[:, k]) / np.linalg.norm(dirs[:, j])
            alive[k] = False
    size = sizes(Neurons(dirs, W, neurons.c))
    alive &= size >= FAINT * size[alive].max()
    gone = int((~alive).sum())
    return Neurons(dirs[:, alive], W[alive], neurons.c), max(added - gone, 0)


def faint_last(neurons: Neurons) -> bool:
    """Whether the last neuron's output weight times its norm is below :data:`FAINT` of the largest: a fit to
    rounding, not a neuron (the weakest ones the search misses are 1e-3 of the largest)."""
    size = sizes(neurons)
    return bool(size[-1] < FAINT * size.max())


def sizes(neurons: Neurons) -> np.ndarray:
    """Each neuron's output weight norm times its direction's norm (``‖dir_k w_kᵀ‖``, scale-free)."""
    return np.linalg.norm(neurons.weights, axis=1) * np.linalg.norm(neurons.dirs, axis=0)
