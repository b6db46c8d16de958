"""The post-norm (BERT) block's FFN stage given its first layer (learners/block/post_norm_ffn.py; docs/block.md,
"Post-norm blocks", stage ``ffn``) against the truth of a real transformers ``BertLayer`` (d = 16, 2 heads, FFN 32,
norm weights not 1): the rows' scales, n1's weight, the second layer and the joint bias as one null vector."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.errors import UnidentifiableError  # noqa: E402
from attnprobe.learners.block.post_norm import (FirstNormInput, first_norm_centre, first_norm_input,  # noqa: E402
                                               output_norm)
from attnprobe.learners.block.post_norm import centred_unit  # noqa: E402
from attnprobe.learners.block.post_norm_ffn import ffn_points, second_layer  # noqa: E402
from attnprobe.oracles.hf_block import block_model, hf_block, oracle_from_hf_block  # noqa: E402
from test_post_norm_stages import _value_affine, moved_norms_bert_dir  # noqa: E402


def _points(folder, stages: bool):
    """(true model, oracle, affine, n2, Z, Q, true first layer) on layer 1 of the folder's model; ``stages``: K, c
    and n2 read by the stages before (else the truth's: the fast twin)."""
    oracle, m = oracle_from_hf_block(folder, 1), block_model(hf_block(folder, 1))
    rng = np.random.default_rng(0)
    if stages:
        n2 = output_norm(oracle.answer_rows, m.d, rng)
        affine = first_norm_input(oracle.answer_rows, first_norm_centre(oracle.answer_rows, m.d, rng), rng)
    else:
        n2, affine = (m.norm2_w, m.norm2_b), FirstNormInput(*_value_affine(m), 0.0, 0)
    A, a = m.ffn.W1 * m.norm1_w, m.ffn.W1 @ m.norm1_b + m.ffn.b1
    Z, Q = ffn_points(oracle.answer_rows, affine, n2, rng, 2 * (m.m + m.d + 1))
    return m, oracle, affine, n2, Z, Q, (A, a)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """:func:`moved_norms_bert_dir` at d = 16, 2 heads (FFN 32)."""
    return moved_norms_bert_dir(tmp_path_factory.mktemp("post_norm_ffn") / "bert", 16, 2)


@pytest.fixture(scope="module", params=[False, pytest.param(True, marks=pytest.mark.slow)],
                ids=["true_stages", "read_stages"])
def points(folder, request):
    return _points(folder, request.param)


def _true_u(m, Z):
    h = m.norm1_w * Z + m.norm1_b
    return h + m.ffn.forward(h)


def test_the_points_are_the_centred_unit_rows_of_u(points):
    m, _, _, _, Z, Q, _ = points
    assert np.abs(Q - centred_unit(_true_u(m, Z))).max() < 1e-6  # measured ~1e-8 (K's error)


def test_given_the_neurons_the_rows_scales_and_the_second_layer_are_one_null_vector(points):
    m, oracle, affine, n2, Z, Q, (A, a) = points
    got = second_layer(Z, Q, A, a)
    assert got.null < 1e-12 < 1e-6 < got.gap  # one null vector, well apart (measured 9e-17 and 3e-2)
    u = _true_u(m, Z)
    r = np.sqrt(np.mean((u - u.mean(axis=1, keepdims=True)) ** 2, axis=1))
    assert np.abs(got.scales - r / r.mean()).max() < 1e-6
    w = got.w1 * np.sign(got.w1 @ m.norm1_w)
    assert np.abs(w / np.linalg.norm(w) - m.norm1_w / np.linalg.norm(m.norm1_w)).max() < 1e-6  # n1 up to scale
    Zf, Qf = ffn_points(oracle.answer_rows, affine, n2, np.random.default_rng(1), 200)
    fresh = centred_unit(got.w1 * Zf + got.ffn.forward(got.w1 * Zf))
    assert np.abs(fresh - Qf).max() < 1e-6  # measured 1.4e-8


def test_wrong_neurons_leave_no_null_vector(points):
    _, _, _, _, Z, Q, (A, a) = points
    got = second_layer(Z, Q, A + 1e-3 * np.random.default_rng(2).standard_normal(A.shape), a)
    assert got.null > 1e-10 and got.misfit > 1e-4  # measured 1.2e-7 and 6.7e-3


def test_too_few_points_are_refused_in_one_line(points):
    _, _, _, _, Z, Q, (A, a) = points
    with pytest.raises(UnidentifiableError, match="points for"):
        second_layer(Z[:A.shape[0]], Q[:A.shape[0]], A, a)
