"""Float32 answers: neuron orientations are settled on the polished neurons, and the weakest neurons are tried
the other way round when the polished network misses answers. A float32 run then needs one search line far more
often, so its bill is the one-line estimate's."""

import numpy as np
import pytest

from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.ffn.answers import Answers
from attnprobe.learners.ffn.fit import Neurons
from attnprobe.learners.ffn.options import FFNOptions
from attnprobe.learners.ffn.settle import consistency, flip_weak, settle
from attnprobe.learners.ffn.more_lines import needs_another_line
from attnprobe.models import neuron_errors
from attnprobe.oracles import Oracle
from attnprobe.targets import random_relu_net


def _lifted_truth(d: int, m: int, seed: int):
    """A float32 bias-free net, the Answers of its oracle with polish-like data asked, and its true neurons in the
    lifted space (v = the sum of the far-end gradients: A w_o)."""
    net = random_relu_net(d, m, seed=seed)
    o = Oracle(net.with_dtype("float32"), d, precision="float32")
    ask = Answers(o, lifted=True, rng=np.random.default_rng(seed))
    Z = np.concatenate([np.random.default_rng(seed + 1).standard_normal((4 * (d + 1) * m, d)),
                        np.ones((4 * (d + 1) * m, 1))], axis=1)
    Y = ask.vectors(Z)
    truth = Neurons(np.vstack([net.A, np.zeros((1, m))]), net.w_o[:, None].copy(), np.zeros(1))
    return net, ask, (Z, Y), truth, (net.A @ net.w_o)[None, :]


def _flipped(neurons: Neurons, ks) -> Neurons:
    dirs = neurons.dirs.copy()
    dirs[:, list(ks)] *= -1
    return Neurons(dirs, neurons.weights, neurons.c)


def _right(neurons: Neurons, truth: Neurons) -> bool:
    cos = np.einsum("ik,ik->k", neurons.dirs, truth.dirs) / (
        np.linalg.norm(neurons.dirs, axis=0) * np.linalg.norm(truth.dirs, axis=0))
    return bool(np.all(cos > 1 - 1e-6))


@pytest.mark.parametrize("seed", range(3))
def test_a_weak_neuron_the_wrong_way_round_is_flipped_back(seed):
    """The weakest neuron's linear part is within v's rounding: only the answers it misses show it is flipped."""
    net, ask, fit_data, truth, _ = _lifted_truth(8, 16, seed)
    weakest = int(np.argmin(np.abs(net.w_o) * np.linalg.norm(net.A, axis=0)))
    wrong = _flipped(truth, [weakest])
    assert needs_another_line(True, consistency(wrong, ask), ask.oracle.eps)
    fixed = flip_weak(wrong, ask, fit_data)
    assert _right(fixed, truth)
    assert not needs_another_line(True, consistency(fixed, ask), ask.oracle.eps)


@pytest.mark.parametrize("seed", range(3))
def test_strong_neurons_the_wrong_way_round_are_settled_by_v(seed):
    """A provisional orientation with two strong neurons flipped: solved again on the (polished) columns, flipped
    back and polished; the orientation is exact and the network explains every answer."""
    net, ask, fit_data, truth, v = _lifted_truth(8, 16, seed)
    strong = np.argsort(-np.abs(net.w_o) * np.linalg.norm(net.A, axis=0))[:2]
    got = settle(_flipped(truth, strong), v, FFNOptions(), ask, fit_data)
    neurons = got.neurons
    assert got.orientation.exact and got.notes == () and _right(neurons, truth)
    assert not needs_another_line(True, consistency(neurons, ask), ask.oracle.eps)


@pytest.mark.slow  # ~25 s (a run that needs three lines tries many neuron sets); benchmarks/ffn_float32_lines.py
def test_float32_nets_with_four_neurons_per_input_are_learned_on_one_line_mostly():
    """Bias-free nets d = 8, m = 32 on float32 answers (the estimate's benchmark target): every run passes its check
    with every neuron within 1e-3 (before orientations were settled on the polished neurons: 8 of 10 passed, 6 of
    10 with every neuron), and at least half need one search line only (the one-line bill is the estimate)."""
    one_line = 0
    for seed in range(4):
        net = random_relu_net(8, 32, seed=1000 * 8 + 32 + seed)
        o = Oracle(net.with_dtype("float32"), 8, precision="float32")
        res = extract_ffn(o, seed=seed)
        err = neuron_errors(net.A, net.w_o, res.model.A, res.model.w_o)
        assert res.check.passed and err["within_1e-3"] == 32 and err["matched_one_to_one"], (seed, res.check)
        one_line += "more_lines" not in res.details
    assert one_line >= 2, one_line
