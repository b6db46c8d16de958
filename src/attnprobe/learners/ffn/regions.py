"""Linear regions between the kinks: their gradients from finite differences, and the jumps between them.

Inside a linear region ``f(z) = g·z`` (positively homogeneous f; the lifted network of a biased one); ``g`` comes
from d + 1 finite differences, exact up to rounding. The gradient jump across a kink is the crossed neuron's
hyperplane normal times its output weights. Regions whose probes crossed a recovered hyperplane, broke Euler's
identity ``f(z) = ∇f(z)·z``, or were probed too close to the line are measured again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnprobe.errors import RecoveryError

#: probes of a region's gradient reach at most this fraction of the way to the nearest kink along the line
PROBE_FRACTION = 0.1
#: a re-measured region's probes reach this fraction of the distance to the nearest recovered hyperplane
SAFE_FRACTION = 0.5
#: regions probed at a radius below this fraction of ‖z‖ are re-measured at the centre of their cell
NARROW = 1e-5
#: times a narrow region may be moved to the centre of its cell (a move into another cell is undone)
CHEBYSHEV_TRIES = 3
#: rounds of re-measurement
REFINE_ROUNDS = 8


@dataclass(frozen=True)
class RefineSettings:
    """How regions are re-measured: ``always`` re-measures every region once, ``never`` none; ``chebyshev``
    moves regions the line only grazes to the centre of their cell."""

    always: bool = False
    never: bool = False
    chebyshev: bool = True


def gradients(ask, points: np.ndarray, radii: np.ndarray, U: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradient of every output at each point from ``f(z + h u_i) − f(z)`` for the orthonormal rows u_i of U
    (D + 1 queries per point). Exact while every probe stays in the point's linear region.
    Returns G (n, K, D) and the answers at the points (n, K)."""
    n, D = points.shape
    Z = np.concatenate([points[:, None, :], points[:, None, :] + radii[:, None, None] * U[None]], axis=1)
    y = ask.vectors(Z.reshape(-1, D)).reshape(n, D + 1, -1)
    Dd = (y[:, 1:, :] - y[:, :1, :]) / radii[:, None, None]  # Dd[r, i, k] = g_rk·u_i
    return np.einsum("rik,ie->rke", Dd, U), y[:, 0, :]


def cell_signs(regs, segs, i, N, side):
    """Side of region i (regions ``(segment, l, r)`` in order) for every recovered hyperplane (columns of N, one per
    pair of neighbouring regions on one segment). A hyperplane found on the region's own segment crosses it once,
    at its kink, so the region's side follows from the order of the kinks; the sign at the measuring point
    (``side``, used for the other hyperplanes) is wrong when a thin region puts it within the hyperplanes' own
    error."""
    signs = np.sign(np.asarray(side, dtype=np.float64)).copy()
    si = regs[i][0]
    c = 0
    for k in range(len(regs) - 1):
        if regs[k][0] != regs[k + 1][0]:
            continue
        if regs[k][0] == si:
            up = np.sign(N[:, c] @ segs[si].direction)  # N·x grows along the segment when up > 0
            if up != 0:
                signs[c] = -up if i <= k else up
        c += 1
    return signs


def chebyshev_centre(N, signs, x0, floor_axis: int | None = None):
    """Deepest point of the cone cell ``{x : signs_k n_kᵀx ≥ 0}`` inside the box ``‖x‖_∞ ≤ ‖x0‖_∞`` (an LP):
    returns (x, its distance to the nearest hyperplane) or (None, 0) when the solver fails. ``floor_axis``:
    the cell is also kept that far from the plane ``x[floor_axis] = 0`` (the lifted space's s > 0)."""
    from scipy.optimize import linprog

    if floor_axis is not None:
        e = np.zeros((N.shape[0], 1))
        e[floor_axis] = 1.0
        N, signs = np.concatenate([N, e], axis=1), np.concatenate([signs, [1.0]])
    d, k = N.shape
    box = float(np.max(np.abs(x0)))
    A_ub = np.concatenate([-(signs[None, :] * N).T, np.ones((k, 1))], axis=1)  # −s_k n_kᵀx + r ≤ 0
    c = np.zeros(d + 1)
    c[-1] = -1.0
    res = linprog(c, A_ub=A_ub, b_ub=np.zeros(k), bounds=[(-box, box)] * d + [(0, None)], method="highs")
    if res.status != 0 or res.x is None or res.x[-1] <= 0:
        return None, 0.0
    return res.x[:d], float(res.x[-1])


