"""The polish's balanced gauge (:func:`attnprobe.models.positional_gauge.balanced`): the same function, each
rotation pair's query and key rows of equal norm."""

from dataclasses import replace

import numpy as np
import pytest

from attnprobe.models.positional import rotation_pairs
from attnprobe.models.positional_gauge import balanced
from attnprobe.targets import random_rope_attention


def test_balanced_gauge_keeps_the_function_and_equalises_each_pair():
    """The polish's start in a balanced gauge: a scalar per rotation pair (queries ÷ c, keys × c) and per group
    (values × c, outputs ÷ c) changes nothing, and each pair's query and key rows come out of equal norm."""
    truth = random_rope_attention(16, 4, 2, seed=3)
    rng = np.random.default_rng(0)
    a, b = rotation_pairs(truth.rotary_dim, truth.layout)
    scales = np.exp(rng.normal(0, 1.5, (truth.G, len(a))))  # a start with pairs 0.05 … 20 out of balance
    Wq, Wk = np.array(truth.Wq), np.array(truth.Wk)
    for g in range(truth.G):
        for k, (i, j) in enumerate(zip(a, b)):
            Wk[g, [i, j]] *= scales[g, k]
            Wq[2 * g:2 * g + 2, [i, j]] /= scales[g, k]
    start = replace(truth, Wq=Wq, Wk=Wk, Wv=truth.Wv * 7.0, Wo=truth.Wo / 7.0)
    fixed = balanced(start)
    X = rng.standard_normal((3, 40, 16))
    assert np.abs(fixed(X) - truth(X)).max() < 1e-10 * np.abs(truth(X)).max()
    for g in range(truth.G):
        for i, j in zip(a, b):
            q = np.linalg.norm(fixed.Wq[2 * g:2 * g + 2][:, [i, j]]) / np.sqrt(2)
            assert q == pytest.approx(np.linalg.norm(fixed.Wk[g, [i, j]]), rel=1e-12)
        assert np.linalg.norm(fixed.Wv[g]) == pytest.approx(np.linalg.norm(fixed.Wo[:, 8 * g:8 * g + 8]) / np.sqrt(2))


def test_length_weights_make_each_length_count_relative_to_its_own_spread():
    """The polish's relative weights: a length whose answers spread 10× less weighs 10× more, and the weighted
    answers spread as much as the unweighted ones (the misfit stays relative to the whole spread)."""
    from attnprobe.learners.positional.polish import length_weights

    rng = np.random.default_rng(0)
    data = [(None, rng.standard_normal((20, 4))), (None, 0.1 * rng.standard_normal((20, 4)) + 3.0)]
    spread = np.sqrt(sum(((Y - Y.mean(0)) ** 2).sum() for _, Y in data))
    w = length_weights(data, spread)
    rms = [np.sqrt(((Y - Y.mean(0)) ** 2).mean()) for _, Y in data]
    assert w[1] / w[0] == pytest.approx(rms[0] / rms[1], rel=1e-12) and 5 < w[1] / w[0] < 20
    assert np.sqrt(sum(wi**2 * ((Y - Y.mean(0)) ** 2).sum() for wi, (_, Y) in zip(w, data))) == pytest.approx(spread)
