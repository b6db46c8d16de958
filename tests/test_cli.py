"""The command line, run in-process and as a real subprocess (for the no-traceback contract)."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from attnprobe.cli import main
from attnprobe.models import load_model, save_model
from attnprobe.targets import random_head
from conftest import rel


def test_extract_from_target_file_and_verify(tmp_path, capsys):
    truth = random_head(12, seed=5, zero_v=2)
    target = save_model(truth, tmp_path / "t.npz")
    out = tmp_path / "res.npz"
    assert main(["extract", "--target", str(target), "--out", str(out), "--quiet"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["method"] == "exact" and summary["d"] == 12
    assert summary["queries"] >= 12 * 12 + 2 * 12 + 1
    assert summary["check"]["relative_error"] < 1e-9 and summary["check"]["passed"]
    assert summary["seconds"] > 0
    got = load_model(out)
    assert rel(got.W, truth.W) < 1e-9 and rel(got.u, truth.u) < 1e-9
    capsys.readouterr()
    assert main(["verify", "--target", str(target), "--result", str(out), "--json", str(tmp_path / "e.json")]) == 0
    printed = capsys.readouterr().out
    assert "W" in printed and "relative error" in printed
    errs = json.loads((tmp_path / "e.json").read_text())
    assert set(errs) == {"W", "v", "u", "c"} and max(errs.values()) < 1e-9


def test_extract_paper_model_with_basis_probes(tmp_path):
    truth = random_head(7, seed=1, bias=False)
    target = save_model(truth, tmp_path / "t.npz")
    out = tmp_path / "r.npz"
    assert main(["extract", "--target", str(target), "--probes", "basis", "--no-bias", "--out", str(out),
                 "--quiet"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["queries"] == 7 + 49
    assert summary["details"]["probes"] == "basis"


def test_extract_from_module_attr(tmp_path, monkeypatch):
    truth = random_head(6, seed=8)
    save_model(truth, tmp_path / "head.npz")
    (tmp_path / "victim.py").write_text(textwrap.dedent("""
        from attnprobe.models import load_model
        head = load_model(__file__.replace("victim.py", "head.npz"))
        def answer(X):
            return head(X)
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "o.npz"
    assert main(["extract", "--oracle", "victim:answer", "--d", "6", "--out", str(out), "--quiet"]) == 0
    assert rel(load_model(out).W, truth.W) < 1e-9


def test_float32_target_file(tmp_path):
    truth = random_head(16, seed=2)
    target = save_model(truth, tmp_path / "t.npz")
    out = tmp_path / "r.npz"
    assert main(["extract", "--target", str(target), "--dtype", "float32", "--out", str(out), "--quiet"]) == 0
    assert 1e-9 < rel(load_model(out).W, truth.W) < 1e-4


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "attnprobe", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("args, message", [
    (["extract", "--out", "x.npz"], "say what to extract"),
    (["extract", "--target", "missing.npz", "--out", "x.npz"], "does not exist"),
    (["extract", "--oracle", "nomodule_zz:f", "--d", "3", "--out", "x.npz"], "cannot import"),
    (["extract", "--target", "t.npz", "--budget", "10", "--out", "x.npz"], "budget"),
    (["extract", "--target", "zero.npz", "--out", "x.npz"], "v = 0"),
    (["extract", "--target", "t.npz", "--method", "magic", "--out", "x.npz"], "unknown --method"),
    (["extract", "--target", "t.npz", "--method", "lowrank", "--probes", "basis", "--out", "x.npz"],
     "single probe design"),
])
def test_errors_are_one_line_without_traceback(tmp_path, args, message):
    save_model(random_head(4, seed=0), tmp_path / "t.npz")
    m = random_head(4, seed=0)
    save_model(type(m)(m.W, np.zeros(4), m.u, 0.3), tmp_path / "zero.npz")
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnprobe: error:") and message in lines[0]
    assert not (tmp_path / "x.npz").exists()


def test_target_command_and_demo(tmp_path):
    proc = run_cli("target", "random", "--d", "5", "--zero-v", "1", "--out", "r.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (load_model(tmp_path / "r.npz").v == 0).sum() == 1
    proc = run_cli("demo", "--layer", "1", "--head", "2", "--quiet", "--out", "demo.npz", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "MiniLM-L6 layer 1 head 2" in proc.stdout and "W: relative error" in proc.stdout
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert summary["d"] == 384 and summary["queries"] <= 1.02 * (384 * 384 + 2 * 384 + 1)
