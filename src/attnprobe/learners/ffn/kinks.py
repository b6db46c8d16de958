"""Kinks along a segment: batched critical-point search (Carlini–Jagielski–Mironov 2020, Jagielski et al. 2020),
adapted to answers known only up to rounding.

A ReLU network is piecewise linear along any segment ``x(t) = base + t·direction`` (t ∈ [−1, 1]); its kinks are
where the segment crosses a neuron's hyperplane. :func:`search_kinks` finds them with 3 queries per evaluated
point (the value and a two-sided stencil) and no other assumption than piecewise linearity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnprobe.errors import RecoveryError

#: rounds of interval splitting before the search gives up
MAX_ROUNDS = 200


@dataclass
class Segment:
    """One segment ``x(t) = base + t·direction``, t ∈ [−1, 1], and what the search learned on it."""

    base: np.ndarray
    direction: np.ndarray
    kinks: list = field(default_factory=list)
    unresolved: int = 0

    def at(self, t) -> np.ndarray:
        """Points ``base + t·direction`` for a scalar or an array of t."""
        t = np.asarray(t, dtype=np.float64)
        return self.base + t[..., None] * self.direction


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


@dataclass(frozen=True)
class SearchSettings:
    """Tolerances of the kink search: answers within ``noise_factor`` roundings (``eps``) of the largest answer
    count as on a line; intervals shorter than ``min_width`` hold one kink; ``refit`` re-tests every piece
    against a least-squares line (coarse answers)."""

    noise_factor: float
    eps: float
    min_width: float
    refit: bool = False
    #: lifted segments end at s = δ: their end stencils must stay at s > 0
    end_stencil: float = 2.0 / 64  # stencil half-width at t = ±1 (its outer point lies beyond the segment)
    #: a kink found at an interval's end is bracketed 1000-fold per round (:func:`meeting_point`): float64 answers
    zoom: bool = False
    #: a split point whose stencil holds one kink is moved onto the kink, confirmed by one answer there
    #: (:func:`_pinned`): float64 answers
    pin: bool = False


def _meet(l, fl, sl, r, fr, sr):
    """Where the line through (l, fl) with slope sl meets the line through (r, fr) with slope sr."""
    if sl == sr:
        return None
    t = (fr - fl + sl * l - sr * r) / (sl - sr)
    return float(t) if np.isfinite(t) else None


def _clean(S: Stencil, tol_f: float | None) -> bool:
    """Whether S's two slopes agree within their rounding (no kink inside its stencil); never without ``tol_f``."""
    return tol_f is not None and abs(S.slope_out_right - S.slope_out_left) <= 4 * tol_f / S.delta


def informed_split(L: Stencil, R: Stencil, zoom: bool = False,
                   tol_f: float | None = None) -> tuple[float, bool] | None:
    """Next split point of a non-linear interval [L.t, R.t] from its two end stencils, or None.

    The lines leaving l to the right and r to the left meet at the kink when the interval holds one kink. A
    stencil that straddles a kink gives a secant meeting the other line exactly at the stencil's far end, so such
    meeting points are not used; the kink then lies inside that stencil, where the line arriving at the stencil's
    own centre from the outside meets the other line. None when neither applies. Returns (t, meeting point?).

    ``zoom``: a kink inside an end's stencil but closer to that end than the 0.1 % gap (an end placed on a kink
    to within its slopes' rounding) is bracketed by a split at the gap, so the next interval is 1000 times
    shorter, not half as long: the search reaches its minimal width in about three rounds instead of ~25
    bisections (whose number varied with where the kinks fell). ``tol_f`` (float64 answers): an end whose two
    slopes agree within their rounding holds no kink inside its stencil, so the lines may meet anywhere beyond
    it, not only two stencils away (wide midpoint stencils otherwise sent intervals with one kink near an end to
    bisection)."""
    l, r = L.t, R.t
    reach_l = (1 if _clean(L, tol_f) else 2) * L.delta
    reach_r = (1 if _clean(R, tol_f) else 2) * R.delta
    sl_out, sl_in = L.slope_out_left, L.slope_out_right
    sr_in, sr_out = R.slope_out_left, R.slope_out_right
    gap = 1e-3 * (r - l)  # never split within 0.1 % of an end: stencils there would be too short
    t = _meet(l, L.f, sl_in, r, R.f, sr_in)
    if t is not None and max(l + reach_l, l + gap) < t < min(r - reach_r, r - gap):
        return t, True
    t = _meet(l, L.f, sl_out, r, R.f, sr_in)  # kink inside l's stencil
    if t is not None and l + gap < t <= l + L.delta and t < r - gap:
        return t, True
    if zoom and t is not None and l < t <= min(l + gap, l + L.delta):
        return l + gap, False
    t = _meet(l, L.f, sl_in, r, R.f, sr_out)  # kink inside r's stencil
    if t is not None and r - R.delta <= t < r - gap and t > l + gap:
        return t, True
    if zoom and t is not None and max(r - gap, r - R.delta) <= t < r:
        return r - gap, False
    return None


