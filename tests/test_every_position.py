"""Every-position answers (B, N, K): the Oracle, the row reuse, the query log, the served API, the vector learner
reading every row, and heads sharing keys and values (GQA)."""

import numpy as np
import pytest

from attnprobe.errors import ConfigError, OracleAnswerError
from attnprobe.learners.multihead.vector import PROGRESSION, extract_vector
from attnprobe.models.every_position import EveryPositionLayer, every_position_rows
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.models.rows import AnswerRows, check_positions, row_query
from attnprobe.oracles import Oracle
from attnprobe.oracles.positions import RowAnswers
from attnprobe.oracles.querylog import QueryLog
from attnprobe.targets.every_position import gqa_layer
from vector_layers import true_layer


def layer(d=8, H=2, K=6, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return MultiHeadAttention(rng.standard_normal((H, d, d)) * scale / np.sqrt(d), rng.standard_normal((H, K, d)),
                              rng.standard_normal((H, d)) * 0.3, rng.standard_normal(K))


@pytest.mark.parametrize("causal", [False, True])
def test_rows_are_last_position_answers_of_a_prefix_or_a_moved_last_permutation(causal):
    m = layer()
    X = np.random.default_rng(1).standard_normal((3, 5, 8))
    Y = every_position_rows(m, X, causal)
    for i in range(5):
        np.testing.assert_allclose(Y[:, i], m(row_query(X, i, 'causal' if causal else 'bidirectional')), rtol=0,
                                   atol=1e-12)


class LastPosition:
    """A last-position model that is not a MultiHeadAttention: AnswerRows reads it once per row."""

    def __init__(self, model):
        self.model, self.d = model, model.d

    def __call__(self, X):
        return self.model(X)


def test_one_row_query_and_one_positions_check_serve_the_rows_the_cache_and_load_model():
    m = layer()
    X = np.random.default_rng(3).standard_normal((2, 4, 8))
    for kind in ("causal", "bidirectional"):
        np.testing.assert_allclose(AnswerRows(LastPosition(m), kind)(X), every_position_rows(m, X, kind == "causal"),
                                   rtol=0, atol=1e-12)
    refusals = [lambda: AnswerRows(m, "positional"), lambda: RowAnswers("positional"),
                lambda: row_query(X, 0, "positional"), lambda: Oracle(m, 8, positions="sideways")]
    for make in refusals:
        with pytest.raises(ConfigError, match="'positions' parameter must be one of") as err:
            make()
        assert err.value.param == "positions"
    assert check_positions("auto") is None and check_positions("positional") == "positional"


@pytest.mark.parametrize("causal, kind", [(False, "bidirectional"), (True, "causal")])
def test_oracle_counts_sequences_and_rows_and_reads_the_positions(causal, kind):
    m = layer()
    o = Oracle(EveryPositionLayer(m, causal), 8)
    X = np.random.default_rng(2).standard_normal((4, 5, 8))
    y = o(X)
    np.testing.assert_allclose(y, m(X), atol=1e-12)  # the last row to a last-position learner
    assert o.every_position and o.positions == kind and o.positions_source == "read from the answers"
    assert o.queries == 4 + 3 and o.rows == 4 * 5 + 3 * 4  # the probe: 3 sequences of 4 rows
    assert o.queries_by_phase["positions"] == 3
    rows = o.answer_rows(X[:2])
    assert rows.shape == (2, 5, 6) and o.queries == 9 and o.rows == 42


@pytest.mark.parametrize("causal", [False, True])
def test_rows_seen_answer_later_queries_without_asking(causal):
    m = layer()
    o = Oracle(EveryPositionLayer(m, causal), 8, positions="causal" if causal else "bidirectional")
    X = np.random.default_rng(3).standard_normal((4, 5, 8))
    o(X)
    assert o.queries == 4 and o.positions_source == "declared"  # declared: no probe
    later = X[:, :3] if causal else X[:, [4, 0, 3, 1, 2]]  # a prefix / a moved-last permutation
    y = o(later)
    assert o.queries == 4 and o.from_rows == 4
    np.testing.assert_allclose(y, m(later), atol=1e-12)
    fresh = np.random.default_rng(4).standard_normal((2, 3, 8))
    o(fresh)
    assert o.queries == 6 and o.from_rows == 4
    if not causal:  # a batch of permutations of one sequence asks it once
        perms = np.stack([fresh[0][[1, 2, 0]], fresh[0][[0, 2, 1]]])
        o(np.random.default_rng(5).standard_normal((1, 3, 8)))
        before = o.queries
        o(np.concatenate([perms, perms[::-1]]))
        assert o.queries == before  # both were answered by fresh[0]'s rows
    with o.phase("check", fresh=True):  # the functional check asks the oracle itself
        o(later)
    assert o.queries_by_phase["check"] == 4


def test_a_layer_with_position_terms_reuses_no_row():
    m = layer()
    pos = np.random.default_rng(6).standard_normal((16, 8))

    def positional(X):
        return every_position_rows(m, X + pos[:X.shape[1]])

    o = Oracle(positional, 8)
    X = np.random.default_rng(7).standard_normal((2, 4, 8))
    o(X)
    assert o.positions == "positional"
    before = o.queries
    o(X[:, [3, 1, 2, 0]])
    assert o.queries == before + 2 and o.from_rows == 0


def test_last_position_oracles_refuse_rows_and_shapes_may_not_change():
    m = layer()
    o = Oracle(m, 8)
    X = np.zeros((2, 3, 8))
    o(X)
    assert o.positions == "last" and o.rows == 2
    with pytest.raises(OracleAnswerError, match="last position only"):
        o.answer_rows(X)
    flip = iter([True, False])

    def fickle(X):
        return every_position_rows(m, X) if next(flip) else m(X)

    o = Oracle(fickle, 8, positions="bidirectional")
    o(X)
    with pytest.raises(OracleAnswerError, match="every position before"):
        o(np.ones((2, 3, 8)))
    with pytest.raises(ConfigError, match="'positions' parameter must be one of"):
        Oracle(m, 8, positions="sideways")


def test_query_log_keeps_every_row_and_refuses_to_mix(tmp_path):
    m = layer()
    fn = EveryPositionLayer(m)
    X = np.random.default_rng(8).standard_normal((3, 4, 8))
    log = QueryLog(tmp_path / "q.sqlite", identity="every")
    o = Oracle(fn, 8, log=log, positions="bidirectional")
    first = o.answer_rows(X)
    log.close()
    log = QueryLog(tmp_path / "q.sqlite", identity="every")
    o2 = Oracle(fn, 8, log=log, positions="bidirectional")
    again = o2.answer_rows(X)
    assert np.array_equal(first, again) and o2.from_log == 3 and log.every_position
    log.close()
    log = QueryLog(tmp_path / "q.sqlite", identity="every")
    with pytest.raises(ConfigError, match="holds answers at every position"):
        Oracle(m, 8, log=log)(np.zeros((1, 2, 8)) + 0.5)
    log.close()


@pytest.mark.parametrize("wire", ["json", "npy"])
def test_served_every_position_answers(wire):
    pytest.importorskip("fastapi")
    from attnprobe.oracles.http import oracle_from_url
    from attnprobe.service import KeyStore, ServiceOptions, build_app
    from attnprobe.service.server import BackgroundServer

    m = layer()
    app = build_app(EveryPositionLayer(m, causal=True), ServiceOptions(d=8, outputs=6, every_position=True),
                    KeyStore(["k"]))
    X = np.random.default_rng(9).standard_normal((3, 4, 8))
    with BackgroundServer(app) as srv:
        o = oracle_from_url(srv.url, "k", wire=wire)
        rows = o.answer_rows(X)
        assert o.positions == "causal"
        assert o.fn.usage()["queries"] == o.queries == 6
    np.testing.assert_allclose(rows, every_position_rows(m, X, causal=True), rtol=0, atol=1e-15)


@pytest.mark.parametrize("causal", [False, True])
def test_vector_learner_reads_every_row(causal):
    m = true_layer(32, 4, seed=1)
    last = extract_vector(Oracle(m, 32), seed=0)
    o = Oracle(EveryPositionLayer(m, causal), 32)
    res = extract_vector(o, seed=0)
    match = match_heads(m, res.model)
    assert res.passed and match.worst < 1e-9
    assert res.details["positions"] == ("causal" if causal else "bidirectional")
    assert o.rows > res.details["rows"] > res.queries  # (the functional check comes after)
    # m tokens per sequence: bidirectional reads m² logits where the last position reads m (causal: half)
    assert res.queries_by_phase["logits"] < (0.55 if not causal else 1.0) * last.queries_by_phase["logits"]


def _grouped_run(m, every=True):
    res = extract_vector(Oracle(EveryPositionLayer(m) if every else m, 32), seed=0)
    match = match_heads(m, res.model)
    assert res.passed and match.worst < 1e-8
    return res, {int(got): true for true, got in enumerate(match.perm)}  # recovered head -> true head


def test_gqa_heads_are_grouped_and_need_rank_m_plus_one_differences():
    res, perm = _grouped_run(gqa_layer(32, 8, 2))
    g = res.details
    assert sorted(sorted(perm[h] for h in group) for group in g["groups"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert g["value_rank"] == 2 * 4 and g["differences"] == 2 * 4 + 1  # rank M + 1, where d + 1 = 33 otherwise
    # per group: key and value bases 2·32·4, per head A_h 4·32 and B_h 32·4
    assert g["result_numbers"] == {"dense": 8 * 2 * 32 * 32, "grouped": 2 * (2 * 32 * 4 + 4 * 2 * 32 * 4)}
    assert any("2 groups" in n for n in res.notes)


def test_gqa_costs_fewer_queries_than_the_same_layer_without_sharing():
    # last-position answers: the differences route (every-position answers split M by column spaces early either way)
    (gqa, _), (plain, _) = _grouped_run(gqa_layer(32, 8, 2), False), _grouped_run(gqa_layer(32, 8, 8), False)
    assert plain.details["groups"] == [[h] for h in range(8)] and plain.details["differences"] == 33
    assert gqa.queries_by_phase["separate"] < 0.5 * plain.queries_by_phase["separate"]
    assert gqa.queries < plain.queries
    assert gqa.details["result_numbers"]["grouped"] < plain.details["result_numbers"]["grouped"]


@pytest.mark.parametrize("declared", ["auto", "causal"])
def test_cli_extract_reports_rows_and_positions(tmp_path, monkeypatch, capsys, declared):
    import json
    import sys
    import textwrap

    from attnprobe.cli import main

    (tmp_path / "victim.py").write_text(textwrap.dedent("""
        import numpy as np
        from attnprobe.models.every_position import EveryPositionLayer
        from attnprobe.models.multihead import MultiHeadAttention
        rng = np.random.default_rng(0)
        answer = EveryPositionLayer(MultiHeadAttention(rng.standard_normal((2, 8, 8)) / 3,
                                                       rng.standard_normal((2, 12, 8)),
                                                       rng.standard_normal((2, 8)) * 0.3, rng.standard_normal(12)),
                                    causal=True)
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "o.npz"
    assert main(["extract", "--oracle", "victim:answer", "--d", "8", "--method", "multihead", "--positions", declared,
                 "--out", str(out), "--quiet"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    oracle = summary["details"]["oracle"]
    assert oracle["positions"] == "causal" and summary["details"]["positions"] == "causal"
    assert oracle["positions_source"] == ("declared" if declared == "causal" else "read from the answers")
    assert oracle["rows"] > oracle["queries_total"] and summary["passed"]
    if declared != "causal":
        return
    # --estimate with the rows declared: the every-position plan, asking nothing, near the real bill
    from attnprobe.learners.core.estimate import estimate_queries

    base = ["extract", "--oracle", "victim:answer", "--d", "8", "--method", "multihead", "--heads", "2",
            "--outputs", "12", "--estimate"]
    assert main(base + ["--positions", "causal"]) == 0
    line = capsys.readouterr().out
    est = estimate_queries("multihead", 8, heads=2, outputs=12, positions="causal")
    assert f"about {est.queries} queries" in line and "every position: causal" in line and "0 asked" in line
    assert est.low <= oracle["queries_total"] <= est.high
    assert main(base) == 0 and "every position" not in capsys.readouterr().out  # not declared: the last position


def test_float32_every_position_answers_are_read_within_their_precision():
    m = true_layer(32, 4, seed=1).with_dtype("float32")
    last = extract_vector(Oracle(m, 32, precision="auto"), seed=0)
    res = extract_vector(Oracle(EveryPositionLayer(m), 32, precision="auto"), seed=0)
    match = match_heads(true_layer(32, 4, seed=1), res.model)
    assert res.passed and match.worst < 1e-3 and res.details["positions"] == "bidirectional"
    # the logits stage reads every row; the separation every row of progressions: short differences until the
    # heads' column spaces show, then a long one along every direction started in them (no second short fit each)
    assert res.queries_by_phase["logits"] < 0.5 * last.queries_by_phase["logits"]
    assert res.details["progressions"] == PROGRESSION
    assert res.queries_by_phase["separate"] < 0.75 * last.queries_by_phase["separate"]


@pytest.mark.slow
def test_transformers_llama_attention_with_shared_kv_heads_is_grouped():
    """transformers' LlamaAttention, rotation off (cos = 1, sin = 0), 8 query heads on 2 KV heads; its softmax is
    float32, declared so: every head within float32's reach, the two groups named, rank M + 1 differences."""
    pytest.importorskip("transformers")
    from attnprobe.targets.every_position import LlamaRows

    fn = LlamaRows(64, 8, 2, seed=0)
    truth = fn.truth()
    res = extract_vector(Oracle(fn, 64, precision="float32"), seed=0)
    match = match_heads(truth, res.model)
    assert res.passed and match.worst < 1e-3 and res.details["positions"] == "bidirectional"
    perm = {int(got): true for true, got in enumerate(match.perm)}
    assert sorted(sorted(perm[h] for h in g) for g in res.details["groups"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert res.details["value_rank"] == 16 and res.details["differences"] == 17


def test_gpt2_folder_answering_every_row_is_recovered_through_the_hf_oracle(tmp_path):
    """A GPT-2 folder's attention sublayer (transformers' Conv1D: it views its input, so the oracle must hand the
    module contiguous batches however the rows were sliced) answering every row: causal, recovered."""
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_models import tiny_family_dir

    from attnprobe.oracles.hf_attention import oracle_from_hf
    from attnprobe.targets.hf import hf_layer_arrays

    folder = tiny_family_dir(tmp_path / "gpt2", "gpt2", hidden=16, heads=2, layers=1, seed=0)
    oracle = oracle_from_hf(folder, 0, every_position=True, precision="auto")
    res = extract_vector(oracle, seed=0)
    truth = MultiHeadAttention.from_arrays(hf_layer_arrays(folder, 0))
    assert res.passed and match_heads(truth, res.model).worst < 1e-8
    assert res.details["positions"] == "causal" and res.details["rows"] > res.queries
    assert res.queries_by_phase["values"] == 16 + 1  # [x] and [0]: d + 1


def test_rows_of_tiny_tokens_show_the_value_map_along_their_mean_only():
    """Why a bidirectional layer's values stage stays d + 1 sequences (docs/benchmarks/every-position.md): the
    rows of a sequence of tokens of norm ε agree with each other to O(ε²) and with ``M x̄ + c`` to O(ε) (the
    ``u_h`` term): to first order a sequence shows ``M`` along one direction. A causal layer's rows do not."""
    m = layer(d=16, H=2, K=12, seed=3)
    M = m.v.sum(axis=0)
    X = np.random.default_rng(4).standard_normal((6, 16)) / 4

    def sizes(causal, eps):
        Y = every_position_rows(m, eps * X[None], causal)[0] - m.c
        first = np.linalg.norm(M @ (eps * X.mean(axis=0)))
        apart = np.linalg.norm(Y - Y.mean(axis=0), axis=1).max() / first
        return apart, np.linalg.norm(Y.mean(axis=0) - M @ (eps * X.mean(axis=0))) / first

    (apart1, miss1), (apart2, miss2) = sizes(False, 1e-2), sizes(False, 1e-3)
    assert 50 < apart1 / apart2 < 200 and 5 < miss1 / miss2 < 20  # O(ε²) apart, O(ε) off M x̄
    assert apart2 < 1e-3 * miss1
    causal1, causal2 = sizes(True, 1e-2)[0], sizes(True, 1e-3)[0]
    assert causal1 > 0.05 and causal1 / causal2 < 2  # a causal row i sees the mean of x_0..x_i: O(1) apart


def test_the_logits_stage_averages_every_reading_of_u_h_and_w_h():
    """With value maps slightly off (as float32 separations leave them, Σ_h E_h = 0), each sequence reads a
    different u_h and W_h entry: the stage returns the mean of every reading (each W_h reading less its own
    sequence's u_h reading), not the last one."""
    from attnprobe.learners.head.probes import random_orthogonal
    from attnprobe.learners.multihead.vector_rows import learn_logits_rows, logits_sequences, read_rows

    m = layer(d=8, H=2, K=12, seed=3)
    E = 1e-3 * np.random.default_rng(4).standard_normal(m.v.shape[1:])
    V = m.v + np.stack([E, -E])
    oracle = Oracle(EveryPositionLayer(m), 8)
    scale, tokens = 0.5, 4
    W, u, *_ = learn_logits_rows(oracle, m.c, V, scale, tokens, np.random.default_rng(0), lambda: None,
                                 causal=False, sketch=False)
    O = random_orthogonal(8, np.random.default_rng(0))
    u_reads, w_reads = [[] for _ in range(8)], {}
    for s in logits_sequences(8, 2, tokens, False, False)[0]:
        T = np.where((s >= 0)[:, None], scale * O[np.maximum(s, 0)], 0.0)
        lg, _ = read_rows(EveryPositionLayer(m)(T[None])[0], m.c, V, T, False)
        live = np.flatnonzero(s >= 0)
        for j in live:
            u_reads[s[j]].append(lg[:, 0, j])
            for i in live:
                w_reads.setdefault((s[j], s[i]), []).append(lg[:, i, j] - lg[:, 0, j])
    assert min(len(r) for r in u_reads) > 1  # every direction is read several times, differently
    assert max(np.ptp(np.array(r), axis=0).max() for r in u_reads) > 1e-6
    u_mean = np.stack([np.mean(r, axis=0) for r in u_reads], axis=1) @ O / scale
    np.testing.assert_allclose(u, u_mean, rtol=0, atol=1e-12)
    Wb = np.zeros((2, 8, 8))
    for (j, i), r in w_reads.items():
        Wb[:, j, i] = np.mean(r, axis=0) / scale**2
    np.testing.assert_allclose(W, O.T @ Wb @ O, rtol=0, atol=1e-10)
