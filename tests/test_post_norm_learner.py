"""The post-norm (BERT) block learner (``learners/block/post_norm_learner.py``) chained in ``extract_block``: a
transformers ``BertLayer`` from its answers alone within the claim against the true block (slow), the claim held by
the every-position check (a perturbed block fails it), and the one-line refusals where the chain does not run."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.block.learner import CHECK_LENGTHS, every_position_check, extract_block
from attnprobe.learners.block.post_norm_learner import CLAIM, NEURON_NUMBERS, PROBE_NEURONS
from attnprobe.oracles import Oracle
from attnprobe.targets.block import random_llama_block


def _post_norm(d=16, hidden=32, eps=1e-12):
    blk = random_llama_block(d, 2, 1, hidden, seed=0)
    b = np.random.default_rng(2).standard_normal((2, d)) * 0.1
    return dataclasses.replace(blk, layout="post", norm="layer", norm1_b=b[0], norm2_b=b[1], eps=eps)


def _oracle(block):
    def answers(X):
        return block.every_position(X)
    answers.positions = "positional"  # declared, as a served block does
    return Oracle(answers, block.d, outputs=block.d, precision="float64")


@pytest.mark.parametrize("hidden, cause", [(None, "stage neurons reads the FFN's first layer given its width"),
                                           (40000, "stage neurons not run at d = 16, m = 40000: its span holds")])
def test_a_post_norm_block_beyond_the_neurons_stage_is_refused_before_its_stages(hidden, cause):
    """Without the FFN's width, or past both routes' sizes (4m·d² > NEURON_NUMBERS, m·d > PROBE_NEURONS), the block
    is refused in one line naming the stage and the size, after the 3 queries that told it apart (no stage run)."""
    assert 40000 * 16 > PROBE_NEURONS and 4 * 40000 * 16 * 16 > NEURON_NUMBERS >= 4 * 32 * 16 * 16
    oracle = _oracle(_post_norm())
    with pytest.raises(UnidentifiableError, match="a post-norm block .*: " + cause) as exc:
        extract_block(oracle, heads=2, hidden=hidden)
    assert "\n" not in str(exc.value) and oracle.queries == 3


def test_a_post_norm_estimate_prices_the_post_norm_route_or_refuses_it_in_one_line():
    """A block estimate whose setting declares the post-norm layout prices the post-norm route (not the pre-norm
    learner's plan, 2,536,145 on MiniLM's shape) where it runs (MiniLM: d = 384, m = 1536, through probes), and where
    the neurons stage refuses (m·d past MiniLM's) says so in one line naming that stage, as the run would after its 3
    queries."""
    from attnprobe.errors import ConfigError
    from attnprobe.learners.core.estimate import estimate_queries

    pre = estimate_queries("block", 12, heads=1, hidden=24)
    post = estimate_queries("block", 12, heads=1, hidden=24, layout="post")
    assert "post-norm route" in post.basis and "post-norm" not in pre.basis and post.queries != pre.queries
    assert post.low <= post.queries <= post.high and post.low > 4 * 24 * (2 * 12 + 1)  # at least the neurons' tokens
    from attnprobe.learners.block.post_norm_learner import post_norm_queries

    minilm = estimate_queries("block", 384, heads=12, hidden=1536, layout="post", check=False)
    assert (minilm.low, minilm.queries, minilm.high) == post_norm_queries(384, 12, 1536)
    with pytest.raises(ConfigError, match="refused by the post-norm route .*stage neurons not run at d = 384, "
                                          "m = 1537") as exc:
        estimate_queries("block", 384, heads=12, hidden=1537, layout="post")
    assert "\n" not in str(exc.value)
    assert estimate_queries("block", 384, heads=12, hidden=1536).queries > 0  # undeclared layout: the pre-norm plan


@pytest.mark.parametrize("family, layout", [("bert", "post"), ("llama", "pre")])
def test_an_estimate_of_a_folders_block_is_given_its_layout(tmp_path, family, layout):
    """``extract --estimate --hf-dir DIR --block L`` hands the estimate the block's layout as the folder's family
    declares it (config.json alone), and none without ``--block`` (the fast twin of the CLI test below)."""
    import argparse
    import json

    from attnprobe.cli.hf import block_layout

    (tmp_path / "config.json").write_text(json.dumps({"model_type": family, "hidden_size": 12, "num_attention_heads": 1,
                                                      "num_hidden_layers": 1, "intermediate_size": 24,
                                                      "hidden_act": "gelu" if family == "bert" else "silu"}))
    (tmp_path / "model.safetensors").write_bytes(b"")  # the folder check asks for it; no weights are read
    assert block_layout(argparse.Namespace(hf_dir=str(tmp_path), block=0)) == layout
    assert block_layout(argparse.Namespace(hf_dir=str(tmp_path), block=None)) is None


@pytest.mark.slow
def test_extract_estimate_of_a_bert_folder_block_knows_its_layout(tmp_path, capsys):
    """``extract --estimate --hf-dir DIR --block L`` on a BERT folder printed the pre-norm learner's count: the
    folder's post-norm layout reaches the estimate, which prints the post-norm route's count, or (past both of the
    neurons stage's routes: d = 552, m = 1104, m·d past MiniLM's) exits 2 with its one-line refusal (~8 s: two
    folders saved)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hf_models import tiny_bert_dir

    from attnprobe.cli import main
    from attnprobe.learners.core.estimate import estimate_queries

    small = tiny_bert_dir(tmp_path / "b12", hidden=12, heads=1, layers=1)
    assert main(["extract", "--hf-dir", str(small), "--block", "0", "--estimate"]) == 0
    want = estimate_queries("block", 12, heads=1, hidden=24, layout="post", positions="bidirectional")
    out = capsys.readouterr().out
    assert f"about {want.queries} queries" in out and "post-norm route" in out, out
    wide = tiny_bert_dir(tmp_path / "b552", hidden=552, heads=2, layers=1)  # m·d = 609,408: past the probe route
    assert main(["extract", "--hf-dir", str(wide), "--block", "0", "--estimate"]) == 2
    err = capsys.readouterr().err
    assert "refused by the post-norm route" in err and "m = 1104" in err, err


def test_the_post_norm_claim_is_what_the_check_holds_a_block_to():
    """The every-position check at the post-norm claim: the true block passes, the same block with its second FFN
    layer moved by 1e-3 (relative) fails, and at the pre-norm default claim (1e-6) a 1e-6 move fails too."""
    truth = _post_norm()
    rng = np.random.default_rng(0)
    lengths = CHECK_LENGTHS[:8]
    ok = every_position_check(_oracle(truth), truth, rng, lengths, 2, claim=CLAIM)
    assert ok.passed and ok.error < 1e-12 and ok.tolerance == CLAIM
    for move, claim in ((1e-3, CLAIM), (1e-5, 1e-6)):
        ffn = dataclasses.replace(truth.ffn, W2=truth.ffn.W2 * (1 + move * rng.standard_normal(truth.ffn.W2.shape)))
        bad = every_position_check(_oracle(truth), dataclasses.replace(truth, ffn=ffn), rng, lengths, 2, claim=claim)
        assert not bad.passed and bad.error > claim


@pytest.mark.slow
def test_a_bert_layer_from_its_answers_alone_within_the_claim(tmp_path):
    """A transformers ``BertLayer`` (d = 12, one head, FFN 24, weights N(0, 0.25), norm weights and biases moved):
    ``extract_block`` chains stages 1–7 from every-position answers alone; the check passes within the claim, the
    result answers like the true block on fresh sequences of every length 1 … 64 within the claim, and it is
    saved and loaded as a post-norm block answering the same (measured: 4.3e-8, 6,772 queries, ~20 s)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from post_norm import tiny_bert_layer

    from attnprobe.learners.core.estimate import estimate_queries
    from attnprobe.models.io import load_model
    from attnprobe.oracles.hf_block import block_model

    truth = block_model(tiny_bert_layer(tmp_path / "b12", d=12, heads=1))
    res = extract_block(_oracle(truth), heads=1, hidden=truth.ffn.W1.shape[0])
    assert res.passed and res.check.error < CLAIM and res.check.tolerance == CLAIM
    est = estimate_queries("block", 12, heads=1, hidden=truth.ffn.W1.shape[0], layout="post")
    assert est.low <= res.queries <= est.high, (est, res.queries)  # the estimate brackets the run
    assert set(res.queries_by_phase) >= {"output norm", "first-norm input", "attention", "neurons", "ffn"}
    fresh = every_position_check(_oracle(truth), res.model, np.random.default_rng([7, 1]), CHECK_LENGTHS, 2,
                                 claim=CLAIM)
    assert fresh.passed and fresh.error < CLAIM
    res.save(tmp_path / "r.npz")
    loaded = load_model(tmp_path / "r.npz")
    X = np.random.default_rng(3).standard_normal((2, 9, 12))
    assert loaded.layout == "post" and np.allclose(loaded.every_position(X), res.model.every_position(X), atol=1e-13)


@pytest.mark.slow
def test_a_bert_layer_through_the_probe_route_within_the_claim(tmp_path, monkeypatch):
    """The same layer with the d² route's limit set to 0, so stage neurons runs through probes (the wide layers'
    route): the check passes within the claim and the result answers like the true block on fresh sequences."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from post_norm import tiny_bert_layer

    from attnprobe.learners.block import post_norm_learner
    from attnprobe.oracles.hf_block import block_model

    monkeypatch.setattr(post_norm_learner, "NEURON_NUMBERS", 0)
    truth = block_model(tiny_bert_layer(tmp_path / "b12", d=12, heads=1))
    res = extract_block(_oracle(truth), heads=1, hidden=truth.ffn.W1.shape[0])
    assert res.passed and res.check.error < CLAIM
    fresh = every_position_check(_oracle(truth), res.model, np.random.default_rng([7, 2]), CHECK_LENGTHS, 2,
                                 claim=CLAIM)
    assert fresh.passed and fresh.error < CLAIM


