"""Kinks along a segment: batched critical-point search (Carlini–Jagielski–Mironov 2020, Jagielski et al. 2020),
adapted to answers known only up to rounding.

A ReLU network is piecewise linear along any segment ``x(t) = base + t·direction`` (t ∈ [−1, 1]); its kinks are
where the segment crosses a neuron's hyperplane. :func:`search_kinks` finds them with 3 queries per evaluated
point (the value and a two-sided stencil; :mod:`.pinning` adds 4 to place a kink found inside a stencil) and no
other assumption than piecewise linearity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnprobe.errors import RecoveryError
from attnprobe.learners.ffn.pinning import pinned
from attnprobe.learners.ffn.stencil import Stencil, meet_lines

#: rounds of interval splitting before the search gives up
MAX_ROUNDS = 200
#: open intervals at once before the search gives up (a network of m neurons keeps about 2m open; answers noisier
#: than their precision bend every chord, and the intervals double each round)
MAX_OPEN = 1 << 14
#: kinks taken at the minimal width before the search gives up (two kinks closer than it are rare: at most 15 on
#: float32 d = 8, m = 32 over 10 seeds, 0–1 on float64 64-256 and 784-64; float32-declared answers with 1e-4
#: noise end every interval there: 680k queries, then minutes in the region phase and 24 GB of memory)
MAX_TIGHT = 1 << 12


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
    #: a split point whose short stencil holds one kink is moved onto the kink, confirmed by four more answers
    #: (:func:`~attnprobe.learners.ffn.pinning.pinned`): float64 answers
    pin: bool = False


def _clean(S: Stencil, tol_f: float | None) -> bool:
    """Whether S's two slopes agree within their rounding (no kink inside its stencil); never without ``tol_f``."""
    return tol_f is not None and abs(S.slope_out_right - S.slope_out_left) <= 4 * tol_f / S.delta


def meeting_point(L: Stencil, R: Stencil, zoom: bool = False, tol_f: float | None = None) -> tuple[float, bool]:
    """Next split point of a non-linear interval [L.t, R.t] from its two end stencils.

    The lines leaving l to the right and r to the left meet at the kink when the interval holds one kink. A
    stencil that straddles a kink gives a secant meeting the other line exactly at the stencil's far end, so such
    meeting points are not used; the kink then lies inside that stencil, where the line arriving at the stencil's
    own centre from the outside meets the other line. Falls back to the middle. Returns (t, meeting point?).

    ``zoom``: a kink inside an end's stencil but closer to that end than the 0.1 % gap (an end placed on a kink
    to within its slopes' rounding) is bracketed by a split at the gap, so the next interval is 1000 times
    shorter, not half as long: the search reaches its minimal width in about three rounds instead of ~25
    bisections (whose number varied with where the kinks fell). ``tol_f`` (float64 answers): an end whose two
    slopes agree within their rounding holds no kink inside its stencil, so the lines may meet anywhere beyond
    it, not only two stencils away (wide midpoint stencils otherwise sent intervals with one kink near an end to
    bisection), and no kink is looked for inside it (several kinks in the interval put the lines' meeting
    anywhere, also next to a clean end, which then drew zoom splits)."""
    l, r = L.t, R.t
    clean_l, clean_r = _clean(L, tol_f), _clean(R, tol_f)
    reach_l = (1 if clean_l else 2) * L.delta
    reach_r = (1 if clean_r else 2) * R.delta
    sl_out, sl_in = L.slope_out_left, L.slope_out_right
    sr_in, sr_out = R.slope_out_left, R.slope_out_right
    gap = 1e-3 * (r - l)  # never split within 0.1 % of an end: stencils there would be too short
    t = meet_lines((l, L.f, sl_in), (r, R.f, sr_in))
    if t is not None and max(l + reach_l, l + gap) < t < min(r - reach_r, r - gap):
        return t, True
    t = None if clean_l else meet_lines((l, L.f, sl_out), (r, R.f, sr_in))  # kink inside l's stencil
    if t is not None and l + gap < t <= l + L.delta and t < r - gap:
        return t, True
    if zoom and t is not None and l < t <= min(l + gap, l + L.delta):
        return l + gap, False
    t = None if clean_r else meet_lines((l, L.f, sl_in), (r, R.f, sr_out))  # kink inside r's stencil
    if t is not None and r - R.delta <= t < r - gap and t > l + gap:
        return t, True
    if zoom and t is not None and max(r - gap, r - R.delta) <= t < r:
        return r - gap, False
    return 0.5 * (l + r), False


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
            state.tight += 1
        else:
            jobs.append(_split_job(si, L, R, floor, settings.zoom, clean_tol))
    if checks:
        y = ask(np.array([segs[si].at(t) for si, _, _, t in checks]))
        for (si, L, R, t), yt in zip(checks, y):
            state.seen[si].append((t, float(yt)))
            chord = L.f + (t - L.t) * (R.f - L.f) / (R.t - L.t)
            if abs(chord - yt) <= 3 * tol_f:
                state.done[si].append((L, R, False))
            else:
                w = R.t - L.t
                jobs.append((si, t, max(min(w / 16, (t - L.t) / 4, (R.t - t) / 4), 1e-4 * w, floor), L, R))
    res = _evaluate(ask, segs, [j[:3] for j in jobs])
    if settings.pin:
        res = pinned(ask, segs, jobs, res, tol_f)
    out = []
    for (si, _, _, L, R), M in zip(jobs, res):
        out += [(si, L, M), (si, M, R)]
    return out


@dataclass
class _SearchState:
    rng: np.random.Generator
    done: list  # per segment: finished intervals (L, R, tiny?)
    seen: list  # per segment: the random check answers (t, f)
    tight: int = 0  # intervals finished at the minimal width


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
        if state.tight > MAX_TIGHT:
            raise RecoveryError(f"the kink search ended more than {MAX_TIGHT} intervals at its minimal width, each "
                                "still bent: the answers are not piecewise linear to within their precision "
                                "(noisier than declared, or not a ReLU network); declare the coarser precision they "
                                "have")
        if len(frontier) > MAX_OPEN:
            raise RecoveryError(f"the kink search split the line into more than {MAX_OPEN} intervals, each still "
                                "bent: the answers are not piecewise linear to within their precision (noisier "
                                "than declared, or not a ReLU network); declare the coarser precision they have "
                                "(float32 answers are searched with a float32 tolerance)")
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
