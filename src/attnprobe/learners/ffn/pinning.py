"""Kink pinning (float64 answers): a kink found inside a split point's short stencil is placed to rounding from
four more answers, instead of bracketing it down to the search's minimal width over several rounds.

Where the lines through the search's two interval ends meet (:func:`~.kinks.meeting_point`) lies a kink to
within the slopes' rounding (~1e-10), so the split point's stencil (±δ, δ ≤ 0.1 % of the interval) straddles it.
Two answers 2δ out give each piece a line through three answers; two answers ε beside the first guess must lie
on the two lines. The kink is where the lines meet. A second kink inside the stencil leaves some answer off its
line (unless both lie within ε of each other; ε ~ 1e-4 δ, beyond the first guess's own error of ~1e-9 when the
meeting point fell on the kink), and then nothing is pinned and the search goes on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnprobe.learners.ffn.stencil import Stencil, line_through, meet_lines, value_on


def _piece(points: list, tol: float):
    """The line through the two farthest of ``points`` ``(t, f)`` when every point lies on it within ``tol``."""
    pts = sorted(points)
    line = line_through(*pts[0], *pts[-1])
    return line if all(abs(f - value_on(line, t)) <= tol for t, f in pts) else None


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
            near = line_through(M.t - de, M.left, M.t, M.f)
            rough, lo, hi = (M.t + de, M.right, R.slope_out_left), M.t, M.t + de
        else:  # M.f, M.right on the right piece; M.left on the left piece, of L's slope
            near = line_through(M.t, M.f, M.t + de, M.right)
            rough, lo, hi = (M.t - de, M.left, L.slope_out_right), M.t - de, M.t
        t = meet_lines(near, rough)
        if t is None or not lo <= t <= hi:
            continue
        if not (L.t < t - 2 * de and t + 2 * de < R.t):
            return None
        tol = 4 * tol_f
        eps = max(1e-4 * de, 32 * tol / abs(near[2] - rough[2]))
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
        t = None if a is None or b is None else meet_lines(a, b)
        if t is not None and max(p[0] for p in lp) <= t <= min(p[0] for p in rp):
            f = value_on(a, t)
            return Stencil(t, f, f - M.delta * a[2], f + M.delta * b[2], M.delta)
    return None


def pinned(ask, segs, jobs, res: list[Stencil], tol_f: float) -> list[Stencil]:
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
