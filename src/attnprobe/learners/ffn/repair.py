"""A repair line for coarse answers: a fresh line searched only where the first line's neurons are wrong.

The first line's neurons (its jumps, before the polish: with a neuron missing the polish bends every other one to
make up for it, ~1e-2 rad, where the jumps are ~1e-4 off) predict on any other line where each of their kinks
falls and how much the slope changes there. Between two predicted kinks the answers must lie on one line, and
across each predicted kink the slope must change by the predicted amount. Three answers per interval test both;
only where a test fails, a neuron is missing or wrong (a kink the first line missed or merged with another), and
only there are the kinks searched and the gradients measured (:func:`suspect_spans`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnprobe.learners.ffn.kinks import Segment

#: a predicted kink may lie this many times its jump's finite-difference error (:meth:`Regions.jump_noise`, an
#: angle) off, over the angle at which its hyperplane meets the line (float32: measured 0.1–1 times that error)
KINK_BAND = 0.5
#: ... but at most this angle (rad): weak neurons' estimates run to ~1 while their jumps were measured ≤ 4e-3 off
#: (a kink beyond its band costs a search of its interval, which measures it again)
MAX_KINK_ANGLE = 3e-3
#: an interval between predicted kinks is tested only where it is longer than this (in t)
MIN_SPAN = 1e-3
#: a slope change may differ from its prediction by this many times the crossed jump's error
SLOPE_BAND = 0.5


def crossings(seg: Segment, N: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the hyperplanes through 0 with unit normals N (columns) cross the line of ``seg``, ``t = −nᵀbase /
    nᵀdirection`` (inf or nan where the line runs parallel), and the slopes ``nᵀdirection``."""
    along = seg.direction @ N
    with np.errstate(divide="ignore", invalid="ignore"):
        return -(seg.base @ N) / along, along


def predicted_kinks(N: np.ndarray, C: np.ndarray, noise: np.ndarray, mix: np.ndarray, seg: Segment):
    """Where the hyperplanes (unit normals, columns of N) cross ``seg`` (t in (−1, 1), sorted), how far each may
    be off (:data:`KINK_BAND`), the slope change of the mixed answer there and its allowance. ``C`` (m, K):
    the effective output weights (the jump across hyperplane k towards +n_k is ``C_k ⊗ n_k``); ``noise``: each
    jump's relative error. Also returns the neurons' indices in that order."""
    t, along = crossings(seg, N)
    k = np.flatnonzero(np.isfinite(t) & (np.abs(t) < 1))
    k = k[np.argsort(t[k])]
    t = t[k]
    norm_z = np.linalg.norm(seg.at(t), axis=-1) if t.size else np.zeros(0)
    band = np.minimum(KINK_BAND * noise[k], MAX_KINK_ANGLE) * norm_z / np.abs(along[k])
    weight = C[k] @ mix
    allow = SLOPE_BAND * noise[k] * np.abs(weight) * np.linalg.norm(seg.direction)
    return t, band, weight * np.abs(along[k]), allow, k


@dataclass(frozen=True)
class SideCheck:
    """A predicted kink (neuron ``k``) next to a searched span on one side (``at``: that span's end, ``side``: +1
    when the kink lies above it, −1 below) and a straight interval on the other (its slope ``outside``): the span's
    gradient there settles whether the slope changes as predicted (``change``, within ``tol``)."""

    seg: int
    k: int
    at: float
    side: int
    outside: float
    change: float
    tol: float