def meeting_point(L: Stencil, R: Stencil, zoom: bool = False, tol_f: float | None = None) -> tuple[float, bool]:
    """:func:`informed_split`, falling back to the middle of the interval. Returns (t, meeting point?)."""
    return informed_split(L, R, zoom, tol_f) or (0.5 * (L.t + R.t), False)


def _evaluate(ask, segs, jobs) -> list[Stencil]:
    """Stencils at the jobs ``(segment index, t, δ)``: 3 queries each, one batch."""
    if not jobs:
        return []
    pts = np.array([segs[si].at(t + dt) for si, t, delta in jobs for dt in (-delta, 0.0, delta)])
    y = ask(pts).reshape(-1, 3)
    return [Stencil(t, y[i, 1], y[i, 0], y[i, 2], de) for i, (_, t, de) in enumerate(jobs)]


def _chord_is_linear(L: Stencil, R: Stencil, tol_f: float) -> bool:
    """The chord from L to R passes through the stencil points inside [L.t, R.t]."""
    inside = [(L.t + L.delta, L.right)] if L.t + L.delta < R.t else []
    if R.t - R.delta > L.t:
        inside.append((R.t - R.delta, R.left))
    if not inside:
        return False
    slope = (R.f - L.f) / (R.t - L.t)
    return all(abs(L.f + (x - L.t) * slope - y) <= 3 * tol_f for x, y in inside)


def _split_job(si, L: Stencil, R: Stencil, floor: float, zoom: bool, tol_f: float | None = None):
    """Where to split a non-linear interval and how wide a stencil to evaluate there."""
    l, r = L.t, R.t
    w = r - l
    t, meeting = meeting_point(L, R, zoom, tol_f)
    # at a meeting point f agrees with both end lines even when two kinks lie just to one side of it;
    # a short stencil there keeps such a pair from hiding behind the stencil's far point
    rel = 1e-4 if meeting else 1 / 16
    return si, t, max(min(rel * w, (t - l) / 4, (r - t) / 4), 1e-6 * w, floor), L, R


