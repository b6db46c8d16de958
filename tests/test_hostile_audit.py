"""Hostile audits: checkpoints that are FIFOs or have the wrong shapes, Ray addresses nobody answers at or where
something else answers, a Ray cluster found on the machine, a journal of another audit in --out. Exit code 2 and one
line, quickly, no file harmed and no empty folder left behind."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hostile import refused

SRC = str(Path(__file__).parents[1] / "src")


def _checkpoint(path, d=8, query_shape=None):
    from safetensors.numpy import save_file

    p = "encoder.layer.0.attention."
    t = {p + "self.query.weight": np.ones(query_shape or (d, d), dtype=np.float32)}
    for name in ("self.key.weight", "self.value.weight", "output.dense.weight"):
        t[p + name] = np.eye(d, dtype=np.float32)
    for name in ("self.query.bias", "self.value.bias", "output.dense.bias"):
        t[p + name] = np.zeros(d, dtype=np.float32)
    save_file(t, str(path))


def test_a_fifo_given_as_checkpoint_is_refused_at_once(tmp_path):
    """Reading a FIFO would block for good (and ignore SIGTERM): refused before it is opened."""
    pytest.importorskip("safetensors")
    os.mkfifo(tmp_path / "model.safetensors")
    env = dict(os.environ, PYTHONPATH=SRC)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "attnprobe", "audit",
                        "--safetensors", str(tmp_path / "model.safetensors"),
                        "--heads-per-layer", "2", "--out", str(tmp_path / "out"), "--quiet"], env=env,
                       capture_output=True, text=True, timeout=60)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "not a regular file" in lines[0], p.stderr
    assert time.monotonic() - t0 < 30 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("shape", [(8,), (8, 4), (2, 4, 8)])
def test_a_query_weight_of_the_wrong_shape_is_refused(tmp_path, capsys, shape):
    pytest.importorskip("safetensors")
    _checkpoint(tmp_path / "m.safetensors", query_shape=shape)
    refused(capsys, tmp_path, "audit", "--safetensors", tmp_path / "m.safetensors", "--heads-per-layer", "2",
            "--out", tmp_path / "out", "--quiet", says="not (hidden, hidden)")


def test_another_tensor_of_the_wrong_shape_is_refused(tmp_path, capsys):
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file, save_file

    _checkpoint(tmp_path / "m.safetensors")
    t = load_file(str(tmp_path / "m.safetensors"))
    t["encoder.layer.0.attention.self.value.bias"] = np.zeros(3, dtype=np.float32)
    save_file(t, str(tmp_path / "m.safetensors"))
    refused(capsys, tmp_path, "audit", "--safetensors", tmp_path / "m.safetensors", "--heads-per-layer", "2",
            "--out", tmp_path / "out", "--quiet", says="self.value.bias")


def test_a_ray_address_nobody_answers_at_is_refused_within_seconds(tmp_path, capsys):
    """Checked with a socket before Ray is imported, so it holds with or without Ray installed."""
    t0 = time.monotonic()
    line = refused(capsys, tmp_path, "audit", "--model", "minilm", "--layers", "0", "--heads", "0", "--ray",
                   "127.0.0.1:1", "--out", tmp_path / "out" / "deep", "--quiet",
                   says="no Ray cluster answers at 127.0.0.1:1")
    assert time.monotonic() - t0 < 20, line
    assert not (tmp_path / "out").exists()  # no empty folder left behind


@pytest.fixture
def not_ray():
    """A server on 127.0.0.1 that accepts connections and answers like an HTTP/1 server, not like Ray's gRPC."""
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(1024)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join(5)
    srv.close()


def test_an_address_that_is_not_a_ray_cluster_is_refused_within_seconds(tmp_path, capsys, not_ray):
    """Ray itself would retry a server that is not its GCS for minutes (measured: over 5 min, printing warnings)."""
    t0 = time.monotonic()
    refused(capsys, tmp_path, "audit", "--model", "minilm", "--layers", "0", "--heads", "0", "--ray", not_ray,
            "--out", tmp_path / "out", "--quiet", says=f"the server at {not_ray} is not a Ray cluster")
    assert time.monotonic() - t0 < 20 and not (tmp_path / "out").exists()


