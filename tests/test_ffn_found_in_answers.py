"""Float32 answers: a neuron the search line missed, found in the answers the polish already holds (no query).
The answers are projected off what the found neurons can give with their activation patterns fixed, and one hinge
fitted to what is left."""

import numpy as np
import pytest
from attnprobe.learners.ffn.fit import Neurons
from attnprobe.learners.ffn.mending import Lines, found_in_answers, jump_columns, score_set
from attnprobe.learners.ffn.options import FFNOptions
from attnprobe.learners.ffn.settle import consistency
from attnprobe.learners.ffn.missing import found_span, missing_neuron_candidates, tidy
from attnprobe.learners.ffn.more_lines import needs_another_line
from test_ffn_float32_repair import _first_line, _matches


def sweep(seeds, least: int):
    """The claim over many seeds (its rate), kept out of the default run: ``pytest -m slow``."""
    return pytest.param(seeds, least, marks=pytest.mark.slow, id=f"seeds-{seeds[0]}-{seeds[-1]}")


def twin(seeds, least: int):
    """The same test on a seed or two of the sweep (each measured to hold), in the default run: it fails when the
    step is broken."""
    return pytest.param(seeds, least, id="seeds-" + "-".join(map(str, seeds)))


def _truth(net, m: int) -> np.ndarray:
    """The true neurons' unit directions in the lifted space (bias-free: last entry 0)."""
    T = np.vstack([net.A, np.zeros((1, m))])
    return T / np.linalg.norm(T, axis=0)


def _every_neuron(net, neurons, m: int) -> bool:
    """m neurons, each a true one to 1e-6 in cosine (and so every true one matched)."""
    unit = neurons.dirs / np.linalg.norm(neurons.dirs, axis=0)
    return neurons.dirs.shape[1] == m and bool(np.all(np.max(np.abs(unit.T @ _truth(net, m)), axis=0) > 1 - 1e-6))


def _missed_weak(seed: int, d: int = 8, m: int = 12, missing: int = 0):
    """A first line that missed neuron ``missing`` (output weight 0.02), and its set as oriented and polished."""
    net, o, run, ask, first, fit_data, v = _first_line(d, m, seed, missing, merged=(-2, -3), weak=0.02)
    J, where, segs = first[0][:-1], first[1][:-1], first[2]  # no merged pair (the indices do not exist)
    got = score_set(ask, Lines(J, where, segs), np.ones(J.shape[0], bool), v, FFNOptions(), fit_data)
    return net, o, run, ask, got.net, fit_data, v, (got.miss, got.exact)


def _v_off(v: np.ndarray, seed: int) -> np.ndarray:
    """The linear part v measured ~2.5e-2 off (relative), as the first line's end regions gave it on a float32 run
    whose missed kink lay in one of them."""
    return v + 0.025 * np.linalg.norm(v) * np.random.default_rng(seed).standard_normal(v.shape) / np.sqrt(v.size)


@pytest.mark.parametrize("seeds, least", [sweep(range(6), 5), twin((1,), 1)])
def test_a_missed_weak_neuron_is_found_without_a_query(seeds, least):
    """Six nets (d = 8, m = 12) whose first line missed a weak neuron (output weight 0.02, as the float32 misses
    are: 0.003–0.04 measured): the polished set of the others misses answers; the neuron fitted to the polish
    answers completes it to every neuron, explaining every answer, and no query is asked (10 of seeds 0-9
    measured)."""
    d, m, missing = 8, 12, 0
    found = 0
    for seed in seeds:
        net, o, run, ask, fitted, fit_data, v, (miss, exact) = _missed_weak(seed, d, m, missing)
        assert needs_another_line(exact, miss, o.eps)  # the polish cannot make up for the missing neuron
        before = o.queries
        got = found_in_answers(run, ask, fitted.neurons, v, FFNOptions(), fit_data)
        assert o.queries == before
        if got is None:
            continue
        neurons, orient, J_added = got.net.neurons, got.net.orientation, got.jumps
        assert J_added.shape == (1, 1, d + 1) and _matches(J_added, _truth(net, m))[missing]
        assert _every_neuron(net, neurons, m)
        assert orient.exact and not needs_another_line(True, consistency(neurons, ask), o.eps)
        found += 1
    assert found >= least, f"found in {found} of {len(seeds)}"


@pytest.mark.parametrize("seeds, least", [sweep(range(6), 2), twin((1, 3), 1)])
def test_a_merged_pair_is_split_or_left_to_the_repair_line(seeds, least):
    """Six first lines that missed a neuron and took a pair for one kink: the merged neuron, polished, moves onto one
    of the pair and the other is found in the answers (5–6 of seeds 0-9 measured, 3 of these 6, with every neuron
    right); where the added neurons do not explain every answer, nothing is kept (the learner goes on to the repair
    line), never a set that misses answers."""
    d, m = 8, 12
    kept = 0
    for seed in seeds:
        net, o, run, ask, first, fit_data, v = _first_line(d, m, seed, missing=0, merged=(1, 2))
        fitted = score_set(ask, Lines(*first), np.ones(first[0].shape[0], bool), v, FFNOptions(), fit_data).net
        got = found_in_answers(run, ask, jump_columns(fitted.neurons, first[0].shape[0]), v, FFNOptions(), fit_data)
        if got is None:
            continue
        neurons, orient = got.net.neurons, got.net.orientation
        assert orient.exact and not needs_another_line(True, consistency(neurons, ask), o.eps)
        assert _every_neuron(net, neurons, m)
        kept += 1
    assert kept >= least, f"split in {kept} of {len(seeds)}"