def _search_round(ask, segs, frontier, settings: SearchSettings, state) -> list:
    """One batched round: every open interval is either confirmed linear (one random value) or split."""
    floor = 1024 * settings.eps  # inputs are rounded to the answers' precision: shorter stencils measure rounding
    tol_f = settings.noise_factor * settings.eps * max(ask.top, 1e-300)
    clean_tol = tol_f if settings.zoom else None  # float64: ends without a kink in their stencil met closer
    jobs, checks = [], []
    for si, L, R in frontier:
        w = R.t - L.t
        if _chord_is_linear(L, R, tol_f):
            # split points are chosen, not random: confirm with one answer at a random point inside. Coarse answers:
            # in the middle half, where two close kinks of one sign leave at least a quarter of their largest miss of
            # the chord (near an end the miss shrinks to rounding, and the pair passed for a line on some CPUs)
            lo, hi = (0.25, 0.75) if settings.refit else (0.05, 0.95)
            checks.append((si, L, R, L.t + state.rng.uniform(lo, hi) * w))
        elif w <= settings.min_width:
            state.done[si].append((L, R, True))
        else:
            jobs.append(_split_job(si, L, R, floor, settings.zoom, clean_tol))
    if checks:
        y = ask(np.array([segs[si].at(t) for si, _, _, t in checks]))
        for (si, L, R, t), yt in zip(checks, y):
            state.seen[si].append((t, float(yt)))
            chord = L.f + (t - L.t) * (R.f - L.f) / (R.t - L.t)
            if abs(chord - yt) <= 3 * tol_f:
                state.done[si].append((L, R, False))
            elif settings.zoom and informed_split(L, R, True, clean_tol) is not None:
                jobs.append(_split_job(si, L, R, floor, True, clean_tol))
            else:
                w = R.t - L.t
                jobs.append((si, t, max(min(w / 16, (t - L.t) / 4, (R.t - t) / 4), 1e-4 * w, floor), L, R))
    res = _evaluate(ask, segs, [j[:3] for j in jobs])
    if settings.pin:
        res = _pinned(ask, segs, jobs, res, tol_f)
    out = []
    for (si, _, _, L, R), M in zip(jobs, res):
        out += [(si, L, M), (si, M, R)]
    return out


def _line_through(t0: float, f0: float, t1: float, f1: float) -> tuple[float, float, float]:
    """The line through two answers, as (point t, value there, slope)."""
    return t0, f0, (f1 - f0) / (t1 - t0)


def _meet_lines(a, b) -> float | None:
    """Where two lines ``(t, f, slope)`` meet (None when parallel or not finite)."""
    if a[2] == b[2]:
        return None
    t = (b[1] - a[1] + a[2] * a[0] - b[2] * b[0]) / (a[2] - b[2])
    return float(t) if np.isfinite(t) else None


def _on(line, t: float) -> float:
    return line[1] + line[2] * (t - line[0])


def _piece(points: list, tol: float):
    """The line through the two farthest of ``points`` ``(t, f)`` when every point lies on it within ``tol``."""
    pts = sorted(points)
    line = _line_through(*pts[0], *pts[-1])
    return line if all(abs(f - _on(line, t)) <= tol for t, f in pts) else None


@dataclass(frozen=True)
class PinCandidate:
    """A kink inside a split point's short stencil (:func:`pin_candidate`): its first guess ``t``, the offset ``eps``
    of the two answers beside it, the offset ``far`` of two more (2δ out on either side) and the tolerance of an
    answer on a piece."""

    t: float
    eps: float
    far: float
    tol: float

    def points(self) -> list[float]:
        return [self.t - self.far, self.t - self.eps, self.t + self.eps, self.t + self.far]


def pin_candidate(L: Stencil, M: Stencil, R: Stencil, tol_f: float) -> PinCandidate | None:
    """A single kink inside split point M's short stencil (a meeting point, δ ≤ 0.1 % of [L, R]) whose two slopes
    differ beyond their rounding: a first guess where the piece through M's two answers on one side meets the
    line through its third answer with the slope of the interval's end on that side. None when the stencil is
    wide, its slopes agree, the guess falls outside the stencil or the kink is too weak to tell the two pieces
    apart ε beside it."""
    de = M.delta
    if de > 1e-3 * (R.t - L.t):
        return None
    slope_err = 2 * tol_f / de
    if abs(M.slope_out_right - M.slope_out_left) <= 8 * slope_err:
        return None
    for near_is_left in (True, False):
        if near_is_left:  # M.left, M.f on the left piece; M.right on the right piece, of R's slope
            near, rough, lo, hi = _line_through(M.t - de, M.left, M.t, M.f), (M.t + de, M.right, R.slope_out_left), \
                M.t, M.t + de
        else:  # M.f, M.right on the right piece; M.left on the left piece, of L's slope
            near, rough, lo, hi = _line_through(M.t, M.f, M.t + de, M.right), (M.t - de, M.left, L.slope_out_right), \
                M.t - de, M.t
        t = _meet_lines(near, rough)
        if t is None or not lo <= t <= hi:
            continue
        if not (L.t < t - 2 * de and t + 2 * de < R.t):
            return None
        tol = 4 * tol_f
        eps = max(1e-5 * de, 32 * tol / abs(near[2] - rough[2]))
        if eps > de / 4:
            return None
        return PinCandidate(t, eps, 2 * de, tol)
    return None


