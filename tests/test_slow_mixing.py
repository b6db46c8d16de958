"""The slow rotation pairs' split refitted as a mixing of their coordinates (learners/positional/slow_mixing.py):
from the right sum and a wrong split, Gauss–Newton over the mixings finds the layer again; the gauge is left out."""

from dataclasses import replace

import numpy as np
import pytest

from attnprobe.learners.positional import polish
from attnprobe.learners.positional.slow_mixing import MixingTangents, fit_slow_mixing, mixed, slow_coordinates
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.targets import random_rope_attention


def _mixed_slow_pairs(truth, rng, size):
    """The truth with the slow pairs' coordinates (2 and 3 of θ = 1, 0.1, 0.01, 0.001) of every head's queries and
    every group's keys mixed by ``I + size·N(0, 1)``."""
    S = slow_coordinates(truth, [2, 3])
    Wq, Wk = truth.Wq.copy(), truth.Wk.copy()
    for h in range(truth.H):
        Wq[h, S] = (np.eye(4) + size * rng.standard_normal((4, 4))) @ Wq[h, S]
    for g in range(truth.G):
        Wk[g, S] = (np.eye(4) + size * rng.standard_normal((4, 4))) @ Wk[g, S]
    return replace(truth, Wq=Wq, Wk=Wk)


@pytest.mark.parametrize("seed,streamed", [(0, False), (3, False), (0, True)])
def test_a_wrong_split_of_the_slow_pairs_is_refitted_to_the_layer(seed, streamed, monkeypatch):
    """d = 16, 2 heads sharing one group, exact rows of 32 tokens (the two slowest pairs turn 0.32 and 0.032 rad):
    their coordinates mixed by 10 %, the function is several percent off; the mixing fit brings it within 1e-8 over
    every length to 32 (Gauss–Newton converges quadratically: measured 1e-15), from the formed Jacobian or from
    streamed products (the route's way at d = 128)."""
    if streamed:
        monkeypatch.setattr(polish, "DENSE_LIMIT", 0)
    truth = random_rope_attention(16, 2, 1, head_dim=8, seed=seed)
    X = np.random.default_rng(seed).standard_normal((2, 32, 16))
    start = _mixed_slow_pairs(truth, np.random.default_rng(seed + 1), 0.1)

    def error(model):
        return function_error_over_lengths(model, truth, np.random.default_rng(2), tuple(range(1, 33)), per_length=1)
    assert error(start) > 1e-2
    model, info = fit_slow_mixing(start, [(X, truth.every_position(X))], [2, 3], rounds=6)
    assert info["misfit_after"] < 1e-9 < info["misfit_before"]
    assert error(model) < 1e-8


def test_a_mixing_step_is_the_exponential_of_its_blocks():
    """``mixed`` with a zero step is the model; with a skew block on a pair's two coordinates of one head it rotates
    them exactly (norms kept), every other row unchanged."""
    model = random_rope_attention(16, 2, 1, head_dim=8, seed=1)
    S = slow_coordinates(model, [3])  # coordinates 3 and 7
    n = len(S)
    flat = mixed(model, S, np.zeros(3 * n * n))
    assert np.array_equal(flat, np.concatenate([model.Wq.ravel(), model.Wk.ravel()]))
    step = np.zeros((3, n, n))
    step[1] = [[0, -0.7], [0.7, 0]]
    Wq = mixed(model, S, step.ravel())[:model.Wq.size].reshape(model.Wq.shape)
    c, s = np.cos(0.7), np.sin(0.7)
    assert np.allclose(Wq[1, S], np.array([[c, -s], [s, c]]) @ model.Wq[1, S], atol=1e-12)
    others = [i for i in range(8) if i not in S]
    assert np.array_equal(Wq[1, others], model.Wq[1, others]) and np.array_equal(Wq[0], model.Wq[0])


@pytest.mark.parametrize("biases", [False, True])
def test_the_tangents_are_the_mixings_derivatives_and_their_products_match(biases):
    """Tangent k is the derivative of ``mixed`` along the step's unit k (central differences), and ``dot`` is every
    tangent's inner product with a vector — without the dense stack; with ``biases`` the same over W_Q, W_K, b_Q,
    b_K (a layer with q/k biases)."""
    model = random_rope_attention(16, 4, 2, head_dim=8, seed=2)
    model = _biased(model, np.random.default_rng(3)) if biases else model
    S = slow_coordinates(model, [2, 3])
    T = MixingTangents(model, S, biases=biases)
    n = len(S)
    assert len(T) == (4 + 2) * n * n
    assert T.size == model.Wq.size + model.Wk.size + (model.bq.size + model.bk.size if biases else 0)
    v = np.random.default_rng(0).standard_normal(T.size)
    dense = []
    for k in range(len(T)):
        e = np.zeros(len(T))
        e[k] = 1e-6
        derivative = (mixed(model, S, e, biases=biases) - mixed(model, S, -e, biases=biases)) / 2e-6
        assert np.abs(derivative - T.vector(k)).max() < 1e-8 * np.abs(model.Wq).max()
        dense.append(T.vector(k))
    assert np.allclose(T.dot(v), np.array(dense) @ v, rtol=1e-12, atol=1e-12)


