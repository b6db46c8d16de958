"""The smooth FFN learner's drive start: bends of the answers on circles far from the origin (where a plain GELU or
SiLU FFN is nearly piecewise linear) give the factors ``w2_i ⊗ U w1_i`` without inverting a slice, on float32
answers too."""

import numpy as np
import pytest

from attnprobe.learners.smooth_ffn import extract_smooth_ffn
from attnprobe.learners.smooth_ffn.derivatives import Asker
from attnprobe.learners.smooth_ffn.drive_start import aimed_circles, bends, circles, drive_factors, solve_groups
from attnprobe.learners.smooth_ffn.learner import choose_start, drive_samples, plan
from attnprobe.models.smooth_ffn import neuron_match
from attnprobe.oracles import Oracle
from attnprobe.targets import minilm_ffn, random_smooth_ffn


def _true_factors(truth, U):
    t = truth.with_dtype("float64")
    A = np.einsum("km,cm->kcm", t.W2, U @ t.W1.T).reshape(-1, t.m)
    return A / np.linalg.norm(A, axis=0)


def test_bends_of_a_piecewise_sinusoid_are_read_at_their_angles():
    """Answers ``Σ_i w2_i relu(cos(θ − φ_i))`` bend at ``φ_i ± π/2``: each bend's angle comes back to a small
    fraction of a sample and its vector points along ``+w2_i`` (the slope only grows at a ReLU bend)."""
    rng = np.random.default_rng(0)
    N, K = 2048, 24
    phi = np.array([0.3, 1.4, 2.9])
    W2 = rng.standard_normal((K, 3))
    theta = 2 * np.pi * np.arange(N) / N
    Y = 1e5 * np.maximum(np.cos(theta[:, None] - phi), 0) @ W2.T + 3.0
    single, mixed = bends(Y)
    assert len(single) == 6 and not mixed
    want = np.sort(np.concatenate([phi + np.pi / 2, phi - np.pi / 2]) % (2 * np.pi))
    got = sorted(single, key=lambda b: b[0])
    assert np.abs(np.array([b[0] for b in got]) - want).max() < 1e-3 * 2 * np.pi / N
    for th, v, _ in got:
        i = int(np.argmin(np.abs(np.cos(th - phi))))  # the neuron bending at th
        assert v @ W2[:, i] / (np.linalg.norm(v) * np.linalg.norm(W2[:, i])) > 1 - 1e-9


def test_drive_factors_of_a_float32_gelu_net_match_the_truth():
    """16-48-16 GELU on float32 answers, 4 directions (6 circles): the 48 best-supported factors are the 48 units'
    within 1e-5 (1 − cos; median 1e-7), one to one, from ``circles(4) × 2048`` queries (the learner keeps the m best
    supported)."""
    truth = random_smooth_ffn(16, 48, 16, activation="gelu", seed=64, dtype="float32")
    oracle = Oracle(truth, 16, precision="float32")
    U = np.random.default_rng(1).standard_normal((4, 16))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    A, info = drive_factors(Asker(oracle), U, 4, 1e5 * np.sqrt(16), 2048)
    assert oracle.queries == circles(4) * 2048
    assert A.shape[1] >= 48
    cos = np.abs(_true_factors(truth, U).T @ A[:, :48])
    err = 1 - cos.max(1)
    assert err.max() < 1e-5 and np.median(err) < 1e-6
    assert len(set(cos.argmax(1).tolist())) == 48


def test_drive_start_learns_a_float32_gelu_net_within_1e3():
    """16-48-16 GELU, float32 answers, the drive start asked for: the check passes, every neuron within 1e-4 after
    the polish, the factors phase asks exactly its circles' answers."""
    truth = random_smooth_ffn(16, 48, 16, activation="gelu", seed=64, dtype="float32")
    res = extract_smooth_ffn(Oracle(truth, 16, precision="float32"), activation="gelu", hidden=48, start="drive")
    assert res.passed and res.details["start"] == "drive" and res.details["left_out"] == 0
    match = neuron_match(truth, res.model)
    assert match["matched_one_to_one"] and match["first_layer_error"] < 1e-4 and match["second_layer_error"] < 1e-4
    assert res.queries_by_phase["factors"] == (plan(16, 16, 48, coarse=True, start="drive")["factors"]
                                               + res.details["aimed_circles"] * drive_samples(48))
    X = np.random.default_rng(2).standard_normal((200, 16))
    y = truth.with_dtype("float64").forward(X)
    assert np.abs(res.model.forward(X) - y).max() < 1e-5 * np.abs(y).max()


def test_the_start_is_chosen_by_precision_width_and_cost():
    assert choose_start(384, 1536, coarse=True) == "drive"  # MiniLM's whole FFN on float32 answers
    assert choose_start(384, 1536, coarse=False) == "jennrich"
    assert choose_start(384, 192, coarse=True) == "jennrich"  # below DRIVE_MIN_UNITS
    assert drive_samples(48) == 2048 and drive_samples(1536) == 16384


@pytest.mark.slow
def test_minilm_ffn_slice_through_the_drive_start_on_float32_answers():
    """The first 192 of MiniLM layer 2's GELU units on float32 answers through the drive start: within 1e-3."""
    truth = minilm_ffn(2, "float32", neurons=192)
    res = extract_smooth_ffn(Oracle(truth, truth.d, precision="float32"), activation="gelu", hidden=192,
                             start="drive")
    assert res.passed and res.details["left_out"] == 0
    match = neuron_match(truth, res.model)
    assert match["matched_one_to_one"] and match["first_layer_error"] < 1e-3


