"""A whole block served over HTTP (``serve --hf-dir DIR --block L``, real uvicorn on 127.0.0.1) and attacked with
``extract --url``: the same answers and the same outcome as in process; ``--method block`` without ``--heads``
refused in one line."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("transformers")

from attnprobe.cli import build_parser, main  # noqa: E402
from attnprobe.cli.serve import build_from_args  # noqa: E402
from attnprobe.oracles.hf_block import oracle_from_hf_block  # noqa: E402
from attnprobe.oracles.http import oracle_from_url  # noqa: E402
from attnprobe.service.server import BackgroundServer  # noqa: E402
from attnprobe.targets.block_folders import llama_block_folder  # noqa: E402
from hf_models import tiny_family_dir  # noqa: E402


@pytest.fixture(scope="module")
def served_llama(tmp_path_factory):
    folder = tiny_family_dir(tmp_path_factory.mktemp("llama"), "llama", hidden=32, heads=4, kv_heads=2)
    args = build_parser().parse_args(["serve", "--hf-dir", str(folder), "--block", "1", "--api-key", "k-1",
                                      "--budget", "1000", "--max-batch", "64"])
    app, options = build_from_args(args)
    assert options.d == 32 and options.outputs == 32 and options.every_position
    with BackgroundServer(app) as srv:
        yield srv, folder


def test_served_block_answers_every_position_bit_for_bit(served_llama):
    srv, folder = served_llama
    remote = oracle_from_url(srv.url, "k-1")
    local = oracle_from_hf_block(folder, 1)
    X = np.random.default_rng(0).standard_normal((5, 11, 32))
    a, b = remote.answer_rows(X), local.answer_rows(X)
    assert a.shape == (5, 11, 32) and np.array_equal(a, b)
    # the remote oracle first reads what its rows are (a probe of 3 sequences); the local one is told
    assert local.queries == 5 and remote.queries == 5 + remote.queries_by_phase.get("positions", 0)
    assert remote.fn.usage()["queries"] == remote.queries


def test_method_block_without_heads_is_refused_in_one_line_before_any_query(served_llama, capsys, tmp_path):
    """Over a URL nothing names H: refused before any query. A folder's config.json names it (``--hf-dir DIR
    --block L`` reads it), so there the learner starts — and this folder's block, which has attention biases, is
    refused as biased, not for want of --heads."""
    srv, folder = served_llama
    before = oracle_from_url(srv.url, "k-1").fn.usage()["queries"]
    capsys.readouterr()
    assert main(["extract", "--url", srv.url, "--api-key", "k-1", "--method", "block", "--out",
                 str(tmp_path / "r.npz"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--method block needs --heads" in err
    assert oracle_from_url(srv.url, "k-1").fn.usage()["queries"] == before
    assert main(["extract", "--hf-dir", str(folder), "--block", "1", "--out", str(tmp_path / "r.npz"), "--quiet"]) == 2
    err = capsys.readouterr().err  # the whole block's default method is block
    assert err.count("\n") == 1 and "--heads" not in err and "biases" in err
    assert not (tmp_path / "r.json").exists()


def test_extract_url_on_the_served_block_matches_in_process(served_llama, capsys, tmp_path):
    """A learner that does not model blocks fails the same way, with the same queries, over HTTP and in process."""
    srv, folder = served_llama
    outcomes = []
    # the URL's precision and rows declared, as the in-process victim declares them (no probe queries)
    for source in (["--url", srv.url, "--api-key", "k-1", "--answer-precision", "float64", "--positions",
                    "positional"], ["--hf-dir", str(folder), "--block", "1"]):
        capsys.readouterr()
        code = main(["extract", *source, "--method", "ffn", "--hidden", "8", "--budget", "400", "--quiet",
                     "--out", str(tmp_path / "f.npz")])
        outcomes.append((code, capsys.readouterr().err.strip()))
    (code_http, err_http), (code_local, err_local) = outcomes
    assert code_http == code_local == 2 and err_http == err_local and "queries spent" in err_http


def test_served_block_refusals(tmp_path, capsys):
    folder = tiny_family_dir(tmp_path / "bert", "bert", hidden=16, heads=2)
    for argv, msg in [(["serve", "--hf-dir", str(folder), "--api-key", "k"], "needs --block L"),
                      (["serve", "--hf-dir", str(folder), "--block", "5", "--api-key", "k"], "--block must be in 0..1"),
                      (["serve", "--block", "0", "--target", "x.npz", "--api-key", "k"], "--block goes with --hf-dir"),
                      (["extract", "--hf-dir", str(folder), "--block", "0", "--layer", "0", "--method", "multihead",
                        "--out", str(tmp_path / "o.npz")],
                       "drop --layer"),
                      (["extract", "--block", "0", "--d", "4", "--oracle", "m:f", "--out", str(tmp_path / "o.npz")],
                       "--block goes with --hf-dir")]:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, (argv, err)


def test_a_saved_block_answers_and_serves_like_the_block(served_llama, tmp_path, monkeypatch):
    """``load_model`` of a block file answers every position like the layer module, in process and served."""
    from attnprobe.models import save_model
    from attnprobe.oracles import oracle_from_file
    from attnprobe.oracles.hf_block import block_model, hf_block

    _, folder = served_llama
    path = save_model(block_model(hf_block(folder, 1)), tmp_path / "block.npz")
    local = oracle_from_file(str(path))
    X = np.random.default_rng(3).standard_normal((2, 9, 32))
    truth = oracle_from_hf_block(folder, 1).answer_rows(X)
    assert local.positions == "positional" and np.abs(local.answer_rows(X) - truth).max() <= 1e-12 * np.abs(truth).max()
    monkeypatch.setenv("ATTNPROBE_API_KEY", "k-2")
    app, options = build_from_args(build_parser().parse_args(["serve", "--target", str(path)]))
    assert options.every_position and options.outputs == 32
    with BackgroundServer(app) as srv:
        assert np.array_equal(oracle_from_url(srv.url, "k-2").answer_rows(X), local.answer_rows(X))


@pytest.mark.slow
def test_method_block_over_http_gives_the_in_process_result(tmp_path, capsys):
    """``extract --url --method block`` on ``serve --hf-dir DIR --block 1`` (real uvicorn): the same arrays, the same
    queries and the same check as ``extract --hf-dir DIR --block 1`` in process, and the check passes (minutes)."""
    import json

    folder = llama_block_folder(tmp_path / "llama")
    args = build_parser().parse_args(["serve", "--hf-dir", str(folder), "--block", "1", "--api-key", "k-1",
                                      "--budget", "1000000", "--max-batch", "4096", "--max-length", "1024"])
    app, _ = build_from_args(args)
    learner = ["--method", "block", "--heads", "2", "--hidden", "64", "--quiet"]
    with BackgroundServer(app) as srv:
        assert main(["extract", "--url", srv.url, "--api-key", "k-1", "--answer-precision", "float64",
                     "--positions", "positional", *learner, "--out", str(tmp_path / "http.npz")]) == 0
    local = ["extract", "--hf-dir", str(folder), "--block", "1", *learner, "--out", str(tmp_path / "local.npz")]
    assert main(local) == 0
    a, b = np.load(tmp_path / "http.npz"), np.load(tmp_path / "local.npz")
    assert sorted(a.files) == sorted(b.files)
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    ja, jb = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("http", "local"))
    assert ja["queries"] == jb["queries"] and ja["check"]["relative_error"] == jb["check"]["relative_error"]
    assert ja["passed"] and ja["check"]["relative_error"] < 1e-6
    # load_model(result) answers like the block at every position of fresh sequences, every length up to 64
    from attnprobe.models.io import load_model

    model, victim = load_model(tmp_path / "http.npz"), oracle_from_hf_block(folder, 1)
    rng = np.random.default_rng(9)
    for N in (1, 2, 5, 17, 64):
        X = rng.standard_normal((4, N, 32))
        y = victim.answer_rows(X)
        assert np.abs(model.every_position(X) - y).max() < 1e-6 * np.abs(y - X).max()


def learner_form(block):
    """``block`` as the block learner returns it: norm weights folded into the projections (1), the logit scale in
    ``W_Q``, every query head with its own copy of its group's keys and values, each RoPE pair's ``(W_Q, W_K)`` in
    another gauge (a scaled rotation of the pair, which leaves every logit unchanged)."""
    from attnprobe.models.block import fold_norm_weights
    from attnprobe.models.positional import PositionalAttention

    f = fold_norm_weights(block)
    a = f.attention
    H, dh = a.H, a.head_dim
    h = dh // 2
    rng = np.random.default_rng(4)
    Wq, Wk = a.scale * a.Wq.copy(), np.stack([a.Wk[a.group(i)] for i in range(H)])
    for i in range(H):  # per pair: q ↦ c·R(φ) q, k ↦ R(φ) k / c keeps qᵀ R(δ) k
        for k in range(h):
            phi, c = rng.uniform(0, 2 * np.pi), rng.uniform(0.5, 2)
            R = np.array([[np.cos(phi), -np.sin(phi)], [np.sin(phi), np.cos(phi)]])
            Wq[i, [k, k + h]] = c * R @ Wq[i, [k, k + h]]
            Wk[i, [k, k + h]] = R @ Wk[i, [k, k + h]] / c
    att = PositionalAttention(Wq, Wk, np.stack([a.Wv[a.group(i)] for i in range(H)]), a.Wo, bo=a.bo,
                              position="rope", inv_freq=a.inv_freq, layout="half", scale=1.0, causal=True)
    return dataclasses.replace(f, attention=att)


def test_export_writes_a_learned_form_block_back_as_the_familys_layer(tmp_path, capsys):
    """``export`` of a block result (the learner's form: norm weights 1, heads in another RoPE gauge, KV groups
    unshared) writes a LLaMA folder whose layer answers like the victim's at every position, all layers or one;
    a result whose ε is not the folder's is refused in one line."""
    from attnprobe.models import save_model
    from attnprobe.oracles.hf_block import block_model, hf_block

    folder = llama_block_folder(tmp_path / "llama")
    truth = block_model(hf_block(folder, 1))
    assert np.abs(truth.norm1_w - 1).max() > 0.1  # the folding matters
    result = learner_form(truth)
    path = save_model(result, tmp_path / "block.npz")
    victim = oracle_from_hf_block(folder, 1)
    X = np.random.default_rng(5).standard_normal((3, 17, 32))
    y = victim.answer_rows(X)
    assert np.abs(result.every_position(X) - y).max() < 1e-12 * np.abs(y - X).max()
    for layers, at in (([], 1), (["--layers", "1"], 0)):
        out = tmp_path / f"out{at}"
        assert main(["export", "--result", str(path), "--hf-dir", str(folder), "--layer", "1", "--out", str(out),
                     *layers]) == 0
        assert "holds the recovered block" in capsys.readouterr().out
        got = oracle_from_hf_block(out, at).answer_rows(X)
        assert np.abs(got - y).max() < 1e-12 * np.abs(y - X).max()
    off = save_model(dataclasses.replace(result, eps=2e-6), tmp_path / "off.npz")
    assert main(["export", "--result", str(off), "--hf-dir", str(folder), "--layer", "1",
                 "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "ε" in err and "rms_norm_eps" in err and len(err.strip().splitlines()) == 1
