"""Float32 answers: the repair line. A fresh line is tested against the kinks the first line's neurons predict (3
answers per interval between them) and searched only where they are contradicted, so a neuron the first line
missed, or two it took for one, is found for a fraction of a whole line's queries."""

import numpy as np
import pytest

from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.ffn.answers import Answers
from attnprobe.learners.ffn.kinks import Segment
from attnprobe.learners.ffn.line import search_and_measure, segments
from attnprobe.learners.ffn.mending import Lines, repair_line, score_set
from attnprobe.learners.ffn.options import FFNOptions
from attnprobe.learners.ffn.settle import consistency
from attnprobe.learners.ffn.more_lines import SAME_NEURON_COS, needs_another_line
from attnprobe.learners.ffn.regions import hyperplane_normals
from attnprobe.learners.ffn.repair import contradicted, predicted_kinks, repaired_set, sub_segment, suspect_spans
from attnprobe.learners.core.skeleton import Run
from attnprobe.models.ffn import ReLUNet
from attnprobe.oracles import Oracle
from attnprobe.targets import random_relu_net


def _first_line(d: int, m: int, seed: int, missing: int, merged: tuple[int, int], weak: float | None = None):
    """A float32 bias-free net learned in the lifted space, and a first line's jumps as the search leaves them when
    it missed neuron ``missing`` and took the pair ``merged`` for one kink (their jumps summed); every other jump
    ~1e-4 rad off, as float32 finite differences measure them. ``weak``: the missed neuron's output weight."""
    net = random_relu_net(d, m, seed=seed)
    if weak is not None:
        net = ReLUNet(net.A, np.where(np.arange(m) == missing, weak, net.w_o))
    o = Oracle(net.with_dtype("float32"), d, precision="float32")
    run = Run(o, "ffn", seed=seed, check=False)
    ask = Answers(o, lifted=True, rng=run.rng)
    n_fit = 4 * (d + 1) * m
    Z = np.concatenate([run.rng.standard_normal((n_fit, d)), np.ones((n_fit, 1))], axis=1)
    fit_data = (Z, ask.vectors(Z))
    segs = segments(d, True, run.rng, 1e6)
    dirs = np.vstack([net.A, np.zeros((1, m))])
    # a jump as the line measures it: the gradient after the kink minus before, along the segment
    jumps = [np.sign(dirs[:, k] @ segs[0].direction)
             * np.outer(net.w_o[k], dirs[:, k] + 1e-4 * np.linalg.norm(dirs[:, k]) * run.rng.standard_normal(d + 1))
             for k in range(m)]
    a, b = merged
    J = np.array([jumps[k] for k in range(m) if k not in (missing, a, b)] + [jumps[a] + jumps[b]])
    first = (J, np.zeros(J.shape[0], dtype=int), segs)
    v = (net.A @ net.w_o)[None, :]
    return net, o, run, ask, first, fit_data, v


