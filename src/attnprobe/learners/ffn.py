"""Value-query learner for the bias-free ReLU network ``f(x) = w_oᵀ ReLU(Aᵀx)`` (the ``A_FFN`` Sec. 4.1 assumes).

Critical-point extraction in the spirit of Carlini–Jagielski–Mironov (2020) and Jagielski et al. (2020), adapted
to the bias-free, positively homogeneous case:

* ``f(x) = ½ vᵀx + ½ Σ_k w_k |a_kᵀx|`` with ``v = Σ_k w_k a_k = A w_o``: the odd part ``f(x) − f(−x) = vᵀx``
  is linear (2d queries) and every neuron is a hyperplane through 0.
* Every hyperplane through 0 crosses the projective line of directions exactly once, so two segments
  ``p + t q`` and ``q + t p`` (t ∈ [−1, 1], p ⟂ q) meet every neuron: the kinks are found by a batched
  bisection that fits one line on each side of an interval and tests where they meet (one kink) or splits.
* Inside a linear region ``f(z) = g·z``; its gradient comes from d finite differences, exact up to
  rounding. The gradient jump across a kink is ``J_k = w_k a_k·sign(a_kᵀq)``: the neuron up to its orientation.
* The orientations ``s_k = ±1`` must satisfy ``Σ_k s_k J_k = v``: a linear solve when the J are independent
  (m ≤ d), a small 0/1 program (scipy's HiGHS MILP, time-limited) otherwise. When no ±1 solution exists
  (antiparallel neurons) or none is found in time, two extra neurons carry the linear rest ``½ρᵀx`` and the
  network computes the same function with different neurons; the result says so.

Identifiability: the function fixes only ``v`` and the hyperplanes with their jumps, so dead neurons
(``a_k = 0`` or ``w_k = 0``) are invisible, positively parallel neurons merge into one, and a neuron is
recovered up to positive rescaling (we return unit columns of A) and permutation.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from attnprobe.errors import ConfigError, RecoveryError, UnidentifiableError
from attnprobe.learners.check import functional_check
from attnprobe.learners.probes import random_orthogonal
from attnprobe.learners.result import Extraction
from attnprobe.models.ffn import ReLUNet

#: answers agree with a line if they differ by less than this many roundings of the largest answer seen
NOISE_FACTOR = 64.0
#: probes of a region's gradient reach at most this fraction of the way to the nearest kink along the line
PROBE_FRACTION = 0.1
#: a region is re-measured when a probe crossed a recovered hyperplane; probes then reach this fraction of the
#: distance to the nearest hyperplane
SAFE_FRACTION = 0.5
#: the same for answers coarser than float64 (float32, bfloat16): their real rounding is a few units of the
#: largest answer, and 64 of them hide the kinks of weak neurons
COARSE_NOISE_FACTOR = 8.0
#: a kink is merged away when its gradient jump is below this many roundings over the probe radius
#: (float64 answers / coarser answers)
MERGE_NOISE = 64.0
COARSE_MERGE_NOISE = 2.0
MAX_ROUNDS = 200
SIGN_TIME_LIMIT = 5.0
#: coarsest answer rounding the kink search resolves (float32's 1.2e-7 works; float16's 9.8e-4 does not)
FINEST_EPS = 1e-6


def require_fine_answers(oracle, what: str) -> None:
    """Refuse answers coarser than :data:`FINEST_EPS` (float16, bfloat16): the kinks drown in rounding."""
    if oracle.eps > FINEST_EPS:
        raise ConfigError(f"{what} needs answers rounded at most at {FINEST_EPS:g} (float32 or better); these are "
                          f"rounded at {oracle.eps:.2g} ({oracle.precision}), where kinks drown in rounding")
#: regions probed at a radius below this fraction of ‖x‖ are re-measured at the centre of their cell
NARROW = 1e-5
#: times a narrow region may be moved to the centre of its cell (a move into another cell is undone)
CHEBYSHEV_TRIES = 3
#: random inputs per unknown for the least-squares polish (coarse answers only, by default)
POLISH_FACTOR = 3


@dataclass
class _Segment:
    """One segment ``x(t) = base + t·direction``, t ∈ [−1, 1], and what the search learned on it."""

    base: np.ndarray
    direction: np.ndarray
    kinks: list = field(default_factory=list)
    unresolved: int = 0


class _Recorder:
    """Asks the oracle for length-1 queries in batches and remembers every point and answer."""

    def __init__(self, oracle):
        self.oracle = oracle
        self.points: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.top = 0.0

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.shape[0] == 0:
            return np.zeros(0)
        y = self.oracle(X[:, None, :])
        self.points.append(X)
        self.values.append(y)
        self.top = max(self.top, float(np.max(np.abs(y))))
        return y

    def all(self):
        return np.concatenate(self.points), np.concatenate(self.values)


def _meet(l, fl, sl, r, fr, sr):
    """Where the line through (l, fl) with slope sl meets the line through (r, fr) with slope sr."""
    if sl == sr:
        return None
    t = (fr - fl + sl * l - sr * r) / (sl - sr)
    return float(t) if np.isfinite(t) else None


def _meeting_point(L, R):
    """Next split point of a non-linear interval [l, r] from its end points (t, f, f(t−δ), f(t+δ), δ).

    The lines leaving l to the right and r to the left meet at the kink when the interval holds one kink. A
    stencil that straddles a kink gives a secant meeting the other line exactly at the stencil's far end, so such
    meeting points are not used; the kink then lies inside that stencil, where the line arriving at the stencil's
    own centre from the outside meets the other line. Falls back to the middle. Returns (t, meeting point?)."""
    l, r = L[0], R[0]
    sl_out, sl_in = (L[1] - L[2]) / L[4], (L[3] - L[1]) / L[4]
    sr_in, sr_out = (R[1] - R[2]) / R[4], (R[3] - R[1]) / R[4]
    gap = 1e-3 * (r - l)  # never split within 0.1 % of an end: stencils there would be too short
    t = _meet(l, L[1], sl_in, r, R[1], sr_in)
    if t is not None and max(l + 2 * L[4], l + gap) < t < min(r - 2 * R[4], r - gap):
        return t, True
    t = _meet(l, L[1], sl_out, r, R[1], sr_in)  # kink inside l's stencil
    if t is not None and l + gap < t <= l + L[4] and t < r - gap:
        return t, True
    t = _meet(l, L[1], sl_in, r, R[1], sr_out)  # kink inside r's stencil
    if t is not None and r - R[4] <= t < r - gap and t > l + gap:
        return t, True
    return 0.5 * (l + r), False


def _search_kinks(ask, segs, noise_factor, eps, min_width, rng, refit=False):
    """Batched kink search on every segment (critical points as in Carlini et al. 2020, adapted).

    Evaluating a point t costs 3 queries (t − δ, t, t + δ): its value and two stencil points. An interval is
    linear when its chord passes through the stencil points inside it and through one more answer at a random
    point (a value test, exact up to rounding; split points are chosen, so they alone could conspire).
    A non-linear interval is split where the lines through its two ends meet (the kink itself when the interval
    holds one kink and the stencils are clean), or in its middle. When every interval is linear, the kinks are
    the split points where the chord slopes on the two sides differ. With ``refit`` (coarse answers), every
    piece between two kinks is then tested once more against a least-squares line through all its answers
    (:func:`_refit_pieces`): a weak kink next to a strong one hides from the short chords but not from that.
    """
    d = segs[0].base.shape[0]
    floor = 1024 * eps  # inputs are rounded to the answers' precision: shorter stencils measure rounding

    def evaluate(jobs):  # jobs: (segment index, t, δ) -> points (t, f, f(t−δ), f(t+δ), δ)
        if not jobs:
            return []
        pts = np.array([segs[si].base + (t + dt) * segs[si].direction
                        for si, t, delta in jobs for dt in (-delta, 0.0, delta)])
        y = ask(pts.reshape(-1, d)).reshape(-1, 3)
        return [(t, y[i, 1], y[i, 0], y[i, 2], de) for i, (_, t, de) in enumerate(jobs)]

    def linear(L, R, tol_f):
        l, r = L[0], R[0]
        inside = [(l + L[4], L[3])] if l + L[4] < r else []
        if r - R[4] > l:
            inside.append((r - R[4], R[2]))
        if not inside:
            return False
        slope = (R[1] - L[1]) / (r - l)
        return all(abs(L[1] + (x - l) * slope - y) <= 3 * tol_f for x, y in inside)

    ends = evaluate([(si, t, 2.0 / 64) for si in range(len(segs)) for t in (-1.0, 1.0)])
    frontier = [(si, ends[2 * si], ends[2 * si + 1]) for si in range(len(segs))]
    done: list[list] = [[] for _ in segs]  # finished intervals (L, R, tiny?)
    seen: list[list] = [[] for _ in segs]  # the random check answers (t, f)
    rounds = 0
    while frontier:
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise RecoveryError("the kink search did not converge; the oracle may not be a bias-free ReLU network")
        tol_f = noise_factor * eps * max(ask.top, 1e-300)
        jobs, checks = [], []
        for si, L, R in frontier:
            l, r = L[0], R[0]
            w = r - l
            if linear(L, R, tol_f):
                # split points are chosen, not random: confirm with one answer at a random point inside
                checks.append((si, L, R, l + rng.uniform(0.05, 0.95) * w))
                continue
            if w <= min_width:
                done[si].append((L, R, True))
                continue
            t, meeting = _meeting_point(L, R)
            # at a meeting point f agrees with both end lines even when two kinks lie just to one side of it;
            # a short stencil there keeps such a pair from hiding behind the stencil's far point
            rel = 1e-4 if meeting else 1 / 16
            jobs.append((si, t, max(min(rel * w, (t - l) / 4, (r - t) / 4), 1e-6 * w, floor), L, R))
        if checks:
            y = ask(np.array([segs[si].base + t * segs[si].direction for si, _, _, t in checks]))
            for (si, L, R, t), yt in zip(checks, y):
                seen[si].append((t, float(yt)))
                chord = L[1] + (t - L[0]) * (R[1] - L[1]) / (R[0] - L[0])
                if abs(chord - yt) <= 3 * tol_f:
                    done[si].append((L, R, False))
                else:
                    w = R[0] - L[0]
                    jobs.append((si, t, max(min(w / 16, (t - L[0]) / 4, (R[0] - t) / 4), 1e-4 * w, floor), L, R))
        res = evaluate([j[:3] for j in jobs])
        frontier = []
        for (si, t, de, L, R), M in zip(jobs, res):
            frontier.append((si, L, M))
            frontier.append((si, M, R))
    tol_f = noise_factor * eps * max(ask.top, 1e-300)
    tight = 0
    for si, seg in enumerate(segs):
        ivs = sorted(done[si], key=lambda iv: iv[0][0])
        # walk the linear intervals left to right, growing one linear piece; the piece's line through its first
        # and latest points predicts the next end point, and a miss means a kink at the latest point
        start = None
        for L, R, tiny in ivs:
            if tiny:
                seg.kinks.append(0.5 * (L[0] + R[0]))
                tight += 1
                start = None
                continue
            if start is None or start[0] == L[0]:
                start = start or L
                last = R
                continue
            a, c, b = start, last, R
            pred = a[1] + (b[0] - a[0]) * (c[1] - a[1]) / (c[0] - a[0])
            if abs(b[1] - pred) > 8 * tol_f * (1 + 2 * (b[0] - c[0]) / (c[0] - a[0])):
                seg.kinks.append(c[0])
                start = c
            last = R
        seg.kinks.sort()
        if refit:
            pts = {}
            for L, R, _ in ivs:
                for P in (L, R):
                    pts[P[0]] = P[1]
                    pts[P[0] - P[4]] = P[2]
                    pts[P[0] + P[4]] = P[3]
            for t, y in seen[si]:
                pts[t] = y
            ts = np.array(sorted(pts))
            seg.kinks = _refit_pieces(ts, np.array([pts[t] for t in ts]), seg.kinks, 3 * tol_f)
    segs[0].unresolved = tight
    return rounds


def _line_fit(t, y):
    """Least-squares line through (t, y): (slope, intercept, max |residual|, sum of squares)."""
    if t.size < 2:
        return 0.0, float(y[0]) if y.size else 0.0, 0.0, 0.0
    M = np.stack([t, np.ones_like(t)], axis=1)
    (a, b), *_ = np.linalg.lstsq(M, y, rcond=None)
    r = y - (a * t + b)
    return float(a), float(b), float(np.max(np.abs(r))), float(r @ r)


def _refit_pieces(t, y, kinks, tol, max_new=64):
    """Kinks the chord tests missed: every piece between two kinks must lie on one least-squares line through
    all its answers (within ``tol``); a piece that does not is split where two lines fit best, the new kink being
    where those lines meet (or the middle of the gap between the two groups). Points within a stencil of a
    kink are left out (the kink's own position is known to rounding only). Returns the sorted kinks."""
    kinks = sorted(kinks)
    width = float(t[-1] - t[0]) if t.size else 0.0
    pad = 1e-6 * width
    stack = list(zip([-np.inf] + kinks, kinks + [np.inf]))
    added = 0
    while stack and added < max_new:
        lo, hi = stack.pop()
        inside = (t > lo + pad) & (t < hi - pad)
        tp, yp = t[inside], y[inside]
        if tp.size < 5 or _line_fit(tp, yp)[2] <= tol:
            continue
        best = None
        for j in range(2, tp.size - 1):  # two lines: points [:j] and [j:], each of at least 2 points
            a1, b1, m1, s1 = _line_fit(tp[:j], yp[:j])
            a2, b2, m2, s2 = _line_fit(tp[j:], yp[j:])
            if best is None or s1 + s2 < best[0]:
                best = (s1 + s2, j, a1, b1, a2, b2, max(m1, m2))
        _, j, a1, b1, a2, b2, worst = best
        if worst > tol:  # two lines do not explain the piece either: leave it to the region checks
            continue
        k = (b2 - b1) / (a1 - a2) if a1 != a2 else np.nan
        if not (np.isfinite(k) and tp[j - 1] <= k <= tp[j]):
            k = 0.5 * (tp[j - 1] + tp[j])
        kinks.append(float(k))
        added += 1
        stack += [(lo, float(k)), (float(k), hi)]
    return sorted(kinks)


def _regions(seg):
    """Linear regions along a segment: (left bound, right bound) between consecutive kinks and ±1."""
    bounds = [-1.0] + list(seg.kinks) + [1.0]
    return list(zip(bounds[:-1], bounds[1:]))


def _gradients(ask, points, radii, U):
    """Gradient of f at each point from ``f(x + h u_i) − f(x)`` for the orthonormal rows u_i of U (d+1 queries
    per point). Exact while every probe stays in the point's linear region."""
    n, d = points.shape
    X = np.concatenate([points[:, None, :], points[:, None, :] + radii[:, None, None] * U[None]], axis=1)
    y = ask(X.reshape(-1, d)).reshape(n, d + 1)
    D = (y[:, 1:] - y[:, :1]) / radii[:, None]  # D[r, i] = g_r·u_i
    return D @ U, y[:, 0]  # g_r = Σ_i (g_r·u_i) u_i, and f at the points


def _cell_signs(regs, segs, i, N, side):
    """Side of region i (regions ``(segment, l, r)`` in order) for every recovered hyperplane (columns of N, one per
    pair of neighbouring regions on one segment). A hyperplane found on the region's own segment crosses it once,
    at its kink, so the region's side follows from the order of the kinks; the sign at the measuring point
    (``side``, used for the other hyperplanes) is wrong when a thin region puts it within the hyperplanes' own error."""
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


def _chebyshev_centre(N, signs, x0):
    """Deepest point of the cone cell ``{x : signs_k n_kᵀx ≥ 0}`` inside the box ``‖x‖_∞ ≤ ‖x0‖_∞`` (an LP):
    returns (x, its distance to the nearest hyperplane) or (None, 0) when the solver fails."""
    from scipy.optimize import linprog

    d, k = N.shape
    box = float(np.max(np.abs(x0)))
    A_ub = np.concatenate([-(signs[None, :] * N).T, np.ones((k, 1))], axis=1)  # −s_k n_kᵀx + r ≤ 0
    c = np.zeros(d + 1)
    c[-1] = -1.0
    res = linprog(c, A_ub=A_ub, b_ub=np.zeros(k), bounds=[(-box, box)] * d + [(0, None)], method="highs")
    if res.status != 0 or res.x is None or res.x[-1] <= 0:
        return None, 0.0
    return res.x[:d], float(res.x[-1])


def _solve_signs(J, v, tol, time_limit):
    """Orientations s ∈ {±1}^m with ``J s = v`` (J: d×m). Returns (s, exact?, how)."""
    d, m = J.shape
    if m == 0:
        return np.zeros(0), bool(np.linalg.norm(v) <= tol), "no neurons"
    c, *_ = np.linalg.lstsq(J, v, rcond=None)
    s = np.where(c >= 0, 1.0, -1.0)
    if np.linalg.norm(J @ s - v) <= tol:
        return s, True, "linear solve"
    if np.linalg.matrix_rank(J) == m:
        return s, False, "linear solve (no ±1 solution: antiparallel or merged neurons)"
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:  # pragma: no cover - scipy < 1.9
        return s, False, "no MILP solver"
    # s = 2b − 1 with b ∈ {0,1}^m:  2 J b = v + J 1, each row within tol
    rhs = v + J.sum(axis=1)
    row_tol = tol / math.sqrt(d)
    cons = LinearConstraint(2 * J, rhs - row_tol, rhs + row_tol)
    res = milp(np.zeros(m), constraints=cons, integrality=np.ones(m), bounds=Bounds(0, 1),
               options={"time_limit": float(time_limit), "disp": False})
    if res.x is not None:
        s2 = np.where(res.x > 0.5, 1.0, -1.0)
        if np.linalg.norm(J @ s2 - v) <= tol:
            return s2, True, "0/1 program (HiGHS)"
    how = "0/1 program found no ±1 solution" if res.status == 2 else f"0/1 program stopped ({res.message})"
    return s, False, how


def _polish(A, w, X, y, margin=1e-3, rounds=3, max_unknowns=8192):
    """Least-squares polish on every answer already paid for: with the activation pattern of the current
    neurons fixed, ``f(x) = Σ_k [a_kᵀx > 0] (w_k a_k)ᵀx`` is linear in ``b_k = w_k a_k``. Points within
    ``margin``·‖x‖ of a hyperplane are left out (their pattern is uncertain). Averaging over all answers
    beats the d+1 finite differences per region when answers are coarse (float32). Returns (A, w, used?)."""
    d, m = A.shape
    if d * m > max_unknowns or X.shape[0] < d * m:
        return A, w, False
    used = False
    for _ in range(rounds):
        H = X @ A
        dist = np.abs(H) / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300)
        ok = np.min(dist, axis=1) > margin
        if ok.sum() < d * m:
            break
        act = (H[ok] > 0).astype(np.float64)
        F = (act[:, :, None] * X[ok][:, None, :]).reshape(-1, m * d)
        old = float(np.linalg.norm(F @ (w[:, None] * A.T).reshape(-1) - y[ok]))
        b, *_ = np.linalg.lstsq(F, y[ok], rcond=None)
        B = b.reshape(m, d)
        new = float(np.linalg.norm(F @ b - y[ok]))
        nb = np.linalg.norm(B, axis=1)
        same = np.einsum("kd,dk->k", B, A) * w > 0  # b_k = w_k a_k keeps the neuron's orientation
        if not (new < old and same.all() and (nb > 0).all()):
            break
        A, w, used = (np.sign(w)[:, None] * B / nb[:, None]).T, np.sign(w) * nb, True  # a_k = sign(w_k) b_k/‖b_k‖
    return A, w, used