def pin_kink(M: Stencil, c: PinCandidate, answers) -> Stencil | None:
    """The stencil at the kink inside M's stencil, from M's three answers and the candidate's four (``answers`` at
    ``c.points()``): the answers left of the kink on one line and those right of it on another, at least three
    on each (M's centre on either side), the two ε beside the kink on different pieces (a second kink next to it
    would leave one of them off its line: the lines differ there by 32 tolerances). None when no split of the
    answers fits two lines."""
    far_l, y_l, y_r, far_r = (float(v) for v in answers)
    left = [(c.t - c.far, far_l), (M.t - M.delta, M.left), (c.t - c.eps, y_l)]
    right = [(c.t + c.eps, y_r), (M.t + M.delta, M.right), (c.t + c.far, far_r)]
    for centre_left in (True, False):
        lp, rp = (left + [(M.t, M.f)], right) if centre_left else (left, right + [(M.t, M.f)])
        a, b = _piece(lp, c.tol), _piece(rp, c.tol)
        t = None if a is None or b is None else _meet_lines(a, b)
        if t is not None and max(p[0] for p in lp) <= t <= min(p[0] for p in rp):
            f = _on(a, t)
            return Stencil(t, f, f - M.delta * a[2], f + M.delta * b[2], M.delta)
    return None


def _pinned(ask, segs, jobs, res: list[Stencil], tol_f: float) -> list[Stencil]:
    """Float64 answers: a split point whose short stencil holds one kink (:func:`pin_candidate`) is replaced by a
    stencil at the kink itself (:func:`pin_kink`, four answers each). The kink is then known to rounding, where
    the search would otherwise bracket it down to its minimal width over several rounds (a count that varied from
    run to run)."""
    cands = [(i, pin_candidate(L, M, R, tol_f)) for i, ((_, _, _, L, R), M) in enumerate(zip(jobs, res))]
    cands = [(i, c) for i, c in cands if c is not None]
    if not cands:
        return res
    y = ask(np.array([segs[jobs[i][0]].at(t) for i, c in cands for t in c.points()])).reshape(-1, 4)
    res = list(res)
    for (i, c), yc in zip(cands, y):
        res[i] = pin_kink(res[i], c, yc) or res[i]
    return res


@dataclass
class _SearchState:
    rng: np.random.Generator
    done: list  # per segment: finished intervals (L, R, tiny?)
    seen: list  # per segment: the random check answers (t, f)


def search_kinks(ask, segs: list[Segment], settings: SearchSettings, rng: np.random.Generator) -> int:
    """Batched kink search on every segment; fills ``segs[i].kinks`` and returns the number of rounds.

    An interval is linear when its chord passes through the stencil points inside it and through one more answer
    at a random point (a value test, exact up to rounding; split points are chosen, so they alone could conspire).
    A non-linear interval is split where the lines through its two ends meet (the kink itself when the interval
    holds one kink and the stencils are clean), or in its middle. When every interval is linear, the kinks are
    the split points where the chord slopes on the two sides differ. With ``settings.refit`` (coarse answers),
    every piece between two kinks is then tested once more against a least-squares line through all its answers
    (:func:`refit_pieces`): a weak kink next to a strong one hides from the short chords but not from that.
    """
    ends = _evaluate(ask, segs, [(si, t, settings.end_stencil) for si in range(len(segs)) for t in (-1.0, 1.0)])
    frontier = [(si, ends[2 * si], ends[2 * si + 1]) for si in range(len(segs))]
    state = _SearchState(rng, [[] for _ in segs], [[] for _ in segs])
    rounds = 0
    while frontier:
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise RecoveryError("the kink search did not converge; the oracle may not be a ReLU network")
        frontier = _search_round(ask, segs, frontier, settings, state)
    tol_f = settings.noise_factor * settings.eps * max(ask.top, 1e-300)
    tight = 0
    for si, seg in enumerate(segs):
        ivs = sorted(state.done[si], key=lambda iv: iv[0].t)
        tight += _collect_kinks(seg, ivs, tol_f)
        if settings.refit:
            ts, ys = _answers_on(ivs, state.seen[si])
            seg.kinks = refit_pieces(ts, ys, seg.kinks, 3 * tol_f)
    segs[0].unresolved = tight
    return rounds


