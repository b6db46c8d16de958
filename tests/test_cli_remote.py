"""``attnprobe serve`` and ``extract --url/--log/--replay`` through the CLI entry point (server on 127.0.0.1)."""

import json

import numpy as np
import pytest

pytest.importorskip("fastapi")

from attnprobe.cli import build_parser, main  # noqa: E402
from attnprobe.cli.serve import build_from_args  # noqa: E402
from attnprobe.models.io import save_model  # noqa: E402
from attnprobe.service.server import BackgroundServer  # noqa: E402
from attnprobe.targets.random_heads import random_head  # noqa: E402


@pytest.fixture
def served_float32(tmp_path, monkeypatch):
    target = tmp_path / "head.npz"
    save_model(random_head(8, seed=9), target)
    monkeypatch.setenv("ATTNPROBE_API_KEY", "k-123")
    args = build_parser().parse_args(["serve", "--target", str(target), "--dtype", "float32", "--max-batch", "16",
                                      "--budget", "100000"])
    app, options = build_from_args(args)
    assert options.d == 8 and options.max_batch == 16
    with BackgroundServer(app) as srv:
        yield srv, tmp_path


def test_extract_url_reads_float32_logs_and_replays(served_float32, capsys):
    srv, tmp = served_float32
    assert main(["extract", "--url", srv.url, "--log", str(tmp / "q.sqlite"), "--out", str(tmp / "a.npz"),
                 "--quiet"]) == 0
    first = json.loads((tmp / "a.json").read_text())
    o = first["details"]["oracle"]
    assert o["precision"] == "float32" and o["precision_source"] == "detected from the answers"
    assert o["queries_asked"] == o["queries_total"] > first["queries"] and o["queries_from_log"] == 0
    assert first["check"]["passed"]
    assert main(["extract", "--log", str(tmp / "q.sqlite"), "--replay", "--out", str(tmp / "b.npz"), "--quiet"]) == 0
    again = json.loads((tmp / "b.json").read_text())["details"]["oracle"]
    assert again["queries_asked"] == 0 and again["queries_from_log"] == o["queries_total"]
    a, b = np.load(tmp / "a.npz"), np.load(tmp / "b.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a.files)
    # replay of a method whose queries the log lacks: one line, exit 2, says what was spent
    capsys.readouterr()
    assert main(["extract", "--log", str(tmp / "q.sqlite"), "--replay", "--method", "lowrank", "--out",
                 str(tmp / "c.npz"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "lacks" in err and "0 queries spent (replay" in err and "q.sqlite" in err and err.count("\n") == 1


def test_cli_refusals_are_one_line(served_float32, capsys, monkeypatch):
    srv, tmp = served_float32
    cases = [
        (["--url", srv.url, "--api-key", "wrong"], "refused the API key"),
        (["--replay"], "--replay answers from a query log"),
        (["--target", str(tmp / "head.npz"), "--api-key", "x"], "--api-key goes with --url"),
        (["--url", srv.url, "--target", str(tmp / "head.npz")], "give one oracle"),
        (["--url", srv.url, "--d", "9"], "does not match the width d = 8"),
        (["--url", srv.url, "--budget", "10"], "0 queries spent (not logged)"),
    ]
    for extra, message in cases:
        capsys.readouterr()
        assert main(["extract", *extra, "--out", str(tmp / "x.npz"), "--quiet"]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (extra, err)
    monkeypatch.delenv("ATTNPROBE_API_KEY")
    assert main(["extract", "--url", srv.url, "--out", str(tmp / "x.npz"), "--quiet"]) == 2
    assert "ATTNPROBE_API_KEY" in capsys.readouterr().err


def test_serve_needs_a_key_and_one_target(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ATTNPROBE_API_KEY", raising=False)
    target = tmp_path / "head.npz"
    save_model(random_head(4, seed=1), target)
    assert main(["serve", "--target", str(target)]) == 2
    assert "at least one key" in capsys.readouterr().err
    keyfile = tmp_path / "keys.txt"
    keyfile.write_text("# keys\nalpha\n\nbeta\n")
    args = build_parser().parse_args(["serve", "--target", str(target), "--api-key-file", str(keyfile)])
    app, _ = build_from_args(args)
    assert main(["serve", "--api-key", "k"]) == 2
    assert "say what to serve" in capsys.readouterr().err