def extract_ffn(oracle, *, seed: int = 0, v: np.ndarray | None = None, min_width: float | None = None,
                min_jump: float = 1e-6, min_region: float = 1e-7, chebyshev: bool = True,
                probe_fraction: float = PROBE_FRACTION, noise_factor: float | None = None,
                refine: str = "auto", polish: str = "auto", sign_time_limit: float = SIGN_TIME_LIMIT, check: bool = True,
                check_count: int = 64, progress=None) -> Extraction:
    """Recover a bias-free ReLU network ``x ↦ w_oᵀReLU(Aᵀx)`` from length-1 value queries.

    ``v`` (= ``A w_o``, the odd part) may be given when already known (e.g. from the antisymmetric oracle);
    otherwise it costs 2d queries. The tolerances that matter:

    * ``noise_factor``: answers within this many roundings of the largest answer count as "on a line"
      (default 64 for float64 answers, 8 for coarser ones, whose pieces between kinks are then also checked
      against a least-squares line through all their answers);
    * ``min_width``: search intervals shorter than this (in units of the search line; default
      ``max(1e-9, 1024·eps)``) are taken to hold one kink;
    * ``min_jump`` / ``min_region``: a kink whose gradient jump is below ``min_jump`` times the largest (or below
      its finite-difference noise), and a region narrower than ``min_region``, are taken as a split point that
      sat within rounding of a real kink and merged away (two real kinks that close are taken as one);
    * ``probe_fraction``: how far towards the nearest kink along the line the gradient probes reach;
    * ``refine``: ``"always"`` re-measures every region at the largest safe radius, ``"auto"``/``"never"`` only
      regions whose probes crossed a recovered hyperplane or broke Euler's identity ``f(x) = ∇f(x)·x``;
    * ``chebyshev``: regions the search line only grazes are re-measured at the deepest point of their cell
      (an LP over the recovered hyperplanes), where wider probes give more precise gradients;
    * ``polish``: refit all neurons by least squares on ``3·d·m`` fresh random inputs (``"auto"``: only when
      answers are coarser than float64, where it brings float32 answers to float32 precision);
    * ``sign_time_limit``: seconds for the 0/1 program that fixes neuron orientations when m > d.

    The result's model is a :class:`ReLUNet` with unit-norm columns of A; ``details`` holds the query
    breakdown, how the orientations were found and whether they are exact, and a self-consistency residual.
    """
    if refine not in ("auto", "always", "never"):
        raise ConfigError(f"refine must be auto, always or never; got {refine!r}")
    if not 0 < probe_fraction < 1:
        raise ConfigError(f"probe_fraction must lie in (0, 1); got {probe_fraction}")
    t0 = time.perf_counter()
    require_fine_answers(oracle, "the ReLU-network learner")
    rng = np.random.default_rng(seed)
    d = oracle.d
    eps = oracle.eps
    start = oracle.queries
    report = progress or (lambda done, total: None)
    min_width = float(min_width) if min_width is not None else max(1e-9, 1024 * eps)
    coarse = eps > 1e-12
    if noise_factor is None:
        noise_factor = COARSE_NOISE_FACTOR if coarse else NOISE_FACTOR
    merge_noise = COARSE_MERGE_NOISE if coarse else MERGE_NOISE
    ask = _Recorder(oracle)
    notes: list[str] = []
    counts: dict = {}

    # odd part: f(x) − f(−x) = vᵀx
    if v is None:
        I = np.eye(d)
        y = ask(np.concatenate([I, -I]))
        v = y[:d] - y[d:]
        counts["odd_part"] = 2 * d
    else:
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        if v.shape != (d,):
            raise ConfigError(f"v must have length {d}; got {v.shape}")
        counts["odd_part"] = 0

    # two segments covering every direction up to sign
    if d == 1:  # directions ±1 only: the segment through 0 sees the single hyperplane x = 0
        segs = [_Segment(np.zeros(1), np.ones(1))]
    else:
        Q, _ = np.linalg.qr(rng.standard_normal((d, 2)))
        segs = [_Segment(Q[:, 0], Q[:, 1]), _Segment(Q[:, 1], Q[:, 0])]
    before = oracle.queries
    rounds = _search_kinks(ask, segs, noise_factor, eps, min_width, rng, refit=coarse)
    counts["kink_search"] = oracle.queries - before
    tight = sum(s.unresolved for s in segs)
    n_kinks = sum(len(s.kinks) for s in segs)
    report(oracle.queries - start, oracle.queries - start + (d + 1) * (n_kinks + len(segs)))

    # gradients of every region along every segment
    regs = [(si, l, r) for si, s in enumerate(segs) for (l, r) in _regions(s)]
    U = random_orthogonal(d, rng)

    def region_points(ts, idx=None):
        idx = range(len(regs)) if idx is None else idx
        return np.array([segs[regs[i][0]].base + t * segs[regs[i][0]].direction for i, t in zip(idx, ts)])

    ts = np.array([0.5 * (l + r) for _, l, r in regs])
    lens = np.array([np.linalg.norm(segs[si].direction) for si, _, _ in regs])
    radii = probe_fraction * 0.5 * np.array([r - l for _, l, r in regs]) * lens / math.sqrt(d)
    before = oracle.queries
    G, F0 = _gradients(ask, region_points(ts), radii, U)
    counts["gradients"] = oracle.queries - before
    report(oracle.queries - start, oracle.queries - start)

    def jumps(G):
        same = np.array([regs[i][0] == regs[i + 1][0] for i in range(len(regs) - 1)], dtype=bool)
        J = (G[1:] - G[:-1])[same].T if same.any() else np.zeros((d, 0))
        where = np.array([regs[i][0] for i in range(len(regs) - 1) if same[i]], dtype=int)
        return J.reshape(d, -1), where

    # a region narrower than min_region (in t) lies between a kink and a split point within rounding of it: its
    # gradient equals one neighbour's up to its (large) finite-difference noise; join it to that neighbour
    tiny_merged = 0
    i = 0
    while i < len(regs):
        si, l, r = regs[i]
        nbrs = [j for j in (i - 1, i + 1) if 0 <= j < len(regs) and regs[j][0] == si]
        if r - l >= min_region or not nbrs:
            i += 1
            continue
        j = min(nbrs, key=lambda k: float(np.linalg.norm(G[k] - G[i])))
        lo, hi = min(i, j), max(i, j)
        regs[lo:hi + 1] = [(si, regs[lo][1], regs[hi][2])]
        ts, F0, radii = np.delete(ts, i), np.delete(F0, i), np.delete(radii, i)
        G = np.delete(G, i, axis=0)
        tiny_merged += 1
        i = lo

    # a split point within rounding of a kink can pass for a second kink; its jump is ~0: merge its two regions
    J, _ = jumps(G)
    norms = np.linalg.norm(J, axis=0)
    dropped = 0
    if norms.size:
        floor = min_jump * float(norms.max())
        i = 0
        while i < len(regs) - 1:
            # noise floor of a finite-difference gradient: a few roundings of the answers over the probe radius
            noise = merge_noise * eps * ask.top * math.sqrt(d) * (1 / radii[i] + 1 / radii[i + 1])
            if regs[i][0] == regs[i + 1][0] and np.linalg.norm(G[i + 1] - G[i]) <= max(floor, noise):
                keep = i if regs[i][2] - regs[i][1] >= regs[i + 1][2] - regs[i + 1][1] else i + 1
                merged = (regs[i][0], regs[i][1], regs[i + 1][2])
                regs[i:i + 2] = [merged]
                ts = np.delete(ts, 2 * i + 1 - keep)
                F0 = np.delete(F0, 2 * i + 1 - keep)
                radii = np.delete(radii, 2 * i + 1 - keep)
                G = np.delete(G, 2 * i + 1 - keep, axis=0)
                dropped += 1
            else:
                i += 1
    for si, seg in enumerate(segs):
        seg.kinks = [l for (sj, l, _) in regs if sj == si][1:]

    # re-measure regions whose probes crossed a recovered hyperplane (and all regions when refining)
    do_refine = refine == "always"
    counts["re_measured"] = 0
    redone_regions = 0
    XR = region_points(ts)  # where each region's gradient is measured
    moved = 0
    attempts = np.zeros(len(regs), dtype=int)
    cheb_tries = np.zeros(len(regs), dtype=int)
    for round_ in range(8):
        J, where = jumps(G)
        norms = np.linalg.norm(J, axis=0)
        N = J / np.where(norms > 0, norms, 1.0)
        if N.shape[1] == 0:
            break
        # candidate points inside each region: pick the one farthest from every recovered hyperplane
        cand = np.linspace(0.1, 0.9, 9)
        best_x, best_dist = XR.copy(), np.zeros(len(regs))
        for i, (si, l, r) in enumerate(regs):
            P = segs[si].base[None, :] + (l + cand * (r - l))[:, None] * segs[si].direction[None, :]
            dist = np.min(np.abs(P @ N), axis=1)
            j = int(np.argmax(dist))
            best_x[i], best_dist[i] = P[j], dist[j]
        side0 = XR @ N
        crossed = np.array([bool(np.any(np.sign((XR[i] + radii[i] * U) @ N) != np.sign(side0[i])))
                            for i in range(len(regs))])
        # Euler's identity f(x) = ∇f(x)·x holds inside every linear region of a positively homogeneous f:
        # a probe that left the region breaks it (free check, no queries)
        euler = np.abs(np.einsum("rd,rd->r", G, XR) - F0)
        euler_tol = 64 * eps * ask.top * (1 + math.sqrt(d) * np.linalg.norm(XR, axis=1) / radii)
        broken = euler > euler_tol
        # a region the search line cuts only near its edge: move off the line to the centre of its cell
        narrow = np.zeros(len(regs), dtype=bool)
        if chebyshev:
            # a move is sent back when the centre lies in another cell, which happens while a neighbouring
            # region's bad gradient still distorts a recovered hyperplane: try again in later rounds, once those
            # regions are re-measured (at most CHEBYSHEV_TRIES times per region)
            for i in np.flatnonzero((radii < NARROW * np.linalg.norm(XR, axis=1)) & (cheb_tries < CHEBYSHEV_TRIES)):
                cheb_tries[i] += 1
                x, rad = _chebyshev_centre(N, _cell_signs(regs, segs, i, N, side0[i]), XR[i])
                if x is not None and SAFE_FRACTION * rad > 8 * radii[i]:
                    best_x[i], best_dist[i], narrow[i] = x, rad, True
        redo = crossed | broken | narrow | (do_refine and round_ == 0)
        if not redo.any():
            break
        idx = np.flatnonzero(redo)
        moved += int(narrow.sum())
        old_x, old_r = XR.copy(), radii.copy()
        XR[idx] = best_x[idx]
        # a region measured again (or whose Euler check failed) shrinks its probes 8x at least: the recovered
        # hyperplanes near it may be the ones its own bad gradient distorted
        shrink = (broken[idx] | (attempts[idx] > 0)) & ~narrow[idx]
        radii[idx] = np.where(shrink, np.minimum(SAFE_FRACTION * best_dist[idx], radii[idx] / 8),
                              SAFE_FRACTION * best_dist[idx])
        attempts[idx] += 1
        if np.any(radii[idx] <= 0):
            raise RecoveryError("a linear region is too thin to probe; retry with another --seed")
        old = (G[idx].copy(), F0[idx].copy(), old_x[idx], old_r[idx])
        before = oracle.queries
        G[idx], F0[idx] = _gradients(ask, XR[idx], radii[idx], U)
        counts["re_measured"] += oracle.queries - before
        # a moved region must keep its gradient (up to the old measurement's noise), else it left its cell
        noise_old = 64 * eps * ask.top * math.sqrt(d) / old[3]
        back = narrow[idx] & (np.linalg.norm(G[idx] - old[0], axis=1) > 16 * noise_old)
        if back.any():
            b = idx[back]
            G[b], F0[b], XR[b], radii[b] = old[0][back], old[1][back], old[2][back], old[3][back]
            moved -= int(back.sum())
        redone_regions += len(idx)
    J, where = jumps(G)

    # orientation of each neuron from the odd part
    scale_v = max(float(np.linalg.norm(v)), float(np.sum(np.linalg.norm(J, axis=0))), 1e-300)
    tol = max(1e-6 if eps > 1e-12 else 1e-8, 1e4 * eps) * scale_v
    s, exact, how = _solve_signs(J, v, tol, sign_time_limit)
    dirs = np.array([segs[si].direction for si in where]).reshape(-1, d)
    sigma = np.sign(np.sum(J.T * dirs, axis=1))  # sign(J_k·q) = sign(w_k)
    cols = (s * sigma)[None, :] * J  # a_k = s_k σ_k J_k, w_k = σ_k
    weights = sigma.copy()
    rho = v - J @ s
    if not exact:
        r = float(np.linalg.norm(rho))
        if r > 0:
            cols = np.concatenate([cols, (rho / r)[:, None], (-rho / r)[:, None]], axis=1)
            weights = np.concatenate([weights, [0.5 * r, -0.5 * r]])
        notes.append(f"neuron orientations not pinned down ({how}): two extra neurons carry the linear part "
                     f"½ρᵀx with ‖ρ‖/‖v‖ = {r / max(np.linalg.norm(v), 1e-300):.2e}; the network computes the "
                     "same function but its neurons are not the target's")
    # unit columns, positive scale folded into w_o
    cn = np.linalg.norm(cols, axis=0)
    keep = cn > 0
    A_hat = cols[:, keep] / cn[keep]
    w_hat = weights[keep] * cn[keep]
    if A_hat.shape[1] == 0:
        raise UnidentifiableError("the network answers 0 on every query: no neuron is visible (all dead)")
    Xs, ys = ask.all()
    polished = False
    if polish == "always" or (polish == "auto" and eps > 1e-12):
        # the answers so far lie near two lines; the refit needs inputs spread over every direction
        n_fit = POLISH_FACTOR * d * A_hat.shape[1]
        oracle.require(n_fit, f"the least-squares polish ({n_fit} random inputs)")
        before = oracle.queries
        Xp = rng.standard_normal((n_fit, d))
        yp = ask(Xp)
        counts["polish"] = oracle.queries - before
        A_hat, w_hat, polished = _polish(A_hat, w_hat, Xp, yp)
    model = ReLUNet(A_hat, w_hat)

    resid = float(np.max(np.abs(model.forward(Xs) - ys)) / max(ask.top, 1e-300))
    queries = oracle.queries - start
    details = {
        "seed": seed, "min_width": min_width, "noise_factor": noise_factor, "probe_fraction": probe_fraction,
        "refine": refine, "polished": polished, "neurons_found": int(J.shape[1]), "kinks_per_segment": [len(s.kinks) for s in segs],
        "search_rounds": rounds, "kinks_at_min_width": tight, "kinks_dropped_min_jump": dropped, "tiny_regions_merged": tiny_merged, "regions_moved_off_line": moved, "regions": len(regs), "regions_re_measured": redone_regions,
        "orientation": how, "orientation_exact": bool(exact),
        "orientation_residual": float(np.linalg.norm(rho) / max(np.linalg.norm(v), 1e-300)),
        "query_breakdown": counts, "queries_per_dm": queries / (d * max(J.shape[1], 1)),
        "self_consistency": resid,
    }
    res = Extraction("ffn", model, queries, ReLUNet.unknowns(d, max(J.shape[1], 1)), 0.0, details=details,
                     notes=notes)
    if check:
        res.check = functional_check(oracle, model, rng, lengths=(1,), per_length=check_count)
    res.seconds = time.perf_counter() - t0
    return res