def _collect_kinks(seg: Segment, ivs, tol_f: float) -> int:
    """Walk the linear intervals left to right, growing one linear piece; the piece's line through its first and
    latest points predicts the next end point, and a miss means a kink at the latest point. Returns the number
    of kinks taken at the minimal width (``tiny`` intervals)."""
    start = last = None
    tight = 0
    for L, R, tiny in ivs:
        if tiny:
            seg.kinks.append(0.5 * (L.t + R.t))
            tight += 1
            start = None
            continue
        if start is None or start.t == L.t:
            start = start or L
            last = R
            continue
        a, c, b = start, last, R
        pred = a.f + (b.t - a.t) * (c.f - a.f) / (c.t - a.t)
        if abs(b.f - pred) > 8 * tol_f * (1 + 2 * (b.t - c.t) / (c.t - a.t)):
            seg.kinks.append(c.t)
            start = c
        last = R
    seg.kinks.sort()
    return tight


def _answers_on(ivs, seen) -> tuple[np.ndarray, np.ndarray]:
    """Every answer the search has on one segment, sorted by t."""
    pts = {}
    for L, R, _ in ivs:
        for P in (L, R):
            pts[P.t], pts[P.t - P.delta], pts[P.t + P.delta] = P.f, P.left, P.right
    for t, y in seen:
        pts[t] = y
    ts = np.array(sorted(pts))
    return ts, np.array([pts[t] for t in ts])


def line_fit(t, y):
    """Least-squares line through (t, y): (slope, intercept, max |residual|, sum of squares)."""
    if t.size < 2:
        return 0.0, float(y[0]) if y.size else 0.0, 0.0, 0.0
    M = np.stack([t, np.ones_like(t)], axis=1)
    (a, b), *_ = np.linalg.lstsq(M, y, rcond=None)
    r = y - (a * t + b)
    return float(a), float(b), float(np.max(np.abs(r))), float(r @ r)


def _best_two_lines(tp, yp):
    """Split point j and the two least-squares lines (points [:j] and [j:]) that fit the piece best."""
    best = None
    for j in range(2, tp.size - 1):  # each line through at least 2 points
        a1, b1, m1, s1 = line_fit(tp[:j], yp[:j])
        a2, b2, m2, s2 = line_fit(tp[j:], yp[j:])
        if best is None or s1 + s2 < best[0]:
            best = (s1 + s2, j, a1, b1, a2, b2, max(m1, m2))
    return best[1:]


def refit_pieces(t, y, kinks, tol, max_new=64):
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
        if tp.size < 5 or line_fit(tp, yp)[2] <= tol:
            continue
        j, a1, b1, a2, b2, worst = _best_two_lines(tp, yp)
        if worst > tol:  # two lines do not explain the piece either: leave it to the region checks
            continue
        k = (b2 - b1) / (a1 - a2) if a1 != a2 else np.nan
        if not (np.isfinite(k) and tp[j - 1] <= k <= tp[j]):
            k = 0.5 * (tp[j - 1] + tp[j])
        kinks.append(float(k))
        added += 1
        stack += [(lo, float(k)), (float(k), hi)]
    return sorted(kinks)