class _NormedFFN:
    """An FFN behind an RMS normalisation of its input: answers that stop growing far from the origin."""

    def __init__(self, ffn) -> None:
        self.ffn = ffn

    def __call__(self, X):
        X = np.asarray(X, dtype=np.float64)
        return self.ffn(X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True)))


def test_a_norm_in_front_is_refused_by_the_drive_start_before_its_circles():
    """The answers of a plain FFN grow linearly far from the origin (gap ~1e-5); behind a norm they do not, so the
    drive start asked for is refused (``start``) after its 16 probes, and the chosen start falls back to Jennrich's."""
    from attnprobe.errors import ConfigError
    from attnprobe.learners.smooth_ffn.drive_start import PROBES, growth_gap

    truth = random_smooth_ffn(16, 48, 16, activation="gelu", seed=64, dtype="float32")
    rng = np.random.default_rng(0)
    assert growth_gap(Asker(Oracle(truth, 16, precision="float32")), 16, 4e5, rng) < 1e-3
    normed = Oracle(_NormedFFN(truth), 16, precision="float32")
    assert growth_gap(Asker(normed), 16, 4e5, rng) > 0.1
    normed = Oracle(_NormedFFN(truth), 16, precision="float32")
    with pytest.raises(ConfigError) as err:
        extract_smooth_ffn(normed, activation="gelu", hidden=48, start="drive")
    assert err.value.param == "start"
    p = plan(16, 16, 48, coarse=True, start="drive")
    assert normed.queries <= p["step"] + p["width"] + 2 * PROBES


def _bends_of(alphas, W2, M, rng, noise=1e-7):
    """Bends ``(a, b, angle, vector, strength)`` of neurons with projections ``alphas`` (n, M) and output columns
    ``W2`` (K, n) on the circle of every pair (a, b): each bends at the two angles where ``α_a cos θ + α_b sin θ``
    vanishes."""
    found = []
    for a in range(M):
        for b in range(a + 1, M):
            for al, w in zip(alphas, W2.T):
                th = np.arctan2(-al[a], al[b]) + rng.normal(0, noise)
                found += [(a, b, th % (2 * np.pi), w, 50.0), (a, b, (th + np.pi) % (2 * np.pi), w, 50.0)]
    return found


def test_a_group_of_two_neurons_with_nearly_equal_output_columns_is_split_by_consensus():
    """Two neurons whose output columns are at cosine 0.998 (MiniLM layer 2 has such a pair) share one group of
    bends, with 10 % stray bends: the least-squares null vector meets neither, the consensus of null vectors of
    random M − 1 equations finds each (1 − cos of the projections < 1e-9) and the strays found no third unit with
    more support."""
    rng = np.random.default_rng(3)
    M, K = 6, 32
    alphas = rng.standard_normal((2, M))
    alphas /= np.linalg.norm(alphas, axis=1, keepdims=True)
    w = rng.standard_normal(K)
    W2 = np.stack([w, w + 0.06 * rng.standard_normal(K)], axis=1)
    found = _bends_of(alphas, W2, M, rng)
    found += [(a, b, rng.uniform(0, 2 * np.pi), w, 50.0) for a, b in rng.integers(0, M, (12, 2)) if a != b]
    W2f, alpha, support, info, planes = solve_groups(found, [list(range(len(found)))], M, M)
    assert info["groups_by_consensus"] >= 1 and not planes
    top = np.argsort(support)[::-1][:2]
    cos = np.abs(np.array(alpha)[top] @ alphas.T)
    assert sorted(support)[-2] > 3 * sorted(support + [0, 0])[-3]  # the strays' best group is a small one
    assert (1 - cos.max(0)).max() < 1e-9 and set(cos.argmax(0).tolist()) == {0, 1}


def test_a_circle_aimed_at_an_open_plane_gives_the_missing_equation():
    """A unit of 16-48-16 GELU (float32 answers) seen only on circles (0, 1) and (2, 3) of 4 directions: its
    equations leave a plane open; one circle in that plane (2048 answers) reads its projections on the 4
    directions (1 − cos < 1e-8)."""
    truth = random_smooth_ffn(16, 48, 16, activation="gelu", seed=64, dtype="float32")
    t = truth.with_dtype("float64")
    oracle = Oracle(truth, 16, precision="float32")
    U = np.random.default_rng(1).standard_normal((4, 16))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    alpha = U @ t.W1.T
    i = 5
    E = np.zeros((2, 4))
    for r, (a, b) in enumerate([(0, 1), (2, 3)]):
        th = np.arctan2(-alpha[a, i], alpha[b, i])
        E[r, a], E[r, b] = np.cos(th), np.sin(th)
    plane = np.linalg.svd(E)[2][2:]
    atoms = t.W2 / np.linalg.norm(t.W2, axis=0)
    W2f, al, support, asked = aimed_circles(Asker(oracle), U, 4, 1e5 * np.sqrt(16), 2048, [(2, i, E, plane)],
                                            atoms=atoms, count=1)
    assert oracle.queries == 2048 * asked and asked == 1 and len(al) == 1
    assert 1 - abs(al[0] @ alpha[:, i]) / np.linalg.norm(alpha[:, i]) < 1e-8