def _matches(J: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """For each true neuron (columns of ``truth``, unit), whether some jump of J is its hyperplane."""
    if J.shape[0] == 0:
        return np.zeros(truth.shape[1], dtype=bool)
    return np.max(np.abs(hyperplane_normals(J).T @ truth), axis=0) > SAME_NEURON_COS


def test_the_repair_line_finds_a_missed_neuron_and_splits_a_merged_pair():
    """Over ten nets (d = 8, m = 12): the missed neuron is found every time, for about half a whole line's
    queries (a fresh line searched on the same net); the proposed set (the merged jump left out, both halves found,
    one jump per neuron) explains every answer once polished in most (7 of 10 measured, the same under five
    OpenBLAS kernels; in the others a half of the pair or the merged jump's ghost kink hid next to another kink,
    and the learner falls back to whole lines)."""
    d, m = 8, 12
    missing, merged = 0, (1, 2)
    explained, ratios = 0, []
    for seed in range(10):
        net, o, run, ask, first, fit_data, v = _first_line(d, m, seed, missing, merged)
        truth = np.vstack([net.A, np.zeros((1, m))])
        truth /= np.linalg.norm(truth, axis=0)
        start = o.queries
        repair = repair_line(run, ask, Lines(*first), FFNOptions(), np.full(first[0].shape[0], 1e-3))
        J2, where2, subs, keep, stats = repair.J, repair.where, repair.segs, repair.proposal, repair.stats
        spent = o.queries - start
        assert _matches(J2, truth)[missing], stats
        J = np.concatenate([first[0], J2])
        where = np.r_[first[1], where2 + len(first[2])]
        got = score_set(ask, Lines(J, where, first[2] + subs), keep, v, FFNOptions(), fit_data)
        assert got.miss == consistency(got.net.neurons, ask)
        if not needs_another_line(got.exact, got.miss, o.eps):
            explained += 1
            # only the right set explains every answer: each neuron once, the merged jump left out
            assert _matches(J[keep], truth).all() and keep.sum() == m and not keep[first[0].shape[0] - 1]
        # well under a whole line: a fresh line's kink search and gradients on the same net (asked last, so its
        # answers are not among those the proposal had to explain)
        before = o.queries
        search_and_measure(run, ask, segments(d, True, np.random.default_rng(seed), 1e6), FFNOptions(), True)
        ratios.append(spent / (o.queries - before))
        assert ratios[-1] < 0.75, (spent, o.queries - before, stats)
    assert explained >= 5, f"the repair explained {explained} of 10"
    assert np.mean(ratios) < 0.6, ratios  # 0.41–0.62 of a whole line measured, 0.53 on average


def test_right_neurons_leave_nothing_to_search():
    """The same first line without a defect: every interval straight, every slope change as predicted, nothing
    searched beyond the 3 answers per interval."""
    net, o, run, ask, first, fit_data, v = _first_line(8, 12, 0, missing=-1, merged=(-2, -3))
    J = first[0][:-1]  # the "merged" jump of two absent indices is empty
    before = o.queries
    repair = repair_line(run, ask, Lines(J, first[1][:-1], first[2]), FFNOptions(), np.full(J.shape[0], 1e-3))
    stats = repair.stats
    assert repair.J.shape[0] == 0 and repair.segs == [] and repair.proposal.all()
    assert o.queries - before == 3 * stats["intervals_tested"] <= 3 * (J.shape[0] + 2)


def test_predicted_kinks_are_where_the_hyperplanes_cross():
    rng = np.random.default_rng(0)
    N = rng.standard_normal((5, 4))
    N /= np.linalg.norm(N, axis=0)
    C = rng.standard_normal((4, 1))
    seg = Segment(0.1 * rng.standard_normal(5), rng.standard_normal(5))
    t, band, change, allow, k = predicted_kinks(N, C, np.full(4, 1e-3), np.ones(1), seg)
    assert np.all(np.abs(t) < 1) and np.all(np.diff(t) >= 0) and np.all(band > 0) and np.all(allow > 0)
    np.testing.assert_allclose(np.einsum("ik,ki->k", N[:, k], seg.at(t)), 0, atol=1e-12)
    # the slope change is the crossed neuron's, whichever way it is oriented: ReLU(nz) and −ReLU(−nz) jump alike
    f = lambda x, s: C[k, 0] * np.maximum(s * (x @ N[:, k]), 0) + (s < 0) * C[k, 0] * (x @ N[:, k])  # noqa: E731
    h = 1e-6
    for s in (1, -1):
        slopes = [(f(seg.at(t + h), s) - f(seg.at(t), s)) / h, (f(seg.at(t), s) - f(seg.at(t - h), s)) / h]
        np.testing.assert_allclose(np.diag(slopes[0] - slopes[1]), change, rtol=1e-4, atol=1e-8)


def test_a_sub_segment_spans_its_part_and_contradicted_needs_a_search():
    seg = Segment(np.array([1.0, 0.0, 0.0]), np.array([0.0, 2.0, 0.0]))
    sub = sub_segment(seg, -0.5, 0.25)
    np.testing.assert_allclose(sub.at(-1.0), seg.at(-0.5))
    np.testing.assert_allclose(sub.at(1.0), seg.at(0.25))
    N = np.array([[0.0, 1.0, 0.0], [-0.2, 1.0, 0.0]]).T  # kinks at t = 0 and t = 0.1
    N /= np.linalg.norm(N, axis=0)
    assert not contradicted(N, [seg], [], np.zeros((3, 0)), SAME_NEURON_COS).any()  # nothing searched
    got = contradicted(N, [seg], [(0, -0.5, 0.05)], N[:, :1], SAME_NEURON_COS)  # the search re-found the first
    assert got.tolist() == [False, False]
    got = contradicted(N, [seg], [(0, -0.5, 0.5)], N[:, :1], SAME_NEURON_COS)
    assert got.tolist() == [False, True]


def test_suspect_spans_flag_the_interval_of_a_missed_kink():
    """Answers ``ReLU(t) + 0.01·ReLU(t − 0.5)`` along a segment, the first line knowing only the kink at 0: the
    interval (0, 1) is not straight, (−1, 0) is, and the kink between them is left to the span's gradient."""

    class Line:
        mix = np.ones(1)
        top = 1.0

        def __call__(self, Z):
            t = Z[:, 1]
            return np.maximum(t, 0) + 0.01 * np.maximum(t - 0.5, 0)

    seg = Segment(np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    N, C = np.array([[0.0], [1.0]]), np.ones((1, 1))
    spans, checks, stats = suspect_spans(Line(), [seg], N, C, np.full(1, 1e-4), tol_f=1e-9)
    assert stats["intervals_tested"] == 2 and stats["not_straight"] == 1
    assert len(spans) == 1 and spans[0][0] == 0 and 0 < spans[0][1] < 0.5 < spans[0][2] <= 1
    assert len(checks) == 1 and checks[0].side == -1 and checks[0].at == spans[0][1] and checks[0].change == 1.0


def test_the_proposal_keeps_one_jump_per_hyperplane_the_better_measured():
    rng = np.random.default_rng(1)
    N1 = rng.standard_normal((6, 3))
    N1 /= np.linalg.norm(N1, axis=0)
    twin = N1[:, 1] + 1e-5 * rng.standard_normal(6)  # the repair line measured neuron 1 again
    new = rng.standard_normal(6)  # and found one the first line missed
    N2 = np.stack([twin / np.linalg.norm(twin), new / np.linalg.norm(new)], axis=1)
    drop = np.array([False, False, True])  # neuron 2 contradicted
    keep = repaired_set(N1, np.array([1e-3, 1e-2, 1e-3]), drop, N2, np.array([1e-3, 1e-3]), SAME_NEURON_COS)
    assert keep.tolist() == [True, False, False, True, True]  # neuron 1's better measurement is the repair's
    keep = repaired_set(N1, np.array([1e-3, 1e-4, 1e-3]), drop, N2, np.array([1e-3, 1e-3]), SAME_NEURON_COS)
    assert keep.tolist() == [True, True, False, False, True]


@pytest.mark.slow
def test_a_budget_that_stops_the_lines_after_the_repair_keeps_the_repaired_set():
    """A float32 16-32 net (seed 3) whose repair line does not explain every answer: whole lines follow. With a
    budget that ends the first of them (the queries of every phase before it, the check's and 60 more), the
    learner keeps the better of the sets it has, the repaired one: the result holds the neurons its summary says it
    kept, and explains the answers better than the first line's set (measured: 34 neurons, self-consistency
    7.1e-3; the first line's set: 31 neurons, 2.1e-2)."""
    d, m, seed = 16, 32, 3
    net = random_relu_net(d, m, seed=seed, dtype="float32")
    free = extract_ffn(Oracle(net, d, precision="float32"), seed=seed, bias=False)
    phases = free.queries_by_phase
    assert phases.get("repair_line") and phases.get("more_lines"), phases  # the case reaches the lines
    budget = sum(n for p, n in phases.items() if p != "more_lines") + free.check.queries + 60
    res = extract_ffn(Oracle(net, d, precision="float32", budget=budget), seed=seed, bias=False)
    summary = res.details["more_lines"]
    assert summary["stopped"] == "budget" and summary["lines"] == 1, summary
    assert summary["kept"].endswith("neurons from the first line and the repair line")
    assert res.details["neurons_found"] == int(summary["kept"].split()[0]) > summary["neurons_per_line"][0]
    assert not res.check.passed  # a neuron is still missing or wrong: the check says so