def test_a_bad_hf_dir_leaves_no_folder(tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{not json")
    for folder, says in ((tmp_path / "missing", "does not exist"), (tmp_path / "hf", "config.json")):
        refused(capsys, tmp_path, "audit", "--hf-dir", folder, "--out", tmp_path / "out", "--quiet", says=says)
        assert not (tmp_path / "out").exists()


def test_ray_address_refusals():
    from attnprobe.audit.engines import reachable
    from attnprobe.errors import ConfigError

    for bad, says in (("127.0.0.1:1", "no Ray cluster answers"), ("ray://127.0.0.1:1", "no Ray cluster answers"),
                      ("localhost:http", "HOST:PORT"), ("127.0.0.1:70000", "valid port")):
        with pytest.raises(ConfigError, match=says):
            reachable(bad, timeout=2)
    reachable("auto")  # left to Ray


@pytest.mark.slow
def test_ray_without_an_address_starts_a_private_cluster_even_when_one_is_named(tmp_path, monkeypatch, capsys):
    """RAY_ADDRESS naming a dead cluster (as a stale ray_current_cluster file would): --ray still runs, on a
    private local cluster."""
    pytest.importorskip("ray")
    from hostile import run

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    rc, out, err = run(capsys, "audit", "--model", "minilm", "--layers", "0", "--heads", "0", "--ray", "--workers",
                       "1", "--out", tmp_path / "out", "--quiet")
    assert rc == 0, err
    assert (tmp_path / "out" / "results.json").exists()


def _random_checkpoint(path, d=8, layers=1, seed=0):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    t = {}
    for layer in range(layers):
        p = f"encoder.layer.{layer}.attention."
        for name in ("self.query.weight", "self.key.weight", "self.value.weight", "output.dense.weight"):
            t[p + name] = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
        for name in ("self.query.bias", "self.value.bias", "output.dense.bias"):
            t[p + name] = (0.1 * rng.standard_normal(d)).astype(np.float32)
    save_file(t, str(path))


def _audit(folder, *extra):
    return ("audit", "--safetensors", folder / "m.safetensors", "--heads-per-layer", "2", "--out", folder / "out",
            "--quiet", "--method", "exact", *extra)


@pytest.fixture
def small(tmp_path):
    pytest.importorskip("safetensors")
    _random_checkpoint(tmp_path / "m.safetensors")
    return tmp_path


@pytest.mark.parametrize("extra, says", [
    (["--rank", "0"], "--rank must be at least 1"),
    (["--seed", "-1"], "--seed must be an integer >= 0"),
])
def test_values_every_task_would_fail_on_are_refused_up_front(small, capsys, extra, says):
    refused(capsys, small, *_audit(small, *extra), says=says)


def test_a_budget_below_the_functional_check_is_refused_up_front(small, capsys):
    refused(capsys, small, *_audit(small, "--budget", "5"), says="below the 40 queries of the functional check")


def test_an_audit_where_every_task_fails_does_not_exit_0(small, capsys, monkeypatch):
    """Every task failing on something other than the attacker's budget (a finding) ends with exit 2."""
    from attnprobe.audit import run as audit_run
    from attnprobe.audit.tasks import failed_record
    from hostile import one_line, run

    def unlucky(tasks, on_result, workers=1):  # an engine on which every task fails
        records = [failed_record(t, "RecoveryError: no luck") for t in tasks]
        for i, rec in enumerate(records):
            on_result(i, rec)
        return records, False

    monkeypatch.setitem(audit_run.ENGINES, "processes", unlucky)
    rc, _, err = run(capsys, *_audit(small))
    assert rc == 2 and "every one of the 2 tasks failed" in one_line(err) and "no luck" in err
    assert (small / "out" / "results.json").exists()  # what was tried is still reported


def test_a_refusal_after_the_folder_is_claimed_removes_what_it_created(small, capsys, monkeypatch):
    """The Ray engine refusing once the audit has claimed --out (Ray missing, a cluster that cannot be joined):
    exit 2, one line, and neither out/ nor out/heads/ is left behind; an existing --out keeps its files."""
    from attnprobe.audit import run as audit_run
    from attnprobe.errors import ConfigError

    def no_ray(tasks, on_result, address=None, workers=None):
        raise ConfigError("--ray needs Ray: pip install 'attnprobe[ray]'")

    monkeypatch.setitem(audit_run.ENGINES, "ray", no_ray)
    out = small / "new" / "out"
    refused(capsys, small, *_audit(small, "--ray"), says="--ray needs Ray")
    refused(capsys, small, "audit", "--safetensors", small / "m.safetensors", "--heads-per-layer", "2", "--ray",
            "--out", out, "--quiet", "--method", "exact", says="--ray needs Ray")
    assert not (small / "out").exists() and not (small / "new").exists()
    (small / "kept").mkdir()
    (small / "kept" / "notes.txt").write_text("mine")
    refused(capsys, small, "audit", "--safetensors", small / "m.safetensors", "--heads-per-layer", "2", "--ray",
            "--out", small / "kept", "--quiet", "--method", "exact", says="--ray needs Ray")
    assert sorted(p.name for p in (small / "kept").iterdir()) == ["notes.txt"]


def test_a_journal_of_another_model_or_other_settings_is_refused(small, capsys):
    """A rerun into a folder whose finished.jsonl records another model (same file name, other weights) or other
    settings would drop its tasks and their head files: refused in one line, nothing touched; --fresh replaces."""
    from hostile import run

    rc, _, err = run(capsys, *_audit(small, "--seed", "1"))
    assert rc == 0, err
    (small / "out" / "heads" / "L7H7.npz").write_bytes(b"from an older audit, not in the journal")
    refused(capsys, small, *_audit(small, "--seed", "2"), says="with other seed (1 there, 2 here)")
    refused(capsys, small, *_audit(small, "--seed", "1", "--row", "3"), says="with other row (0 there, 3 here)")
    _random_checkpoint(small / "m.safetensors", layers=1, seed=5)  # retrained in place: same name, other weights
    line = refused(capsys, small, *_audit(small, "--seed", "1"), says="of other weights (m.safetensors sha256:")
    assert "give --fresh" in line
    rc, _, err = run(capsys, *_audit(small, "--seed", "1", "--fresh"))
    assert rc == 0, err
    assert json.loads((small / "out" / "results.json").read_text())["resumed"] == 0
    # --fresh replaces what the audit wrote; a file no audit recorded writing stays as it was
    assert sorted(p.name for p in (small / "out" / "heads").iterdir()) == ["L0H0.npz", "L0H1.npz", "L7H7.npz"]
    assert (small / "out" / "heads" / "L7H7.npz").read_bytes() == b"from an older audit, not in the journal"


def test_out_that_is_a_file_or_empty_is_refused(small, capsys, monkeypatch):
    (small / "out").write_text("keep me")
    refused(capsys, small, *_audit(small), says="is not a folder")
    monkeypatch.chdir(small)  # an empty --out would have meant the current folder
    refused(capsys, small, "audit", "--safetensors", "m.safetensors", "--heads-per-layer", "2", "--out", "",
            "--quiet", says="got ''")


def test_a_second_audit_into_a_busy_folder_is_refused_and_a_rerun_keeps_files_it_did_not_write(small, capsys):
    from attnprobe.cli.audit import claimed_folder
    from hostile import run

    out = small / "out"
    (out / "heads").mkdir(parents=True)
    (out / "heads" / "L9H9.npz").write_bytes(b"from an earlier audit")
    with claimed_folder(out):
        refused(capsys, small, *_audit(small), says="another audit")
        assert (out / "heads" / "L9H9.npz").exists()  # a refused audit touches nothing
    rc, _, err = run(capsys, *_audit(small))
    assert rc == 0, err
    assert sorted(p.name for p in (out / "heads").iterdir()) == ["L0H0.npz", "L0H1.npz", "L9H9.npz"]
    assert (out / "heads" / "L9H9.npz").read_bytes() == b"from an earlier audit"
    assert not (out / ".audit.lock").exists()


def test_a_head_that_cannot_be_saved_is_a_failed_task_and_results_are_still_written(small, capsys, monkeypatch):
    import json

    from attnprobe.audit import run as audit_run
    from attnprobe.errors import ConfigError
    from hostile import run

    real = audit_run.save_model

    def full_disk(model, path):
        if Path(path).name == "L0H0.npz":
            raise ConfigError(f"cannot write {path}: No space left on device; existing files were left unchanged")
        return real(model, path)

    monkeypatch.setattr(audit_run, "save_model", full_disk)
    rc, _, err = run(capsys, *_audit(small))
    assert rc == 0, err  # one head saved: the audit did its job, the other head is a failed task
    heads = {h["head"]: h for h in json.loads((small / "out" / "results.json").read_text())["heads"]}
    assert heads[0]["file"] is None and "No space left" in heads[0]["error"]
    assert heads[1]["file"] == "heads/L0H1.npz" and not heads[1]["error"]
