"""The post-norm (BERT) block's FFN neurons read through n2's per-row scale from first derivatives on n1's sphere
(learners/block/post_norm_neurons.py; docs/block.md, "Post-norm blocks", stage ``neurons``) against the truth of a
real transformers ``BertLayer`` (d = 16, 2 heads, FFN 32, norm weights not 1)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.learners.block.post_norm import first_norm_centre, first_norm_input, output_norm  # noqa: E402
from attnprobe.learners.block.post_norm import centred_unit  # noqa: E402
from attnprobe.learners.block.post_norm_ffn import ffn_points, second_layer  # noqa: E402
from attnprobe.learners.block.post_norm_neurons import (neuron_curves, neuron_span, rank_one_elements,  # noqa: E402
                                                        sphere_jacobians)
from attnprobe.oracles.hf_block import block_model, hf_block, oracle_from_hf_block  # noqa: E402
from test_post_norm_stages import moved_norms_bert_dir  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return moved_norms_bert_dir(tmp_path_factory.mktemp("post_norm_neurons") / "bert", 16, 2)


def _true_first_layer(m):
    P = np.eye(m.d) - 1.0 / m.d
    return (m.ffn.W1 * m.norm1_w) @ P, m.ffn.W1 @ m.norm1_b + m.ffn.b1


def test_the_rank_one_elements_of_the_span_are_the_neurons_directions(folder):
    m = block_model(hf_block(folder, 1))
    d, P = m.d, np.eye(m.d) - 1.0 / m.d
    A, _ = _true_first_layer(m)
    span = [P @ np.diag(m.norm1_w) @ P] + [np.outer(P @ m.ffn.W2[:, i], A[i]) for i in range(m.m)]
    B = np.linalg.qr(np.stack([s.ravel() for s in span], 1))[0]
    el = rank_one_elements(B, m.m, np.random.default_rng(0))
    got = np.stack([np.linalg.svd(e.reshape(d, d))[2][0] for e in el])
    cos = np.abs((A / np.linalg.norm(A, axis=1, keepdims=True)) @ got.T).max(axis=1)
    assert len(el) == m.m and np.all(1 - cos < 1e-8)  # every neuron, each once (measured 1 − cos ~1e-15)


@pytest.mark.slow
def test_the_neurons_from_answers_complete_the_ffn_on_the_sphere(folder):
    """End to end from answers: stages 1 and 3, the sphere's Jacobians (120 points), the span, its rank-one
    elements, the curves, then the second layer (measured: the map on fresh sphere points 2.2e-8 off)."""
    oracle, m = oracle_from_hf_block(folder, 1), block_model(hf_block(folder, 1))
    rows, rng = oracle.answer_rows, np.random.default_rng(0)
    n2 = output_norm(rows, m.d, rng)
    affine = first_norm_input(rows, first_norm_centre(rows, m.d, rng), rng)
    Z, Q, O = sphere_jacobians(rows, affine, n2, rng, 120)
    B, Y, res = neuron_span(Z, Q, O, m.m)
    A, a, misfit = neuron_curves(B, Y, rank_one_elements(B, m.m, rng), Z)
    At, at = _true_first_layer(m)
    for row, bias in zip(A, a):
        i = int(np.argmin(np.linalg.norm(At - row, axis=1)))
        assert np.linalg.norm(row - At[i]) < 1e-5 * np.linalg.norm(At[i]) and abs(bias - at[i]) < 1e-5
    s = second_layer(*ffn_points(rows, affine, n2, rng, 2 * (m.m + m.d + 1)), A, a)
    Zf, Qf = ffn_points(rows, affine, n2, rng, 200)
    assert np.abs(centred_unit(s.w1 * Zf + s.ffn.forward(s.w1 * Zf)) - Qf).max() < 1e-6
