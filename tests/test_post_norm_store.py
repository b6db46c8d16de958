"""A post-norm run's stages kept in a folder and resumed (learners/block/post_norm_store.py; docs/block.md,
"Through probes, as library pieces"): the factor search paused at its deadline resumes from the factors it saved
(fast, on a synthetic crowded span), and the whole probe route paused after every saved step reads the same true
neurons of a transformers ``BertLayer`` (slow)."""

import numpy as np
import pytest

from attnprobe.learners.block.post_norm_factors import factors_complete
from attnprobe.learners.block.post_norm_probe_neurons import all_factors
from attnprobe.learners.block.post_norm_store import Paused, StageStore
from test_post_norm_factors import C, D, M, _matched, crowded_span


def test_a_store_keeps_arrays_and_pauses_only_past_its_share_of_the_sitting(tmp_path):
    store = StageStore(tmp_path / "run", seconds=1000)
    assert store.get("x") is None and store.resumed == []
    store.put("x", a=np.arange(3.0), n=7)
    got = StageStore(tmp_path / "run").get("x")
    assert np.array_equal(got["a"], np.arange(3.0)) and int(got["n"]) == 7
    store.pause_if_due("early")  # 1000 s left
    with pytest.raises(Paused, match="later: paused"):
        store.pause_if_due("later", share=1.01)
    StageStore(tmp_path / "run", seconds=0).pause_if_due("nothing saved yet")  # a sitting always moves the run on
    free = StageStore(tmp_path / "free")
    free.put("y", a=np.zeros(1))
    free.pause_if_due("never", share=1.0)  # no deadline: never paused


def test_the_factor_search_paused_at_its_deadline_resumes_from_the_factors_it_saved(tmp_path):
    """A sitting of no time stops after its first batch with that batch's factors saved; the next sitting keeps them
    (first rows unchanged), continues the count of starts and completes the set — every factor true."""
    B, U, Wt, At = crowded_span(0)
    rng = np.random.default_rng(0)
    with pytest.raises(Paused, match=f"of m = {M} factors after 16 starts"):
        all_factors(B, U, M, rng, StageStore(tmp_path, seconds=0))
    first = StageStore(tmp_path).get("factors")
    assert int(first["starts"]) == 16 and 0 < len(first["W"]) < M
    store = StageStore(tmp_path)
    W, A = all_factors(B, U, M, rng, store)
    assert np.array_equal(W[:len(first["W"])], first["W"]) and int(store.get("factors")["starts"]) > 16
    assert len(W) == M and _matched(W, A, Wt, At).all() and factors_complete(B, W, A, U)[0]
    assert D * C > M  # the synthetic span's shape (d = 24, C = 6, m = 48)