def test_the_pairs_mixed_are_the_slowest_that_fit_the_unknowns_allowed():
    """8/2 heads at d_h = 16 (θ = 1e4^(−k/8)) over 256 tokens: pairs 6 and 7 are slow (angles 0.26, 0.08); at
    LLaMA-3's head (d_h = 128, base 5e5, 32/8) 33 pairs are slow but only the slowest that keep (H + G)·(2n)² within
    the limit are mixed."""
    from attnprobe.learners.positional.slow_mixing import MAX_UNKNOWNS, mixing_pairs

    assert mixing_pairs(random_rope_attention(128, 8, 2, seed=0), 256) == [6, 7]
    wide = random_rope_attention(8, 32, 8, head_dim=128, base=5e5, seed=0)  # the head shape; d apart
    pairs = mixing_pairs(wide, 256)
    assert pairs and (32 + 8) * (2 * len(pairs)) ** 2 <= MAX_UNKNOWNS and max(pairs) == 63


def _biased(truth, rng):
    """``truth`` with query and key biases N(0, 0.5²) (Qwen2's random init draws them so)."""
    return replace(truth, bq=0.5 * rng.standard_normal(truth.bq.shape), bk=0.5 * rng.standard_normal(truth.bk.shape))


def _mixed_with_biases(truth, rng, size):
    """:func:`_mixed_slow_pairs` with each head's (group's) query (key) bias mixed by the same matrix as its rows:
    the query ``W_Q,h x + b_Q,h`` mixed as a whole."""
    S = slow_coordinates(truth, [2, 3])
    arrays = {n: np.array(getattr(truth, n)) for n in ("Wq", "Wk", "bq", "bk")}
    for W, b in (("Wq", "bq"), ("Wk", "bk")):
        for h in range(len(arrays[W])):
            P = np.eye(4) + size * rng.standard_normal((4, 4))
            arrays[W][h, S] = P @ arrays[W][h, S]
            arrays[b][h, S] = P @ arrays[b][h, S]
    return replace(truth, **arrays)


@pytest.mark.parametrize("seed", [0, 3])
def test_a_wrong_split_with_biases_is_refitted_when_the_biases_move_with_their_rows(seed):
    """A layer with q/k biases (d = 16, 2 heads sharing one group, exact rows of 32 tokens), each head's query and
    each group's key mixed whole in the slow pairs' coordinates (rows and bias by one matrix, 10 %): the mixing fit
    moving the biases with their rows (``biases=True``) finds the layer again to 1e-8 over every length to 32; with
    the biases held (the mixing of the rows alone) it cannot: the function stays > 1e-4 off."""
    truth = _biased(random_rope_attention(16, 2, 1, head_dim=8, seed=seed), np.random.default_rng(seed + 7))
    X = np.random.default_rng(seed).standard_normal((2, 32, 16))
    start = _mixed_with_biases(truth, np.random.default_rng(seed + 1), 0.1)
    data = [(X, truth.every_position(X))]

    def error(model):
        return function_error_over_lengths(model, truth, np.random.default_rng(2), tuple(range(1, 33)), per_length=1)
    assert error(start) > 1e-2
    model, info = fit_slow_mixing(start, data, [2, 3], rounds=5, biases=True)
    assert info["misfit_after"] < 1e-9 < info["misfit_before"]
    assert error(model) < 1e-8
    held, _ = fit_slow_mixing(start, data, [2, 3], rounds=3)
    assert error(held) > 1e-4


def test_a_mixing_step_with_biases_moves_each_bias_with_its_rows():
    """``mixed(..., biases=True)``: the flat vector is W_Q, W_K, b_Q, b_K; a block of one group rotates that group's
    key rows and key bias by the same exponential, the query bias untouched."""
    model = _biased(random_rope_attention(16, 2, 1, head_dim=8, seed=1), np.random.default_rng(5))
    S = slow_coordinates(model, [3])
    n = len(S)
    step = np.zeros((3, n, n))
    step[2] = [[0.1, -0.4], [0.4, 0.2]]  # the group's block
    flat = mixed(model, S, step.ravel(), biases=True)
    sizes = np.cumsum([model.Wq.size, model.Wk.size, model.bq.size])
    Wk, bq, bk = (flat[a:b].reshape(x.shape) for a, b, x in zip(sizes, [*sizes[1:], None], (model.Wk, model.bq,
                                                                                           model.bk)))
    from scipy.linalg import expm
    E = expm(step[2])
    assert np.allclose(Wk[0, S], E @ model.Wk[0, S], atol=1e-12) and np.allclose(bk[0, S], E @ model.bk[0, S])
    assert np.array_equal(bq, model.bq)