def test_the_projection_keeps_the_found_neurons_compensation_out():
    """Float64 answers of 12 neurons; the 11 found ones each turned 3e-3 rad (as a polish bends them to make up
    for a missing one). The projected one-hinge fit still finds the missing neuron first, and the share of the
    answers it leaves is small."""
    rng = np.random.default_rng(0)
    D, m, n = 9, 12, 4 * 9 * 12
    A = rng.standard_normal((D, m))
    A[-1] = 0
    A /= np.linalg.norm(A, axis=0)
    w = rng.standard_normal(m)
    w[0] = 0.02
    Z = np.concatenate([rng.standard_normal((n, D - 1)), np.ones((n, 1))], axis=1)
    Y = (np.maximum(Z @ A, 0) @ w)[:, None]
    bent = A[:, 1:] + 3e-3 * rng.standard_normal((D, m - 1))
    picked, share = missing_neuron_candidates(bent, Z, Y, True, np.random.default_rng(1))
    assert abs(picked[0][0] @ A[:, 0]) > 1 - 1e-3 and share < 0.2
    assert all(abs(p[0] @ q[0]) < 0.999 for i, p in enumerate(picked) for q in picked[:i])
    Q = found_span(bent, Z, True)
    np.testing.assert_allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-10)
    assert Q.shape[1] == D * (m - 1) + 1


def test_nothing_is_kept_when_no_hinge_explains_the_rest():
    """Neurons of another network: no neuron added to them explains the answers, so none is kept (the learner
    goes on to the repair line)."""
    net, o, run, ask, first, fit_data, v = _first_line(8, 12, 0, missing=-1, merged=(-2, -3))
    wrong = Neurons(np.random.default_rng(5).standard_normal((9, 6)), np.ones((6, 1)), np.zeros(1))
    assert found_in_answers(run, ask, wrong, v, FFNOptions(), fit_data) is None


def test_tidy_joins_neurons_on_one_hyperplane_and_drops_faint_ones():
    """Two columns on one hyperplane facing the same way compute one neuron (their ``dir·wᵀ`` summed); a column
    1e-6 the size of the largest is rounding. Both go, the answers stay (to the faint neuron's share), and the count
    of added neurons drops with them."""
    rng = np.random.default_rng(2)
    D, m = 5, 4
    dirs = rng.standard_normal((D, m))
    W = rng.standard_normal((m, 2))
    dup = 2.5 * dirs[:, 1]  # neuron 1's hyperplane, another scale
    faint = rng.standard_normal(D)
    n = Neurons(np.c_[dirs, dup, faint], np.r_[W, [[0.3, -0.2]], 1e-6 * np.linalg.norm(W) * np.ones((1, 2))],
                np.zeros(2))
    got, added = tidy(n, 2)
    assert got.dirs.shape[1] == m and added == 0
    Z = rng.standard_normal((50, D))
    np.testing.assert_allclose(got.values(Z), n.values(Z), atol=1e-5 * np.abs(n.values(Z)).max())
    np.testing.assert_allclose(got.weights[1], W[1] + 2.5 * np.array([0.3, -0.2]), rtol=1e-12)
    opposite = Neurons(np.c_[dirs, -dirs[:, 1]], np.r_[W, [[0.3, -0.2]]], np.zeros(2))  # ReLU(−z) is another neuron
    assert tidy(opposite, 1)[0].dirs.shape[1] == m + 1


@pytest.mark.parametrize("seeds, least", [sweep(range(5), 4), twin((1,), 1)])
def test_a_linear_part_measured_off_does_not_refuse_a_set_that_explains_every_answer(seeds, least):
    """The linear part v comes from the first line's two end regions; a kink the line missed in one puts it off
    (2.5e-2 measured on a float32 run). The set completed in the answers is then kept as polished (its orientation
    says so), since a neuron turned the wrong way would miss answers by a linear term."""
    d, m, missing = 8, 12, 0
    kept = 0
    for seed in seeds:
        net, o, run, ask, fitted, fit_data, v, _ = _missed_weak(seed, d, m, missing)
        off = _v_off(v, seed)
        got = found_in_answers(run, ask, fitted.neurons, off, FFNOptions(), fit_data)
        if got is None:
            continue
        neurons, orient, rest = got.net.neurons, got.net.orientation, got.net.rest
        assert _every_neuron(net, neurons, m)
        assert orient.how.startswith("as polished") and np.linalg.norm(rest) > 0.01 * np.linalg.norm(v)
        kept += 1
    assert kept >= least, f"kept {kept} of {len(seeds)}"


@pytest.mark.parametrize("seeds, least", [sweep(range(5), 3), twin((1,), 1)])
def test_a_complete_first_line_refused_only_by_its_linear_part_is_kept(seeds, least):
    """A first line that found every neuron, with v off as above: no ±1 orientation fits v, so its set carries
    linear-rest pairs and misses answers. Without them, polished again, it explains every answer and is kept with
    no neuron added."""
    d, m = 8, 12
    kept = 0
    for seed in seeds:
        net, o, run, ask, first, fit_data, v = _first_line(d, m, seed, missing=-1, merged=(-2, -3))
        J, where, segs = first[0][:-1], first[1][:-1], first[2]
        off = _v_off(v, seed)
        scored = score_set(ask, Lines(J, where, segs), np.ones(J.shape[0], bool), off, FFNOptions(), fit_data)
        if scored.explains(o.eps):
            continue  # v's error happened to leave a ±1 orientation: nothing to repair
        got = found_in_answers(run, ask, jump_columns(scored.net.neurons, m), off, FFNOptions(), fit_data)
        assert got is not None and got.jumps.shape[0] == 0 and _every_neuron(net, got.net.neurons, m)
        kept += 1
    assert kept >= least, f"refused and kept in {kept} of {len(seeds)}"
