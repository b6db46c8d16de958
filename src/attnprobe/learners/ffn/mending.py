"""Mending a coarse-answer network whose first line left a neuron missing or wrong (float32 answers).

In order, until the answers are explained: neurons found in the polish answers (:func:`found_in_answers`, no
query), a repair line searched only where the first line's neurons are contradicted (:func:`repair_line`), then
whole further lines (:mod:`.more_lines`). Every neuron set tried is a :class:`Candidate`; the lines searched so
far are one :class:`Lines`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

import numpy as np

from attnprobe.errors import BudgetExceededError
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.ffn.answers import Answers
from attnprobe.learners.ffn.fit import Neurons, fit_output_bias, jump_neurons, polish
from attnprobe.learners.ffn.kinks import Segment
from attnprobe.learners.ffn.line import line_noise_factor, line_scale, search_and_measure, segments
from attnprobe.learners.ffn.missing import faint_last, missing_neuron_candidates, tidy
from attnprobe.learners.ffn.more_lines import MAX_LINES, SAME_NEURON_COS, candidate_sets, needs_another_line
from attnprobe.learners.ffn.options import FFNOptions
from attnprobe.learners.ffn.orientation import Orientation
from attnprobe.learners.ffn.regions import hyperplane_normals
from attnprobe.learners.ffn.repair import contradicted, failed_side_checks, repaired_set, sub_segment, suspect_spans
from attnprobe.learners.ffn.settle import (Oriented, consistency, linear_rest, orient_neurons, repolish, settle,
                                           settles_on_polish)

#: coarse answers: neurons found in the polish answers (:mod:`.missing`) at most, one after another
MAX_FOUND_IN_ANSWERS = 3
#: ... while each lowers the largest miss of the answers by at least this share
FOUND_GAIN = 0.1
#: least-squares work of one polish round (rows × unknowns²) up to which it is tried: a step fits the candidates
#: and polishes three (biased float32 d = 16, m = 32: 6.4e8, 1.8 s; d = 64, m = 16: 4.5e9, 7.3 s, measured with
#: the other core busy); d = 784 would factor a 31,400 × 7,851 span
FOUND_MAX_WORK = 1e10


@dataclass(frozen=True)
class Candidate:
    """A neuron set the mending may keep: how far its network misses the answers asked so far (``miss``, relative
    to the largest answer), the gradient jumps it was built from (K, D per neuron) and the network (oriented,
    polished)."""

    miss: float
    jumps: np.ndarray
    net: Oriented

    @property
    def exact(self) -> bool:
        return bool(self.net.orientation.exact)

    def explains(self, eps: float) -> bool:
        """Whether it orients exactly and explains every answer (:func:`needs_another_line`'s bar)."""
        return not needs_another_line(self.exact, self.miss, eps)

    def rank(self, eps: float) -> tuple:
        """Sort key, best first: explaining every answer, then an exact orientation, then the smaller miss."""
        return (needs_another_line(True, self.miss, eps), not self.exact, self.miss)


@dataclass(frozen=True)
class Lines:
    """The jumps of every line searched so far: ``where`` indexes the segments ``segs``, ``line`` numbers the line
    each jump came from."""

    J: np.ndarray
    where: np.ndarray
    segs: list[Segment]
    line: np.ndarray = None

    def __post_init__(self) -> None:
        if self.line is None:
            object.__setattr__(self, "line", np.zeros(self.J.shape[0], dtype=int))

    def joined(self, J2: np.ndarray, where2: np.ndarray, new_segs: list[Segment]) -> "Lines":
        """These lines and another's jumps (on ``new_segs``)."""
        return Lines(np.concatenate([self.J, J2]), np.concatenate([self.where, where2 + len(self.segs)]),
                     self.segs + new_segs, np.concatenate([self.line, np.full(J2.shape[0], self.line.max() + 1)]))


@dataclass(frozen=True)
class Repair:
    """What the repair line found: the jumps on the spans that contradict the first line's neurons, their
    sub-segments (``where`` indexes them), the neuron set it proposes (a mask over the first line's jumps then
    these) and what the test saw."""

    J: np.ndarray
    where: np.ndarray
    segs: list[Segment]
    proposal: np.ndarray
    stats: dict


@dataclass(frozen=True)
class Mended:
    """The neuron set kept and what the mending did (``lines``, ``neurons_per_line``, ``sets_tried``, ``kept``, and
    ``stopped`` when the budget had no room for another line)."""

    kept: Candidate
    summary: dict = field(default_factory=dict)


class _Mending:
    """The state of one mending: the run, the answers, the linear part v, the options, the polish answers, and
    the summary every tried set is counted in."""

    def __init__(self, run: Run, ask: Answers, v, opts: FFNOptions, fit_data, first: Lines):
        self.run, self.ask, self.v, self.opts, self.fit_data = run, ask, v, opts, fit_data
        self.eps = ask.oracle.eps
        self.summary = {"lines": 1, "neurons_per_line": [int(first.J.shape[0])], "sets_tried": 0,
                        "kept": "first line"}

    def score(self, lines: Lines, keep: np.ndarray) -> Candidate:
        self.summary["sets_tried"] += 1
        return score_set(self.ask, lines, keep, self.v, self.opts, self.fit_data)

    def best_of(self, lines: Lines, name: str, best: Candidate, proposal=None) -> Candidate:
        """The best neuron set of ``lines`` (:func:`candidate_sets`; ``proposal`` first), when it beats ``best``."""
        sets, singles = candidate_sets(lines.J, lines.line)
        if proposal is not None:  # the repair line's own proposal first
            sets.insert(0, proposal)
        scored = [(self.score(lines, keep), keep) for keep in sets]
        top, keep = min(scored, key=lambda sk: sk[0].rank(self.eps))
        for k in np.flatnonzero(singles & ~keep):  # one line alone saw it: kept when it explains more
            trial = keep.copy()
            trial[k] = True
            got = self.score(lines, trial)
            if got.miss < 0.5 * top.miss and got.rank(self.eps) < top.rank(self.eps):
                top, keep = got, trial
        if top.rank(self.eps) < best.rank(self.eps):
            self.summary["kept"] = f"{int(keep.sum())} neurons from {name}"
            return top
        return best


def mend(run: Run, ask: Answers, first: Lines, fitted: Oriented, v, opts: FFNOptions, fit_data, *,
         noise) -> Mended:
    """Coarse answers whose first line left a neuron missing or wrong: first the neurons found in the polish
    answers (:func:`found_in_answers`, no query; kept when they explain every answer), then a repair line
    (:func:`repair_line`, searched only where the first line's neurons are contradicted; ``noise``: their jumps'
    relative errors), then, when its neurons do not explain every answer either, as without it (:mod:`.more_lines`):
    up to :data:`MAX_LINES` − 1 more lines, and after each keep the neuron set whose polished network best explains
    every answer (a set that explains them all beats one that does not, then one that orients exactly). Stops when
    the answers are explained or the budget has no room for another line."""
    n_first = first.J.shape[0]
    found = found_in_answers(run, ask, jump_columns(fitted.neurons, n_first), v, opts, fit_data)
    if found is not None:  # no query: the polish answers held the neurons the line missed
        k = found.jumps.shape[0]
        return Mended(replace(found, jumps=np.concatenate([first.J, found.jumps])), {
            "lines": 1, "neurons_per_line": [int(n_first)], "sets_tried": 0, "found_in_answers": k,
            "kept": f"the first line's {n_first} neurons and {k} found in the polish answers" if k else
                    f"the first line's {n_first} neurons, oriented as polished"})
    m = _Mending(run, ask, v, opts, fit_data, first)
    as_fitted = Candidate(consistency(fitted.neurons, ask), first.J, fitted)
    best, lines, repaired = as_fitted, first, None
    try:
        repair = repair_line(run, ask, first, opts, noise)
    except BudgetExceededError:
        m.summary["stopped"] = "budget"
    else:
        m.summary["repair"] = repair.stats
        if repair.J.shape[0]:
            lines = first.joined(repair.J, repair.where, repair.segs)
            best = m.best_of(lines, "the first line and the repair line", best, repair.proposal)
        if not best.explains(m.eps):  # not repaired: whole lines, as without it
            repaired, best, lines = best, as_fitted, first
    while m.summary["lines"] < MAX_LINES and "stopped" not in m.summary and not best.explains(m.eps):
        new_segs = segments(ask.d, ask.lifted, run.rng, opts.reach, line_scale(ask.d, ask.lifted, True))  # coarse
        try:
            with run.phase("more_lines", absorb=True):
                J2, where2 = search_and_measure(run, ask, new_segs, opts, True)["regions"].jumps()
        except BudgetExceededError:
            m.summary["stopped"] = "budget"
            break
        m.summary["lines"] += 1
        m.summary["neurons_per_line"].append(int(J2.shape[0]))
        lines = lines.joined(J2, where2, new_segs)
        best = m.best_of(lines, f"{m.summary['lines']} lines", best)
    if repaired is not None and repaired.rank(m.eps) < best.rank(m.eps):
        best = repaired
        m.summary["kept"] = f"{repaired.jumps.shape[0]} neurons from the first line and the repair line"
    return Mended(best, m.summary)


def jump_columns(neurons: Neurons, n: int) -> Neurons:
    """The first ``n`` neurons (those of the jumps), without the pairs that carry a linear rest
    (:func:`orient_neurons`)."""
    return replace(neurons, dirs=neurons.dirs[:, :n], weights=neurons.weights[:n])


def found_in_answers(run: Run, ask: Answers, neurons: Neurons, v, opts: FFNOptions, fit_data) -> Candidate | None:
    """Coarse answers whose polished neurons miss some: neurons fitted to the polish answers beyond the found ones
    (:mod:`.missing`, no query), one at a time (the best of a few candidates, each polished with the others), up to
    :data:`MAX_FOUND_IN_ANSWERS`, while each lowers the miss by :data:`FOUND_GAIN` and is no fainter than
    :data:`.missing.FAINT`. Kept only when the set then orients exactly and explains every answer asked so far
    (:func:`needs_another_line`, the bar of a line's own set; orientations as :func:`settle_or_keep`). When none
    is added, the first line's own set, polished again, is tested the same way. ``neurons``: the first line's jump
    neurons, polished (:func:`jump_columns`). Returns the set, whose ``jumps`` are those of the added neurons
    (k, K, D), or None."""
    Z, Y = fit_data
    if Z.shape[0] * float(ask.dim * (neurons.dirs.shape[1] + 1)) ** 2 > FOUND_MAX_WORK:
        return None
    eps = ask.oracle.eps
    rng = np.random.Generator(run.rng.bit_generator.jumped(2))  # the run's own stream stays as it was
    miss, added = consistency(neurons, ask), 0
    for _ in range(MAX_FOUND_IN_ANSWERS):
        best = None
        for n, w in missing_neuron_candidates(neurons.dirs, Z, Y, ask.lifted, rng)[0]:
            trial = Neurons(np.concatenate([neurons.dirs, n[:, None]], axis=1),
                            np.concatenate([neurons.weights, w[None, :]]), neurons.c)
            trial = repolish(trial, ask, fit_data)
            got = consistency(trial, ask)
            if best is None or got < best[0]:
                best = (got, trial)
        if best is None or best[0] > (1 - FOUND_GAIN) * miss or faint_last(best[1]):
            break
        (miss, neurons), added = best, added + 1
        if not needs_another_line(True, miss, eps):
            break
    if added == 0:  # none missing, yet the first line's set failed: orientations off v (kept when it explains all)
        neurons = repolish(neurons, ask, fit_data)
    net = settle_or_keep(neurons, v, opts, ask, fit_data)
    tidied, added = tidy(net.neurons, added)  # the polish may leave one neuron on another's hyperplane, or faint
    if tidied.dirs.shape[1] < net.neurons.dirs.shape[1]:
        net = settle_or_keep(repolish(tidied, ask, fit_data), v, opts, ask, fit_data)
    found = Candidate(consistency(net.neurons, ask), np.zeros(0), net)
    if not found.explains(eps):
        return None
    neurons = net.neurons
    new = slice(neurons.dirs.shape[1] - added, None)  # their jumps as a line would measure them: w_k ⊗ dir_k
    return replace(found, jumps=np.einsum("kj,ek->kje", neurons.weights[new], neurons.dirs[:, new]))


def settle_or_keep(neurons: Neurons, v, opts: FFNOptions, ask: Answers, fit_data) -> Oriented:
    """Orientations settled on polished neurons (:func:`settle`); when no ±1 vector reproduces the linear part v
    but the neurons as polished explain every answer, they are kept as they are: v comes from the first line's two
    end regions, whose gradients are off when a kink the line missed lies in one (measured: 2.5e-2 relative, where
    the polished set was 5e-8 from the true ``A w_o``), and a neuron turned the wrong way would change the function
    by a linear term that every answer shows."""
    settled = settle(neurons, v, opts, ask, fit_data)
    if settled.orientation.exact or needs_another_line(True, consistency(neurons, ask), ask.oracle.eps):
        return settled
    rest = linear_rest(neurons, v, ask.d)
    off = np.linalg.norm(rest) / max(float(np.linalg.norm(v)), 1e-300)
    return Oriented(neurons, (), Orientation(np.ones(neurons.dirs.shape[1]), True, "as polished: they explain every "
                                             f"answer (v from the line's ends {off:.1e} off)"), rest)


def score_set(ask: Answers, lines: Lines, keep: np.ndarray, v, opts: FFNOptions, fit_data) -> Candidate:
    """The network of the jumps ``keep`` selects, oriented and polished (on the polish answers ``fit_data``), and
    how far it misses the answers."""
    settles = settles_on_polish(ask, int(keep.sum()))
    net = orient_neurons(lines.J[keep], lines.where[keep], lines.segs, v, opts, ask.oracle.eps, ask.lifted,
                         provisional=settles)
    neurons = net.neurons
    if ask.lifted:
        neurons = replace(neurons, c=fit_output_bias(neurons, *ask.all()))
    net = replace(net, neurons=polish(neurons, *fit_data, ask.lifted)[0])
    if settles:
        net = settle(net.neurons, v, opts, ask, fit_data)
    return Candidate(consistency(net.neurons, ask), lines.J[keep], net)


def repair_line(run: Run, ask: Answers, first: Lines, opts: FFNOptions, noise: np.ndarray) -> Repair:
    """A fresh line tested against the first line's neurons (:mod:`.repair`, 3 answers per interval between their
    predicted kinks; ``noise``: each jump's relative error); kinks searched and gradients measured only on the
    spans that contradict them."""
    J1, where1, segs1 = first.J, first.where, first.segs
    N, C = jump_neurons(J1, hyperplane_normals(J1), np.array([segs1[si].direction for si in where1]).T)
    # its own random stream (a jump ahead of the run's, which it leaves as it was): the whole lines searched when
    # the repair fails are the ones searched without it
    run = copy.copy(run)
    run.rng = np.random.Generator(run.rng.bit_generator.jumped())
    segs = segments(ask.d, ask.lifted, run.rng, opts.reach, line_scale(ask.d, ask.lifted, True))  # coarse
    tol_f = line_noise_factor(opts, True) * ask.oracle.eps * max(ask.top, 1e-300)
    with run.phase("repair_line", absorb=True):
        spans, checks, stats = suspect_spans(ask, segs, N, C, noise, tol_f)
        subs = [sub_segment(segs[si], lo, hi) for si, lo, hi in spans]
        if not subs:
            return Repair(np.zeros((0,) + J1.shape[1:]), np.zeros(0, dtype=int), [], np.ones(J1.shape[0], bool), stats)
        q0 = run.queries
        state = search_and_measure(run, ask, subs, opts, True)
        regions = state["regions"]
        stats["search_queries"] = run.queries - q0
        stats["regions"] = len(regions.regs)
    J2, where2 = regions.jumps()
    grad_noise = 2 * ask.oracle.eps * ask.top * np.sqrt(ask.dim)  # two roundings per probe
    N2 = hyperplane_normals(J2)
    drop = (contradicted(N, segs, spans, N2, SAME_NEURON_COS)
            | failed_side_checks(checks, spans, segs, regions, ask.mix, grad_noise, J1.shape[0]))
    keep = repaired_set(N, noise, drop, N2, regions.jump_noise(ask.oracle.eps), SAME_NEURON_COS)
    stats.update(jumps=int(J2.shape[0]), contradicted=int(drop.sum()))
    return Repair(J2, where2, subs, keep, stats)
