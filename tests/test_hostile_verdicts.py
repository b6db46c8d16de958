"""A verdict must be right against the truth: a large output bias, a query log of another model and a journal whose
identity line is cut must never turn into "passed" (exit 0) or into reused answers of other weights. Each case:
the exit code, the one stderr line, the files left unharmed, and what the verdict says against the truth."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnprobe.learners.core.check import check_verdict
from attnprobe.models import load_model
from attnprobe.targets import random_head
from hostile import one_line, refused, run

VICTIM = '''
import os
import numpy as np
from attnprobe.models.attention import attention_weights
from attnprobe.targets import random_head

HEAD = random_head(8, seed=1)
C = float(os.environ["VICTIM_BIAS"])
DT = np.dtype(os.environ["VICTIM_DTYPE"])
WINDOW = int(os.environ["VICTIM_WINDOW"])


def answer(X):
    """HEAD attending only to the last WINDOW tokens, answering f + C rounded to DT."""
    Xr = np.asarray(X, dtype=np.float64)[:, -WINDOW:, :]
    a = attention_weights(Xr, HEAD.W, HEAD.u)
    return ((a * (Xr @ HEAD.v)).sum(-1) + C).astype(DT).astype(np.float64)
'''


@pytest.fixture
def victim(tmp_path, monkeypatch):
    (tmp_path / "victim.py").write_text(VICTIM)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _use(monkeypatch, bias, dtype, window):
    import sys

    sys.modules.pop("victim", None)
    monkeypatch.setenv("VICTIM_BIAS", str(bias))
    monkeypatch.setenv("VICTIM_DTYPE", dtype)
    monkeypatch.setenv("VICTIM_WINDOW", str(window))


def _extract(*extra):
    return ("extract", "--oracle", "victim:answer", "--d", "8", "--out", "o.npz", "--quiet", *extra)


# ---------------------------------------------------------------- a large bias hides no wrong model
def test_a_large_bias_does_not_pass_a_wrong_model(victim, capsys, monkeypatch):
    """A sliding-window head (it sees the last 15 tokens) is no single head of the paper's form: the exact
    learner's model is ~3 % off f − c at length 16. With c = 1e3 the float32 answers round at c, which once
    stretched the tolerance to its 10 % cap and passed it; they resolve f − c to ~1e-4, so the check fails it
    against float32's 1.2e-3 (exit 3, nothing written)."""
    _use(monkeypatch, 1e3, "float32", 15)
    line = refused(capsys, victim, *_extract("--answer-precision", "float32"), code=3,
                   says="does not describe the oracle: functional check error")
    error = float(line.split("functional check error ")[1].split()[0])
    assert 1e-2 < error < 0.1  # below the old cap: the case the bias once hid
    assert "a pass certifies 1.2e-03 of f − c" in line and "nothing written" in line
    assert not (victim / "o.npz").exists() and not (victim / "o.json").exists()


def test_float64_answers_rounded_at_a_huge_bias_certify_no_model(victim, capsys, monkeypatch):
    """c = 1e11 in float64 rounds the answers at ~1.5e-5 of f − c, above float64's 1e-6: the same wrong model is
    "not certified" (exit 3), not passed."""
    _use(monkeypatch, 1e11, "float64", 15)
    refused(capsys, victim, *_extract("--answer-precision", "float64"), code=3,
            says="the recovered model is not certified: the answers cannot certify it")


def test_a_large_bias_keeps_a_float32_pass_certifying_1e_3(victim, capsys, monkeypatch):
    """The same head without the window (the paper's form), c = 1e3, float32: passed, and the tolerance a pass
    certifies is float32's (1e4 roundings of f − c, ~1.2e-3), not the 10 % cap; the model is that close to the
    truth on fresh sequences."""
    _use(monkeypatch, 1e3, "float32", 10**6)
    rc, _, err = run(capsys, *_extract("--answer-precision", "float32"))
    assert rc == 0, err
    chk = json.loads((victim / "o.json").read_text())["check"]
    assert chk["passed"] and chk["verdict"] == "passed" and chk["tolerance"] < 2e-3
    assert chk["explained"] == 0.1  # what rounding at c alone would have allowed
    truth = random_head(8, seed=1)
    X = np.random.default_rng(5).standard_normal((64, 16, 8))
    f = truth(X) - truth.c  # the victim answers f without the head's own c, plus 1e3
    assert np.linalg.norm(load_model(victim / "o.npz")(X) - 1e3 - f) <= 2e-3 * np.linalg.norm(f - f.mean())


