"""End to end: the multi-head learner against the live Hugging Face module (one output row through a readout)."""

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from attnprobe.learners.multihead import extract_multihead  # noqa: E402
from attnprobe.models.multihead import match_heads  # noqa: E402
from attnprobe.oracles.hf_attention import oracle_from_hf  # noqa: E402
from attnprobe.targets.hf import hf_layer_row  # noqa: E402
from hf_models import tiny_bert_dir  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_bert_dir(tmp_path_factory.mktemp("tiny_bert"), hidden=12, heads=2, layers=1, seed=3)


@pytest.mark.parametrize("row", [0, 7])
def test_every_head_of_a_bert_layer_row_float64(tiny, row):
    """The real BertSelfAttention + dense module (d = 12, H = 2, d_h = 6) as the victim, float64: every head's W, u,
    v within 1e-6 of the folder's weights up to permutation, the check passed, queries within 4Hd² − 2H + 1
    plus the functional check."""
    oracle = oracle_from_hf(tiny, 0, row=row)
    res = extract_multihead(oracle, heads=2, rank=6, seed=row)
    truth = hf_layer_row(tiny, 0, row)
    match = match_heads(truth, res.model)
    assert res.passed
    assert match.worst < 1e-6, match.as_dict()
    assert abs(res.model.c - truth.c) < 1e-6 * max(1.0, abs(truth.c))
    assert res.queries <= truth.query_bound(12, 2)
    assert res.queries + res.check["queries"] == oracle.queries
    assert oracle.max_input_norm_used > 0


def test_a_wrong_model_fails_against_the_module(tiny):
    """The check that passes above is not vacuous: the truth of another row does not describe this row."""
    oracle = oracle_from_hf(tiny, 0, row=0)
    X = np.random.default_rng(0).standard_normal((50, 3, 12))
    y = oracle(X)
    assert np.abs(hf_layer_row(tiny, 0, 0)(X) - y).max() < 1e-10 * np.abs(y).max()
    assert np.abs(hf_layer_row(tiny, 0, 1)(X) - y).max() > 1e-2 * np.abs(y).max()


@pytest.mark.slow
@pytest.mark.parametrize("layer", [0])
def test_whole_output_row_of_minilm_with_the_whole_row_learner(layer):
    """The real MiniLM-L6 module answering its whole 384-dim row in float64: every head's W_h, u_h, V_h ≤ 1e-8 up to
    permutation, with probes of moderate norm and far fewer queries than the scalar learner's ~316k."""
    vector = pytest.importorskip("attnprobe.learners.multihead.vector")
    from attnprobe.targets.hf import hf_layer_arrays, minilm_dir

    a = hf_layer_arrays(minilm_dir(), layer)
    oracle = oracle_from_hf(minilm_dir(), layer)
    res = vector.extract_vector(oracle, seed=0)
    truth = type(res.model)(a["W"], a["v"], a["u"], a["c"])
    assert res.passed and res.model.H == 12
    assert match_heads(truth, res.model).worst < 1e-8
    assert res.queries <= 60_000 and oracle.max_input_norm_used < 1e3