@pytest.mark.slow
def test_a_bert_layer_read_in_sittings_through_the_probe_route_within_the_claim(tmp_path, monkeypatch):
    """``extract_block`` with a store of no time on a d = 12 ``BertLayer`` through probes: every sitting saves one
    step and pauses; resumed until done, the check passes within the claim and the last sitting only loaded the
    stages before the polish (~40 s)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from post_norm import tiny_bert_layer

    from attnprobe.learners.block import post_norm_learner
    from attnprobe.learners.block.learner import extract_block
    from attnprobe.oracles.hf_block import block_model
    from test_post_norm_learner import _oracle

    monkeypatch.setattr(post_norm_learner, "NEURON_NUMBERS", 0)
    truth = block_model(tiny_bert_layer(tmp_path / "b12", d=12, heads=1))
    sittings = 0
    while True:
        sittings += 1
        try:
            res = extract_block(_oracle(truth), heads=1, hidden=truth.ffn.W1.shape[0],
                                store=StageStore(tmp_path / "run", seconds=0))
            break
        except Paused:
            assert sittings < 200
    assert res.passed and res.check.error < post_norm_learner.CLAIM and sittings > 3
    assert {"prep", "attention", "ffn"} <= set(res.details["resumed"])  # the neurons are in the block ffn saved


@pytest.mark.slow
def test_the_probe_route_paused_after_every_step_reads_every_true_neuron(tmp_path):
    """``probe_neurons`` with a store of no time: each sitting saves one step (the span, each factor batch, each
    direction block) and pauses; resumed until done it reads the d = 16 layer's neurons as one run does (~40 s)."""
    torch = pytest.importorskip("torch")  # noqa: F841
    pytest.importorskip("transformers")
    from attnprobe.learners.block.post_norm import first_norm_centre, first_norm_input, output_norm
    from attnprobe.learners.block.post_norm_probe_neurons import probe_neurons
    from attnprobe.oracles.hf_block import block_model, hf_block, oracle_from_hf_block
    from test_post_norm_stages import moved_norms_bert_dir

    folder = moved_norms_bert_dir(tmp_path / "bert", 16, 2)
    oracle, m = oracle_from_hf_block(folder, 1), block_model(hf_block(folder, 1))
    rows, rng = oracle.answer_rows, np.random.default_rng(0)
    n2 = output_norm(rows, m.d, rng)
    affine = first_norm_input(rows, first_norm_centre(rows, m.d, rng), rng)
    sittings = 0
    while True:
        sittings += 1
        try:
            A, a, details = probe_neurons(rows, affine, n2, m.m, np.random.default_rng([3, sittings]),
                                          StageStore(tmp_path / "run", seconds=0))
            break
        except Paused:
            assert sittings < 200
    assert sittings > 3  # the factors and the directions were resumed, not read in one sitting
    P = np.eye(m.d) - 1.0 / m.d
    At, at = (m.ffn.W1 * m.norm1_w) @ P, m.ffn.W1 @ m.norm1_b + m.ffn.b1
    hit = set()
    for row, bias in zip(A, a):
        i = int(np.argmin(np.linalg.norm(At - row, axis=1)))
        hit.add(i)
        assert np.linalg.norm(row - At[i]) < 1e-6 * np.linalg.norm(At[i]) and abs(bias - at[i]) < 1e-6
    assert len(hit) == m.m and details["curve_misfit"] < 1e-6


def test_a_stages_folder_is_bound_to_its_block_and_setting(tmp_path):
    """:meth:`StageStore.bind`: the first sitting saves the block's answer to one fixed sequence and the setting; a
    later sitting of the same block passes, another block (answers 1e-6 apart), another setting or a folder of other
    files is refused in one line — a stage of another block is never loaded."""
    from attnprobe.errors import ConfigError

    W = np.random.default_rng(0).standard_normal((6, 6))

    def rows_of(A):
        return lambda X: np.tanh(X @ A)

    asked = [100]
    store = StageStore(tmp_path / "run")
    store.bind(rows_of(W), 6, {"heads": 2, "hidden": 12, "seed": 0}, count=lambda: asked[0])
    assert not store.saved  # the fingerprint is no stage: a sitting must still save one before it may pause
    asked[0] = 130
    store.put("prep", x=np.ones(2))
    asked[0] = 170  # asked after the last save: not in the ledger
    again = StageStore(tmp_path / "run")
    again.bind(rows_of(W), 6, {"heads": 2, "hidden": 12, "seed": 0}, count=lambda: asked[0])
    asked[0] += 5
    assert again.queries() == 30 + 5  # the earlier sitting's 30 up to its save, this one's 5
    with pytest.raises(ConfigError, match="made from another block") as exc:
        StageStore(tmp_path / "run").bind(rows_of(W + 1e-6), 6, {"heads": 2, "hidden": 12, "seed": 0})
    assert exc.value.param == "stages" and "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="made with seed = 0, not 1"):
        StageStore(tmp_path / "run").bind(rows_of(W), 6, {"heads": 2, "hidden": 12, "seed": 1})
    with pytest.raises(ConfigError, match="width 6, not 5"):
        StageStore(tmp_path / "run").bind(rows_of(W[:5, :5]), 5, {"heads": 2, "hidden": 12, "seed": 0})
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds files but no fingerprint"):
        StageStore(tmp_path / "model").bind(rows_of(W), 6, {"heads": 2, "hidden": 12, "seed": 0})