def test_answers_that_cannot_certify_the_bound_say_so(victim, capsys, monkeypatch):
    """c = 1e11 in float64 rounds the answers at 1.5e-5: even the true head cannot be shown within float64's
    1e-6 of f − c. The verdict is "not certified" (exit 3), not "passed"; --keep-failed writes the result with
    verdict "uncertified" in the JSON."""
    _use(monkeypatch, 1e11, "float64", 10**6)
    line = refused(capsys, victim, *_extract("--answer-precision", "float64"), code=3,
                   says="the recovered model is not certified: the answers cannot certify it: they resolve f − c "
                        "only to")
    assert "within the tolerance 1.0e-06 a pass certifies" in line
    rc, _, err = run(capsys, *_extract("--answer-precision", "float64", "--keep-failed"))
    assert rc == 3 and "written anyway" in one_line(err)
    chk = json.loads((victim / "o.json").read_text())["check"]
    assert chk["verdict"] == "uncertified" and chk["passed"] is False and chk["resolution"] > chk["tolerance"]


@pytest.mark.parametrize("error, resolution, verdict", [
    (1e-4, 1e-6, "passed"), (2e-3, 1e-6, "failed"), (1e-4, 1e-5, "passed"), (5e-4, 1e-3, "uncertified"),
    (1e-3 + 5e-4, 1e-3, "uncertified"), (5e-3, 2e-3, "uncertified"), (0.2, 2e-3, "failed"), (0.05, 1e-5, "failed"),
])
def test_the_verdict_counts_the_answers_resolution(error, resolution, verdict):
    """Tolerance 1e-3, rounding explaining up to 0.1: passed only when the error plus what the answers cannot
    resolve stays within the tolerance; uncertified when the answers cannot tell (the error within their
    resolution of the tolerance, or a resolution above the tolerance and an error rounding explains)."""
    assert check_verdict(error, 1e-3, resolution, 0.1) == verdict


# ---------------------------------------------------------------- a query log of another model is refused
LAYER = '''
import os
import numpy as np
from attnprobe.models.io import load_model

MODEL = load_model(os.environ["VICTIM_FILE"])


def answer(X):
    """The layer's answers, computed in float64 and rounded to float32 (a float32 deployment)."""
    return np.asarray(MODEL(X), dtype=np.float64).astype(np.float32).astype(np.float64)
'''