def hyperplane_normals(J: np.ndarray) -> np.ndarray:
    """Unit normal of each jump (J: (n, K, D)): the jump of every output is parallel to it (rank one)."""
    if J.shape[1] == 1:
        norms = np.linalg.norm(J[:, 0, :], axis=1)
        return (J[:, 0, :] / np.where(norms > 0, norms, 1.0)[:, None]).T
    N = np.zeros((J.shape[2], J.shape[0]))
    for k in range(J.shape[0]):
        N[:, k] = np.linalg.svd(J[k], full_matrices=False)[2][0]
    return N


class Regions:
    """The linear regions ``(segment, l, r)`` along every segment, each with a measuring point ``XR``, probe
    radius, gradient ``G`` (n, K, D) and answer ``F0`` (n, K)."""

    def __init__(self, segs, ask, U: np.ndarray, probe_fraction: float) -> None:
        self.segs, self.ask, self.U = segs, ask, U
        self.regs = [(si, l, r) for si, s in enumerate(segs) for (l, r) in _bounds(s)]
        self.ts = np.array([0.5 * (l + r) for _, l, r in self.regs])
        lens = np.array([np.linalg.norm(segs[si].direction) for si, _, _ in self.regs])
        dim = U.shape[0]
        self.radii = probe_fraction * 0.5 * np.array([r - l for _, l, r in self.regs]) * lens / math.sqrt(dim)
        self.XR = self.points(self.ts)
        self.radii = self._inside(self.XR, self.radii)
        self.G, self.F0 = gradients(ask, self.XR, self.radii, U)

    def _inside(self, X, radii):
        """Lifted space: probes keep s > 0 (radius at most half the point's s)."""
        return np.minimum(radii, 0.5 * X[:, -1]) if self.ask.lifted else radii

    def points(self, ts, idx=None) -> np.ndarray:
        idx = range(len(self.regs)) if idx is None else idx
        return np.array([self.segs[self.regs[i][0]].at(t) for i, t in zip(idx, ts)])

    def _same(self) -> np.ndarray:
        return np.array([self.regs[i][0] == self.regs[i + 1][0] for i in range(len(self.regs) - 1)], dtype=bool)

    def jumps(self) -> tuple[np.ndarray, np.ndarray]:
        """Gradient jumps between neighbouring regions of one segment (n, K, D), and the segment of each."""
        same = self._same()
        J = (self.G[1:] - self.G[:-1])[same] if same.size else np.zeros((0,) + self.G.shape[1:])
        where = np.array([self.regs[i][0] for i in range(len(self.regs) - 1) if same[i]], dtype=int)
        return J.reshape(-1, self.G.shape[1], self.G.shape[2]), where

    def jump_noise(self, eps: float) -> np.ndarray:
        """Each jump's finite-difference error relative to the jump (the order of :meth:`jumps`): a rounding of the
        largest answer per probe over each side's probe radius. Bounds the measured angle error of a jump's
        hyperplane (float32: 0.1–1 times this), except for two kinks taken for one."""
        same = self._same()
        i = np.flatnonzero(same) if same.size else np.zeros(0, dtype=int)
        J, _ = self.jumps()
        if J.shape[0] == 0:
            return np.zeros(0)
        return self._difference_noise(i, eps) / np.maximum(np.linalg.norm(J.reshape(J.shape[0], -1), axis=1), 1e-300)

    def _difference_noise(self, i, roundings: float):
        """Noise floor of the jump between regions i and i + 1 (i an index or an array of them): ``roundings`` of
        the largest answer per probe, over each side's probe radius."""
        return roundings * self.ask.top * math.sqrt(self.U.shape[0]) * (1 / self.radii[i] + 1 / self.radii[i + 1])

    def _drop(self, i: int) -> None:
        self.ts, self.F0, self.radii = np.delete(self.ts, i), np.delete(self.F0, i, 0), np.delete(self.radii, i)
        self.G, self.XR = np.delete(self.G, i, axis=0), np.delete(self.XR, i, axis=0)

    def merge_tiny(self, min_region: float) -> int:
        """A region narrower than ``min_region`` (in t) lies between a kink and a split point within rounding of
        it: its gradient equals one neighbour's up to its (large) finite-difference noise; join it to that
        neighbour. Returns how many were merged."""
        merged, i = 0, 0
        while i < len(self.regs):
            si, l, r = self.regs[i]
            nbrs = [j for j in (i - 1, i + 1) if 0 <= j < len(self.regs) and self.regs[j][0] == si]
            if r - l >= min_region or not nbrs:
                i += 1
                continue
            j = min(nbrs, key=lambda k: float(np.linalg.norm(self.G[k] - self.G[i])))
            lo, hi = min(i, j), max(i, j)
            self.regs[lo:hi + 1] = [(si, self.regs[lo][1], self.regs[hi][2])]
            self._drop(i)
            merged += 1
            i = lo
        return merged

    def merge_small_jumps(self, min_jump: float, merge_noise: float, eps: float) -> int:
        """A split point within rounding of a kink can pass for a second kink; its jump is ~0 (below ``min_jump``
        times the largest, or below the finite-difference noise): merge its two regions. Returns the count."""
        J, _ = self.jumps()
        norms = np.linalg.norm(J, axis=(1, 2))
        dropped = 0
        if norms.size:
            floor = min_jump * float(norms.max())
            i = 0
            while i < len(self.regs) - 1:
                noise = self._difference_noise(i, merge_noise * eps)
                if (self.regs[i][0] == self.regs[i + 1][0]
                        and np.linalg.norm(self.G[i + 1] - self.G[i]) <= max(floor, noise)):
                    keep = (i if self.regs[i][2] - self.regs[i][1] >= self.regs[i + 1][2] - self.regs[i + 1][1]
                            else i + 1)
                    self.regs[i:i + 2] = [(self.regs[i][0], self.regs[i][1], self.regs[i + 1][2])]
                    self._drop(2 * i + 1 - keep)
                    dropped += 1
                else:
                    i += 1
        for si, seg in enumerate(self.segs):
            seg.kinks = [l for (sj, l, _) in self.regs if sj == si][1:]
        return dropped

    def _farthest_points(self, N):
        """Candidate points inside each region: the one farthest from every recovered hyperplane."""
        cand = np.linspace(0.1, 0.9, 9)
        best_x, best_dist = self.XR.copy(), np.zeros(len(self.regs))
        for i, (si, l, r) in enumerate(self.regs):
            P = self.segs[si].at(l + cand * (r - l))
            dist = np.min(np.abs(P @ N), axis=1)
            if self.ask.lifted:
                dist = np.minimum(dist, P[:, -1])
            j = int(np.argmax(dist))
            best_x[i], best_dist[i] = P[j], dist[j]
        return best_x, best_dist

    def _euler_broken(self, eps: float) -> np.ndarray:
        """Euler's identity f(z) = ∇f(z)·z holds inside every linear region of a positively homogeneous f: a probe
        that left the region breaks it (free check, no queries)."""
        euler = np.max(np.abs(np.einsum("rke,re->rk", self.G, self.XR) - self.F0), axis=1)
        dim = self.U.shape[0]
        tol = 64 * eps * self.ask.top * (1 + math.sqrt(dim) * np.linalg.norm(self.XR, axis=1) / self.radii)
        return euler > tol

    def refine(self, settings: RefineSettings, eps: float) -> dict:
        """Re-measure regions whose probes crossed a recovered hyperplane, broke Euler's identity, or sit on a
        narrow cut of their cell (moved to its Chebyshev centre); every region once when ``always``."""
        stats = {"regions_re_measured": 0, "regions_moved_off_line": 0}
        if settings.never:
            return stats
        attempts = np.zeros(len(self.regs), dtype=int)
        tries = np.zeros(len(self.regs), dtype=int)
        for round_ in range(REFINE_ROUNDS):
            J, _ = self.jumps()
            if J.shape[0] == 0:
                break
            N = hyperplane_normals(J)
            best_x, best_dist = self._farthest_points(N)
            side0 = self.XR @ N
            crossed = np.array([bool(np.any(np.sign((self.XR[i] + self.radii[i] * self.U) @ N) != np.sign(side0[i])))
                                for i in range(len(self.regs))])
            broken = self._euler_broken(eps)
            narrow = self._narrow(settings, N, side0, tries, best_x, best_dist)
            redo = crossed | broken | narrow | (settings.always and round_ == 0)
            if not redo.any():
                break
            idx = np.flatnonzero(redo)
            stats["regions_moved_off_line"] += int(narrow.sum())
            stats["regions_moved_off_line"] -= self._remeasure(idx, broken, narrow, attempts, best_x, best_dist,
                                                               eps=eps)
            stats["regions_re_measured"] += len(idx)
        return stats

    def _narrow(self, settings, N, side0, tries, best_x, best_dist) -> np.ndarray:
        """Regions the search line cuts only near their edge: move off the line to the centre of the cell. A
        move is sent back when the centre lies in another cell, which happens while a neighbouring region's bad
        gradient still distorts a recovered hyperplane: tried again in later rounds (CHEBYSHEV_TRIES times)."""
        narrow = np.zeros(len(self.regs), dtype=bool)
        if not settings.chebyshev:
            return narrow
        floor_axis = self.U.shape[0] - 1 if self.ask.lifted else None
        low = (self.radii < NARROW * np.linalg.norm(self.XR, axis=1)) & (tries < CHEBYSHEV_TRIES)
        for i in np.flatnonzero(low):
            tries[i] += 1
            x, rad = chebyshev_centre(N, cell_signs(self.regs, self.segs, i, N, side0[i]), self.XR[i], floor_axis)
            if x is not None and SAFE_FRACTION * rad > 8 * self.radii[i]:
                best_x[i], best_dist[i], narrow[i] = x, rad, True
        return narrow

    def _remeasure(self, idx, broken, narrow, attempts, best_x, best_dist, *, eps: float) -> int:
        """Measure regions ``idx`` again at their best points; returns how many moves were undone."""
        old_x, old_r = self.XR[idx].copy(), self.radii[idx].copy()
        old_G, old_F = self.G[idx].copy(), self.F0[idx].copy()
        self.XR[idx] = best_x[idx]
        # a region measured again (or whose Euler check failed) shrinks its probes 8x at least: the recovered
        # hyperplanes near it may be the ones its own bad gradient distorted
        shrink = (broken[idx] | (attempts[idx] > 0)) & ~narrow[idx]
        self.radii[idx] = np.where(shrink, np.minimum(SAFE_FRACTION * best_dist[idx], self.radii[idx] / 8),
                                   SAFE_FRACTION * best_dist[idx])
        self.radii[idx] = self._inside(self.XR[idx], self.radii[idx])
        attempts[idx] += 1
        if np.any(self.radii[idx] <= 0):
            raise RecoveryError("a linear region is too thin to probe; retry with another seed")
        self.G[idx], self.F0[idx] = gradients(self.ask, self.XR[idx], self.radii[idx], self.U)
        # a moved region must keep its gradient (up to the old measurement's noise), else it left its cell
        noise_old = 64 * eps * self.ask.top * math.sqrt(self.U.shape[0]) / old_r
        change = np.linalg.norm((self.G[idx] - old_G).reshape(len(idx), -1), axis=1)
        back = narrow[idx] & (change > 16 * noise_old)
        if back.any():
            b = idx[back]
            self.G[b], self.F0[b], self.XR[b], self.radii[b] = old_G[back], old_F[back], old_x[back], old_r[back]
        return int(back.sum())


def _bounds(seg):
    """Linear regions along a segment: (left bound, right bound) between consecutive kinks and ±1."""
    b = [-1.0] + list(seg.kinks) + [1.0]
    return list(zip(b[:-1], b[1:]))
