"""Hostile use of the command line: a failed check is exit 3 and writes nothing; bad options are one line and
exit 2 before any query; every message that ends a run says how many queries were spent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnprobe.models import AttentionHead, load_model, save_model
from attnprobe.targets import random_head
from hostile import one_line, refused, run, snapshot


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder with a biased head ``t.npz`` and a head ``u.npz`` whose only bias is u; the cwd."""
    h = random_head(6, seed=3)
    save_model(h, tmp_path / "t.npz")
    save_model(AttentionHead(h.W, h.v, h.u, 0.0), tmp_path / "u.npz")
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------- defect 1: a failed check is exit 3
@pytest.mark.parametrize("argv", [
    ["--target", "u.npz", "--no-bias"],                                   # the model class drops u: W 99 % wrong
    ["--target", "t.npz", "--method", "transformer"],                     # an attention head is no transformer
    ["--target", "t.npz", "--method", "ffn"],
    ["--target", "t.npz", "--method", "robust", "--probes", "paper", "--w-bound", "3", "--margin", "0.01"],
])
def test_failed_check_exits_3_and_writes_nothing(folder, capsys, argv):
    line = refused(capsys, folder, "extract", *argv, "--out", "o.npz", "--quiet", code=3, says="check failed")
    assert "tolerance" in line and "nothing written" in line and "queries spent (not logged)" in line
    assert not (folder / "o.npz").exists() and not (folder / "o.json").exists()


def test_failed_check_nuclear_too_few_measurements(folder, capsys):
    pytest.importorskip("cvxpy")
    refused(capsys, folder, "extract", "--target", "t.npz", "--method", "nuclear", "--rank", "2", "--measurements",
            "10", "--out", "o.npz", "--quiet", code=3, says="functional check error")


def test_keep_failed_writes_the_result_marked_failed(folder, capsys):
    old = {"u.npz": (folder / "u.npz").read_bytes()}
    rc, _, err = run(capsys, "extract", "--target", "u.npz", "--no-bias", "--keep-failed", "--out", "o.npz",
                     "--quiet")
    assert rc == 3 and "written anyway" in one_line(err)
    summary = json.loads((folder / "o.json").read_text())
    assert summary["check"]["passed"] is False and summary["check"]["relative_error"] > summary["check"]["tolerance"]
    assert load_model(folder / "o.npz").d == 6 and (folder / "u.npz").read_bytes() == old["u.npz"]


def test_python_api_returns_the_failed_result(folder):
    from attnprobe import Oracle, extract_exact

    res = extract_exact(Oracle(load_model(folder / "u.npz"), 6), bias=False)
    assert res.check["passed"] is False and res.check["relative_error"] > 0.1


# ---------------------------------------------------------------- defect 3: files never destroyed
@pytest.mark.parametrize("out", ["t.npz", "./t.npz", "t", "sub/../t.npz"])
def test_out_equal_to_target_is_refused_before_any_query(folder, capsys, out):
    (folder / "sub").mkdir()
    line = refused(capsys, folder, "extract", "--target", "t.npz", "--out", out, "--quiet",
                   says="would overwrite the input")
    assert "no queries spent" in line


def test_out_json_next_to_target_is_refused(folder, capsys):
    refused(capsys, folder, "extract", "--target", "t.npz", "--out", "t.json", "--quiet", says="names the .npz file")


def test_out_through_a_symlink_to_the_target_is_refused(folder, capsys):
    (folder / "link.npz").symlink_to(folder / "t.npz")
    refused(capsys, folder, "extract", "--target", "t.npz", "--out", "link.npz", "--quiet",
            says="would overwrite the input")


def test_unwritable_out_is_refused_before_any_query(folder, capsys):
    line = refused(capsys, folder, "extract", "--target", "t.npz", "--out", "/sys/x.npz", "--quiet",
                   says="--out")
    assert "no queries spent" in line
    (folder / "o.json").mkdir()
    refused(capsys, folder, "extract", "--target", "t.npz", "--out", "o.npz", "--quiet", says="not a regular file")


def test_a_full_disk_mid_save_keeps_the_old_files(folder, capsys, monkeypatch):
    """np.savez fails half-way (ENOSPC): the old OUT.npz and OUT.json stay whole and no temporary is left."""
    assert run(capsys, "extract", "--target", "t.npz", "--out", "o.npz", "--quiet")[0] == 0
    before = snapshot(folder)
    real = np.savez

    def full_disk(f, *a, **k):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    rc, _, err = run(capsys, "extract", "--target", "t.npz", "--seed", "1", "--out", "o.npz", "--quiet")
    monkeypatch.setattr(np, "savez", real)
    line = one_line(err)
    assert rc == 2 and "No space left" in line and "queries spent" in line
    assert snapshot(folder) == before
