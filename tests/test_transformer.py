"""One-layer transformers (Sec. 4.1): the model, the antisymmetric oracle, the learner and the CLI."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnprobe.cli import main
from attnprobe.errors import BudgetExceededError, ConfigError, UnidentifiableError
from attnprobe.learners.transformer import extract_transformer
from attnprobe.models import AttentionHead, OneLayerTransformer, load_model, neuron_errors
from attnprobe.oracles import AntisymmetricOracle, Oracle
from attnprobe.targets import random_transformer


def test_forward_matches_definition():
    tf = random_transformer(4, 6, seed=0)
    X = np.random.default_rng(1).standard_normal((3, 5, 4))
    for b in range(3):
        s = X[b] @ tf.W @ X[b, -1]
        a = np.exp(s - s.max())
        a /= a.sum()
        want = tf.w_o @ np.maximum(tf.A.T @ (X[b].T @ a), 0)
        assert tf(X)[b] == pytest.approx(want, rel=1e-12)
    # length-1 queries are the FFN
    np.testing.assert_allclose(tf(X[:, :1]), tf.ffn.forward(X[:, 0]), rtol=1e-13)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 9))
def test_antisymmetric_oracle_is_a_single_head_with_v_equal_A_w_o(seed, N):
    tf = random_transformer(5, 7, seed=seed)
    X = np.random.default_rng(seed).standard_normal((4, N, 5))
    base = Oracle(tf, 5)
    anti = AntisymmetricOracle(base)
    head = AttentionHead(tf.W, tf.A @ tf.w_o)
    np.testing.assert_allclose(anti(X), head(X), rtol=1e-9, atol=1e-12)
    assert anti.queries == 4 and base.queries == 8


def test_antisymmetric_oracle_budget_counts_two_per_query():
    tf = random_transformer(3, 3, seed=1)
    base = Oracle(tf, 3, budget=10)
    anti = AntisymmetricOracle(base)
    anti(np.ones((5, 2, 3)))
    assert base.queries == 10
    with pytest.raises(BudgetExceededError):
        anti(np.ones((1, 2, 3)))
    assert base.queries == 10
    with pytest.raises(ConfigError):
        AntisymmetricOracle(tf)


def test_model_validation_and_io(tmp_path):
    with pytest.raises(ConfigError, match="W must be"):
        OneLayerTransformer(np.eye(3), np.ones((4, 2)), np.ones(2))
    tf = random_transformer(4, 3, seed=2)
    from attnprobe.models import save_model

    back = load_model(save_model(tf, tmp_path / "tf.npz"))
    assert back.kind == "one_layer_transformer"
    np.testing.assert_array_equal(back.W, tf.W)


@pytest.mark.parametrize("d,m", [(8, 8), (8, 32), (16, 16)])
def test_extraction_recovers_W_exactly_and_the_function(d, m):
    tf = random_transformer(d, m, seed=d * m)
    o = Oracle(tf, d)
    res = extract_transformer(o, seed=0)
    assert np.linalg.norm(res.model.W - tf.W) / np.linalg.norm(tf.W) <= 1e-9
    assert res.check.error <= 1e-8
    assert res.check.lengths == tuple(range(1, 9))
    assert max(res.check.per_length.values()) <= 1e-8
    qb = res.details["query_breakdown"]
    assert qb["attention"] == 2 * qb["antisymmetric_queries"] == 2 * sum(qb["attention_phases"].values())
    assert qb["attention"] + qb["ffn"] == res.queries
    assert res.queries_by_phase == {"attention": qb["attention"], "ffn": qb["ffn"]}
    assert o.queries == res.queries + res.check.queries
    np.testing.assert_allclose(res.model.v, tf.A @ tf.w_o, rtol=1e-8, atol=1e-10)
    err = neuron_errors(tf.A, tf.w_o, res.model.A, res.model.w_o)
    assert err["recovered_neurons"] == m and err["direction_error"] <= 1e-7


def test_v_zero_makes_W_unidentifiable():
    rng = np.random.default_rng(3)
    a = rng.standard_normal(6)
    A = np.stack([a, -a], axis=1)  # ReLU(aᵀz) + ReLU(−aᵀz) = |aᵀz|: v = A w_o = 0
    tf = OneLayerTransformer(rng.standard_normal((6, 6)), A, np.ones(2))
    assert np.allclose(tf.v, 0)
    with pytest.raises(UnidentifiableError, match="A w_o"):
        extract_transformer(Oracle(tf, 6))


def test_cli_extracts_a_saved_transformer(tmp_path, capsys):
    target = tmp_path / "tf.npz"
    out = tmp_path / "rec.npz"
    assert main(["target", "transformer", "--d", "6", "--m", "12", "--seed", "3", "--out", str(target)]) == 0
    assert main(["extract", "--target", str(target), "--method", "transformer", "--transformer-route", "paper",
                 "--out", str(out), "--quiet"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["method"] == "transformer-paper"  # the learner "transformer", route paper
    assert summary["check"]["relative_error"] <= 1e-8
    qb = summary["details"]["query_breakdown"]
    assert qb["attention"] + qb["ffn"] == summary["queries"]
    with np.load(out) as z:
        assert {"W", "A", "w_o", "v"} <= set(z.files)
        truth = load_model(target)
        assert np.linalg.norm(z["W"] - truth.W) / np.linalg.norm(truth.W) <= 1e-9


def test_cli_ffn_method_and_clear_error_on_wrong_target(tmp_path, capsys):
    target = tmp_path / "relu.npz"
    assert main(["target", "relu", "--d", "5", "--m", "3", "--out", str(target)]) == 0
    assert main(["extract", "--target", str(target), "--method", "ffn", "--out", str(tmp_path / "r.npz"),
                 "--quiet"]) == 0
    # a bare ReLU network answers only length-1 queries: the transformer method fails with one readable line
    assert main(["extract", "--target", str(target), "--method", "transformer", "--out",
                 str(tmp_path / "t.npz"), "--quiet"]) == 2
    assert "length-1" in capsys.readouterr().err


def test_cli_verify_matches_neurons_up_to_permutation(tmp_path, capsys):
    target, out = tmp_path / "tf.npz", tmp_path / "rec.npz"
    main(["target", "transformer", "--d", "6", "--m", "6", "--seed", "5", "--out", str(target)])
    main(["extract", "--target", str(target), "--method", "transformer", "--transformer-route", "paper", "--out",
          str(out), "--quiet"])
    capsys.readouterr()
    js = tmp_path / "errs.json"
    assert main(["verify", "--target", str(target), "--result", str(out), "--json", str(js)]) == 0
    errs = json.loads(js.read_text())
    assert errs["W"] <= 1e-9 and errs["neuron_direction"] <= 1e-8 and errs["neuron_weight"] <= 1e-8


# ---------------------------------------------------------------------------------------- the default route
def _by_route(target, route, seed=0):
    import attnprobe.learners  # noqa: F401  (registers the learners)
    from attnprobe.learners.core import registry

    oracle = Oracle(target, target.d)
    res = registry.learner("transformer")(oracle, seed=seed, transformer_route=route)
    assert oracle.queries == res.queries + res.check.queries
    return res


@pytest.mark.parametrize("seed", [0, 1])
def test_the_default_route_learns_the_papers_model_for_the_paper_routes_queries(seed):
    """The paper's model (one head, bias-free FFN, one output; d = 12, m = 20): the default route is the paper
    route plus the one query at 0 that allowed it (the regions route spent 3.8x as many)."""
    t = random_transformer(12, 20, seed=seed)
    default, paper = _by_route(t, None, seed), _by_route(t, "paper", seed)
    assert default.method == paper.method == "transformer-paper" and default.check.passed
    assert default.model.kind == "multihead_transformer" and default.model.H == 1  # the learner's kind
    assert default.queries == paper.queries + 1 and default.queries_by_phase["route"] == 1
    assert default.queries < _by_route(t, "regions", seed).queries / 2


def test_the_default_route_on_other_transformers_is_regions_counting_what_it_tried():
    """Two bias-free heads (one output, 0 at X = [0]): the paper route is tried and stops within its attention
    stage (≤ 2·(d² + d) queries), then the regions route runs as it would alone. FFN biases: the query at 0 rules
    the paper route out; K = 3 outputs too."""
    from attnprobe.targets import random_multihead_transformer

    d = 12
    two = random_multihead_transformer(d, 2, 20, outputs=1, bias=False, seed=0)
    default, regions = _by_route(two, None), _by_route(two, "regions")
    assert default.method == regions.method == "transformer-regions" and default.check.passed
    tried = default.queries_by_phase["paper route"]
    assert 0 < tried <= 2 * (d * d + d)
    assert default.queries == regions.queries + 1 + tried
    assert any("paper route stopped" in n for n in default.notes)
    for target in (random_multihead_transformer(d, 1, 20, outputs=1, bias=True, seed=0),
                   random_multihead_transformer(d, 2, 20, outputs=3, bias=True, seed=0)):
        default, regions = _by_route(target, None), _by_route(target, "regions")
        assert default.method == "transformer-regions" and default.check.passed
        assert default.queries == regions.queries + 1 and "paper route" not in default.queries_by_phase