@pytest.mark.slow
def test_extract_hf_dir_block_reads_a_bert_block(tmp_path, capsys):
    """``attnprobe extract --hf-dir DIR --block 1`` on a transformers BERT folder (d = 12, one head, FFN 24): the
    folder names H and the FFN's width, the post-norm chain runs, the check passes (exit 0) and the written result
    answers like the layer at every position (~20 s)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hf_models import tiny_bert_dir

    from attnprobe.cli import main
    from attnprobe.models.io import load_model
    from attnprobe.oracles.hf_block import block_model, hf_block

    folder = tiny_bert_dir(tmp_path / "bert", hidden=12, heads=1, layers=2, seed=4)
    assert main(["extract", "--hf-dir", str(folder), "--block", "1", "--out", str(tmp_path / "r.npz"), "--quiet"]) == 0
    truth = block_model(hf_block(str(folder), 1))
    chk = every_position_check(_oracle(truth), load_model(tmp_path / "r.npz"), np.random.default_rng(5),
                               CHECK_LENGTHS, 1, claim=CLAIM)
    assert chk.passed and chk.error < CLAIM


def test_the_neurons_stage_runs_through_probes_up_to_the_size_measured_and_names_both_routes_beyond():
    """Past the d² route's size the probe route runs (measured from answers at d = 64, m = 128 and MiniLM's d = 384,
    m = 1536), priced by its plan; past MiniLM's m·d it is refused in one line naming both routes' measured sizes."""
    from attnprobe.learners.block.post_norm_learner import PROBE_NEURONS, neuron_queries, neurons_refusal
    from attnprobe.learners.block.post_norm_probe_neurons import probe_plan

    assert 4 * 128 * 64 * 64 > NEURON_NUMBERS and 1536 * 384 <= PROBE_NEURONS
    assert neurons_refusal(64, 128) is None and neurons_refusal(32, 64) is None and neurons_refusal(384, 1536) is None
    assert neuron_queries(64, 128) == probe_plan(64, 128)[3] and neuron_queries(32, 64) == 4 * 64 * 65
    assert neuron_queries(384, 1536) == probe_plan(384, 1536)[3] == 126_882
    cause = neurons_refusal(384, 1537)
    assert "probe route m·d = 590,208" in cause and "\n" not in cause


@pytest.mark.slow
def test_extract_hf_dir_block_in_sittings_resumes_and_refuses_another_blocks_stages(tmp_path, capsys):
    """``extract --hf-dir DIR --block 1 --stages S --sitting T`` on a BERT folder (d = 12): every sitting pauses with
    exit 75 and one line saying to run again, until the run ends (exit 0) with its check within the claim and the
    stages it resumed named; the same stages folder with another folder's block is refused (exit 2) before any stage
    is loaded, and a sitting without a stages folder is refused before any query (~1 min)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hf_models import tiny_bert_dir

    from attnprobe.cli import main
    from attnprobe.models.io import load_model
    from attnprobe.oracles.hf_block import block_model, hf_block

    folder = tiny_bert_dir(tmp_path / "bert", hidden=12, heads=1, layers=2, seed=4)
    cmd = ["extract", "--hf-dir", str(folder), "--block", "1", "--out", str(tmp_path / "r.npz"), "--quiet",
           "--stages", str(tmp_path / "stages"), "--sitting", "0.001"]
    codes = []
    while not codes or codes[-1] == 75:
        codes.append(main(cmd))
        err = capsys.readouterr().err
        assert len(codes) < 50
        if codes[-1] == 75:
            assert len(err.strip().splitlines()) == 1 and "paused" in err and "run again" in err
    assert codes[-1] == 0 and len(codes) >= 2
    assert any("resumed from" in n for n in json.loads((tmp_path / "r.json").read_text())["notes"])
    truth = block_model(hf_block(str(folder), 1))
    chk = every_position_check(_oracle(truth), load_model(tmp_path / "r.npz"), np.random.default_rng(5),
                               CHECK_LENGTHS, 1, claim=CLAIM)
    assert chk.passed and chk.error < CLAIM
    other = tiny_bert_dir(tmp_path / "other", hidden=12, heads=1, layers=2, seed=5)
    cmd[2], cmd[6] = str(other), str(tmp_path / "r2.npz")
    assert main(cmd) == 2 and "made from another block" in capsys.readouterr().err
    assert not (tmp_path / "r2.npz").exists()
    assert main(cmd[:8] + ["--sitting", "5"]) == 2 and "--stages" in capsys.readouterr().err