@pytest.mark.parametrize("seed, factor", [(5, 1.001), (7, 1.001), (1, 1.0001)])
def test_a_log_of_a_float32_layer_with_weights_off_by_a_thousandth_is_refused(tmp_path, capsys, monkeypatch, seed,
                                                                               factor):
    """A log recorded from a float32 two-head layer, resumed against the same layer with every W_h, u_h × 1.001
    (same MODULE:ATTR): the recorded probes asked again differ by ~1e-4 of the answers' scale, ~1,000 float32
    roundings (these seeds once passed a 1e-4 threshold and the run reused ~480 answers of the old layer).
    × 1.0001 differs by ~5e-5 of the scale, still hundreds of roundings: refused too."""
    import sys

    from attnprobe.models.io import save_model
    from attnprobe.models.multihead import MultiHeadAttention
    from attnprobe.targets.multihead import random_multihead

    m = random_multihead(8, 2, seed=seed)
    save_model(m, tmp_path / "old.npz")
    save_model(MultiHeadAttention(factor * m.W, m.v, factor * m.u, m.c), tmp_path / "new.npz")
    (tmp_path / "layer.py").write_text(LAYER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ("extract", "--oracle", "layer:answer", "--d", "8", "--method", "multihead", "--answer-precision",
            "float32", "--log", "q.sqlite", "--quiet")
    monkeypatch.setenv("VICTIM_FILE", "old.npz")
    sys.modules.pop("layer", None)
    rc, _, err = run(capsys, *argv, "--out", "a.npz")
    assert rc == 0, err
    monkeypatch.setenv("VICTIM_FILE", "new.npz")
    sys.modules.pop("layer", None)
    line = refused(capsys, tmp_path, *argv, "--out", "b.npz", says="was recorded from another oracle")
    assert "where their rounding allows" in line and "give a new log file" in line, line
    # the same layer resumes the log (its answers agree to the last bit)
    monkeypatch.setenv("VICTIM_FILE", "old.npz")
    sys.modules.pop("layer", None)
    rc, _, err = run(capsys, *argv, "--out", "c.npz")
    assert rc == 0, err
    a, c = np.load(tmp_path / "a.npz"), np.load(tmp_path / "c.npz")
    assert all(np.array_equal(a[k], c[k]) for k in a.files)  # the recorded answers reused: the same result


# ---------------------------------------------------------------- a journal without its identity is not trusted
def test_an_audit_journal_whose_identity_line_is_cut_is_not_trusted(tmp_path, capsys):
    """Weights replaced at the same path and the journal's first line (the audit's identity: the weights' hash)
    cut short: its records cannot be matched to the new weights, so the rerun is refused (exit 2, one line,
    nothing touched) instead of "resumed 2 of 2" with the old weights' heads; --fresh audits the new weights."""
    pytest.importorskip("safetensors")
    from test_hostile_audit import _audit, _random_checkpoint

    _random_checkpoint(tmp_path / "m.safetensors", seed=0)
    rc, _, err = run(capsys, *_audit(tmp_path))
    assert rc == 0, err
    journal = tmp_path / "out" / "finished.jsonl"
    lines = journal.read_text().splitlines()
    assert json.loads(lines[0])["audit"]["models"]
    journal.write_text("\n".join([lines[0][:40]] + lines[1:]) + "\n")
    _random_checkpoint(tmp_path / "m.safetensors", seed=5)  # other weights, same name
    refused(capsys, tmp_path, *_audit(tmp_path), says="holds finished tasks but no readable identity line")
    # the first line missing altogether says no more about the weights
    journal.write_text("\n".join(lines[1:]) + "\n")
    refused(capsys, tmp_path, *_audit(tmp_path), says="give --fresh to replace it")
    rc, _, err = run(capsys, *_audit(tmp_path, "--fresh"))
    assert rc == 0, err
    assert json.loads((tmp_path / "out" / "results.json").read_text())["resumed"] == 0


# ---------------------------------------------------------------- near ties are merged and named
def _near_tie(gap, seed=0, K=8):
    """Two heads (d = 8) whose (W_h, u_h) differ by ``gap`` per entry, with their own V_h (K × d)."""
    from attnprobe.models.multihead import MultiHeadAttention
    from attnprobe.targets.multihead import random_multihead

    m = random_multihead(8, 2, seed=seed)
    rng = np.random.default_rng(100 + seed)
    W, u = m.W.copy(), m.u.copy()
    W[1] = W[0] + gap * rng.standard_normal((8, 8))
    u[1] = u[0] + gap * rng.standard_normal(8)
    return MultiHeadAttention(W, rng.standard_normal((2, K, 8)) / np.sqrt(8), u, rng.standard_normal(K))


def test_nearly_tied_heads_come_back_merged_and_named(tmp_path, capsys):
    """(W_h, u_h) 1e-8 apart: the answers determine only V_0 + V_1 (the heads' separate value maps once came back
    100-190 % off with exit 0 and no note). Now one head holding the sum, exit 0, a note naming the near tie, and
    the sum right against the truth."""
    from attnprobe.models.io import save_model

    truth = _near_tie(1e-8)
    save_model(truth, tmp_path / "t.npz")
    rc, out, err = run(capsys, "extract", "--target", tmp_path / "t.npz", "--method", "multihead", "--out",
                       tmp_path / "o.npz", "--quiet")
    assert rc == 0, err
    summary = json.loads((tmp_path / "o.json").read_text())
    assert summary["details"]["heads"] == 1 and summary["details"]["near_ties"]
    assert any("attend nearly identically" in n and "Prop. 7.1" in n for n in summary["notes"])
    got = load_model(tmp_path / "o.npz")
    assert np.linalg.norm(got.v[0] - truth.v.sum(0)) <= 1e-5 * np.linalg.norm(truth.v.sum(0))
    assert np.linalg.norm(got.W[0] - truth.W[0]) <= 1e-5 * np.linalg.norm(truth.W[0])


def test_heads_apart_enough_are_kept_with_their_value_maps():
    """1e-3 apart (float64 answers): well separated at this precision, two heads, each V_h right to 1e-6."""
    from attnprobe.learners.multihead import extract_multihead
    from attnprobe.oracles import Oracle

    truth = _near_tie(1e-3)
    res = extract_multihead(Oracle(truth, 8), seed=0)
    assert res.check.passed and res.model.H == 2 and not res.details["near_ties"]
    errors = min(max(np.linalg.norm(res.model.v[h] - truth.v[p[h]]) / np.linalg.norm(truth.v[p[h]]) for h in (0, 1))
                 for p in ((0, 1), (1, 0)))
    assert errors < 1e-6


def test_a_resumed_audit_keeps_each_learners_record_of_a_head(tmp_path, capsys):
    """Two learners on one head: a rerun resumes both tasks, each with its own record (the journal's task key
    names the learner; without it the two collide and one learner's numbers stand for the other's)."""
    pytest.importorskip("safetensors")
    from test_hostile_audit import _random_checkpoint

    _random_checkpoint(tmp_path / "m.safetensors")
    argv = ("audit", "--safetensors", tmp_path / "m.safetensors", "--heads-per-layer", "2", "--heads", "0",
            "--method", "exact,lowrank", "--out", tmp_path / "out", "--quiet")
    rc, _, err = run(capsys, *argv)
    assert rc == 0, err
    first = json.loads((tmp_path / "out" / "results.json").read_text())
    rc, _, err = run(capsys, *argv)
    assert rc == 0, err
    again = json.loads((tmp_path / "out" / "results.json").read_text())
    assert again["resumed"] == 2
    mine = {h["method"]: (h["queries"], h["relative_error"]) for h in first["heads"]}
    assert sorted(mine) == ["exact", "lowrank"] and mine["exact"][0] != mine["lowrank"][0]
    assert {h["method"]: (h["queries"], h["relative_error"]) for h in again["heads"]} == mine