def suspect_spans(ask, segs, N, C, noise, tol_f: float):
    """Spans ``(segment, lo, hi)`` of ``segs`` where the answers contradict the predicted kinks: an interval
    between two predicted kinks whose three answers are not on a line (and a predicted kink between two such
    intervals), or a predicted kink across which the slope changes by more or less than predicted (kinks closer
    than their bands: the group of them, by the sum of their changes). Asks 3 answers
    per tested interval (one batch). Returns the spans, the :class:`SideCheck` of every predicted kink between a
    not-straight interval and a straight one, and what was tested."""
    plan, preds = [], []  # (segment, lo, hi) of every tested interval; per segment the predicted kinks
    for si, seg in enumerate(segs):
        t, band, change, allow, k = predicted_kinks(N, C, noise, ask.mix, seg)
        ends, pads = np.r_[-1.0, t, 1.0], np.r_[0.0, band, 0.0]
        spans = [(lo, hi) if hi - lo > MIN_SPAN else None
                 for lo, hi in zip(ends[:-1] + pads[:-1], ends[1:] - pads[1:])]
        preds.append((change, allow, k, spans))
        plan += [(si, *s) for s in spans if s is not None]
    pts = np.array([segs[si].at(x) for si, lo, hi in plan for x in (lo, 0.5 * (lo + hi), hi)])
    y = ask(pts).reshape(-1, 3) if plan else np.zeros((0, 3))
    slope = {(si, lo): (y[i, 2] - y[i, 0]) / (hi - lo) for i, (si, lo, hi) in enumerate(plan)}
    bent = {(si, lo) for i, (si, lo, hi) in enumerate(plan) if abs(y[i, 1] - 0.5 * (y[i, 0] + y[i, 2])) > 3 * tol_f}
    flagged = [(si, lo, hi) for si, lo, hi in plan if (si, lo) in bent]
    mismatched, checks = 0, []
    for si, (change, allow, ks, spans) in enumerate(preds):
        # kinks with no tested interval between them (their bands overlap) are checked together: the slope across
        # the group changes by the sum of their changes
        tested = [i for i, s in enumerate(spans) if s is not None]
        for a, b in zip(tested[:-1], tested[1:]):  # the kinks a … b−1 lie between tested intervals a and b
            left, right, group = spans[a], spans[b], slice(a, b)
            want, room = float(np.sum(change[group])), float(np.sum(allow[group]))
            noise_l, noise_r = 4 * tol_f / (left[1] - left[0]), 4 * tol_f / (right[1] - right[0])
            bl, br = (si, left[0]) in bent, (si, right[0]) in bent
            if (bl and br) or ((bl or br) and b > a + 1):  # unverifiable from the answers: searched with the
                flagged.append((si, left[1], right[0]))            # bent interval(s) beside
            elif bl or br:
                out, at, side = (slope[(si, right[0])], left[1], 1) if bl else (slope[(si, left[0])], right[0], -1)
                checks.append(SideCheck(si, int(ks[a]), at, side, out, want, (noise_r if bl else noise_l) + room))
            elif abs(slope[(si, right[0])] - slope[(si, left[0])] - want) > noise_l + noise_r + room:
                mismatched += 1
                flagged.append((si, 0.5 * (left[0] + left[1]), 0.5 * (right[0] + right[1])))
    spans = _merged(flagged)
    return spans, checks, {"intervals_tested": len(plan), "not_straight": len(bent),
                           "slope_mismatches": mismatched, "spans_searched": len(spans)}


def failed_side_checks(checks, spans, segs, regions, mix, grad_noise: float, m: int) -> np.ndarray:
    """Neurons (of ``m``) whose :class:`SideCheck` fails once the spans were searched: the slope inside the span
    next to the kink is its end region's gradient along the line (``regions`` measured on the sub-segments of
    ``spans``, in order; ``grad_noise``: a gradient's rounding error times the probe radius)."""
    bad = np.zeros(m, dtype=bool)
    for c in checks:
        i = next((j for j, (si, lo, hi) in enumerate(spans) if si == c.seg and (lo == c.at or hi == c.at)), None)
        if i is None or spans[i][2 if c.side > 0 else 1] != c.at:
            continue
        r = [j for j, (sj, _, _) in enumerate(regions.regs) if sj == i]
        r = r[-1] if c.side > 0 else r[0]
        inside = float(mix @ regions.G[r] @ segs[c.seg].direction)
        got = (c.outside - inside) * c.side
        tol = c.tol + grad_noise * np.linalg.norm(segs[c.seg].direction) / regions.radii[r]
        bad[c.k] |= abs(got - c.change) > tol
    return bad


def sub_segment(seg: Segment, lo: float, hi: float) -> Segment:
    """The part ``lo ≤ t ≤ hi`` of ``seg`` as a segment of its own (t in [−1, 1])."""
    return Segment(seg.at(0.5 * (lo + hi)), 0.5 * (hi - lo) * seg.direction)


def contradicted(N: np.ndarray, segs, spans, N_new: np.ndarray, same_cos: float) -> np.ndarray:
    """Neurons (columns of N) whose kink falls inside a searched span, yet no jump found there (unit normals
    ``N_new``) is the same hyperplane (to ``same_cos``): two neurons the first line took for one, or none."""
    bad = np.zeros(N.shape[1], dtype=bool)
    match = np.max(np.abs(N.T @ N_new), axis=1) > same_cos if N_new.shape[1] else np.zeros(N.shape[1], dtype=bool)
    for si, lo, hi in spans:
        t, _ = crossings(segs[si], N)
        bad |= (t > lo) & (t < hi) & ~match
    return bad


def _merged(spans):
    """Overlapping ``(segment, lo, hi)`` spans joined."""
    out = []
    for si, lo, hi in sorted(spans):
        if out and out[-1][0] == si and lo <= out[-1][2]:
            out[-1] = (si, out[-1][1], max(hi, out[-1][2]))
        else:
            out.append((si, lo, hi))
    return out


def repaired_set(N1: np.ndarray, noise1: np.ndarray, drop: np.ndarray, N2: np.ndarray, noise2: np.ndarray,
                 same_cos: float) -> np.ndarray:
    """The neuron set the repair line proposes, as a mask over the first line's jumps then the repair line's: the
    first line's neurons it did not contradict and every jump it measured, one jump per hyperplane (unit normals
    ``N1``, ``N2``; to ``same_cos``), the one with the smaller relative error (``noise1``, ``noise2``)."""
    N = np.concatenate([N1, N2], axis=1)
    err = np.r_[noise1, noise2]
    keep = np.r_[~drop, np.ones(N2.shape[1], dtype=bool)]
    for k in np.argsort(err):  # the better measured first: each removes its worse duplicates
        if keep[k]:
            same = (np.abs(N.T @ N[:, k]) > same_cos) & keep
            same[k] = False
            keep &= ~same
    return keep
