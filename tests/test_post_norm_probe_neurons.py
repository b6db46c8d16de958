"""The post-norm neurons stage through C probe directions, for wide layers (learners/block/post_norm_probe_span.py,
post_norm_factors.py, post_norm_probe_neurons.py; docs/block.md, "Post-norm blocks", stage ``neurons``: "Through
probes, as library pieces") from the answers of a real transformers ``BertLayer`` (d = 16, 2 heads, FFN 32, norm
weights not 1), against its truth."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.learners.block.post_norm import first_norm_centre, first_norm_input, output_norm  # noqa: E402
from attnprobe.learners.block.post_norm_factors import factors_complete, probe_factors  # noqa: E402
from attnprobe.learners.block.post_norm_probe_neurons import probe_neurons  # noqa: E402
from attnprobe.learners.block.post_norm_probe_span import probe_points, probe_span  # noqa: E402
from attnprobe.oracles.hf_block import block_model, hf_block, oracle_from_hf_block  # noqa: E402
from test_post_norm_stages import moved_norms_bert_dir  # noqa: E402


@pytest.fixture(scope="module")
def layer(tmp_path_factory):
    folder = moved_norms_bert_dir(tmp_path_factory.mktemp("post_norm_probe") / "bert", 16, 2)
    oracle, m = oracle_from_hf_block(folder, 1), block_model(hf_block(folder, 1))
    rows, rng = oracle.answer_rows, np.random.default_rng(0)
    n2 = output_norm(rows, m.d, rng)
    return rows, first_norm_input(rows, first_norm_centre(rows, m.d, rng), rng), n2, m


def test_the_probe_span_and_every_factor_from_answers(layer):
    rows, affine, n2, m = layer
    d, C, rng = m.d, 6, np.random.default_rng(1)
    P = np.eye(d) - 1.0 / d
    U = np.linalg.qr(P @ rng.standard_normal((d, C)))[0]
    _, Q, X = probe_points(rows, affine, n2, U, rng, 100)
    B, residuals = probe_span(X, Q, C, m.m + 1)
    A1 = (m.ffn.W1 * m.norm1_w) @ P
    F = np.hstack([np.einsum("xi,ic->xci", P @ m.ffn.W2, A1 @ U).reshape(d * C, m.m),
                   ((P * m.norm1_w) @ U).reshape(-1, 1)])
    Ft = np.linalg.qr(F)[0]
    assert residuals[-1] < 1e-8 and np.linalg.svd(B - Ft @ (Ft.T @ B), compute_uv=False).max() < 1e-6  # 1.1e-8
    W, A = probe_factors(B, d, C, m.m, rng, 20 * m.m, batch=8)
    at = A1 @ U
    at /= np.linalg.norm(at, axis=1, keepdims=True)
    wt = P @ m.ffn.W2
    wt /= np.linalg.norm(wt, axis=0)
    hit = (np.max(np.abs(at @ A.T), axis=1) > 1 - 1e-6) & (np.max(np.abs(wt.T @ W.T), axis=1) > 1 - 1e-6)
    assert len(W) == m.m and hit.all()
    assert factors_complete(B, W, A, U, tol=1e-6)[0]


@pytest.mark.slow
def test_every_neuron_through_probes_from_answers(layer):
    """The whole stage (span, factors, directions past the probes, curves; measured 2.8e-8 worst, 2,239 queries)."""
    rows, affine, n2, m = layer
    A, a, details = probe_neurons(rows, affine, n2, m.m, np.random.default_rng(3))
    P = np.eye(m.d) - 1.0 / m.d
    At, at = (m.ffn.W1 * m.norm1_w) @ P, m.ffn.W1 @ m.norm1_b + m.ffn.b1
    for row, bias in zip(A, a):
        i = int(np.argmin(np.linalg.norm(At - row, axis=1)))
        assert np.linalg.norm(row - At[i]) < 1e-6 * np.linalg.norm(At[i]) and abs(bias - at[i]) < 1e-6
    assert len(A) == m.m and details["curve_misfit"] < 1e-6


@pytest.mark.parametrize("kappa, s, c", [(1.47, -0.67, -4.83), (0.7, -1.1, 0.4), (-0.3, 2.2, 1.5)])
def test_a_neuron_curve_is_fitted_from_the_screened_start_mostly_off_ones_included(kappa, s, c):
    """``derivative_curve`` on 3,090 points (MiniLM's count) with 1e-9 noise: κ, s, c to 1e-6, including a
    mostly-off neuron (c = −4.8 at |s t| ≲ 3) that the 12-start grid (shifts ±1) alone missed (misfit 0.60)."""
    from attnprobe.learners.block.post_norm_neurons import derivative_curve
    from attnprobe.models.smooth_ffn import activation

    rng = np.random.default_rng(0)
    t = 1.3 * rng.standard_normal(3090)
    y = kappa * activation("gelu").d1(s * t + c) + 1e-9 * rng.standard_normal(3090)
    (k1, s1, c1), misfit = derivative_curve(t, y)
    assert misfit < 1e-6 and np.allclose([k1, s1, c1], [kappa, s, c], rtol=1e-5, atol=1e-6)
