"""A learner refused by answers it was not made for says what the answers carry and which learners handle them,
and an audit narrowed to some learners does not call a defence strong that an untried fitting learner breaks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnprobe.models import load_model, save_model
from attnprobe.targets import random_head
from hostile import refused, run


@pytest.mark.parametrize("d, rank, defence", [(16, 2, ("--defense", "round:4")),
                                              (64, 32, ("--noise", "gaussian:1e-6"))])
def test_lowrank_on_declared_noise_names_it_not_the_rank(tmp_path, capsys, d, rank, defence):
    """The low-rank learner's certificate allows the answers' rounding only: under declared 4-decimal rounding
    (or Gaussian noise of 1e-6) it fails with the true rank given. The line names the declared noise and the
    learner for it, never "the given rank is too small"; nothing is written; the robust learner recovers the
    head from the same answers."""
    truth = random_head(d, rank=rank, seed=0)
    save_model(truth, tmp_path / "h.npz")
    line = refused(capsys, tmp_path, "extract", "--target", tmp_path / "h.npz", "--method", "lowrank", "--rank",
                   rank, *defence, "--out", tmp_path / "o.npz", "--quiet", says="rank certificate failed")
    spec = "round:4" if "round:4" in defence else "gaussian:1e-06"
    assert f"the answers carry the declared {spec!r}" in line and "the learners for such answers: robust" in line
    assert "too small" not in line and "queries spent" in line
    if d > 16:
        return
    rc, _, err = run(capsys, "extract", "--target", tmp_path / "h.npz", "--method", "robust", *defence, "--out",
                     tmp_path / "o.npz", "--quiet")
    assert rc == 0, err
    W = load_model(tmp_path / "o.npz").W
    assert np.linalg.norm(W - truth.W) <= 1e-2 * np.linalg.norm(truth.W)


def test_an_audit_narrowed_to_one_learner_names_the_fitting_ones_it_did_not_try(tmp_path, capsys):
    """`audit --method lowrank --defense round:4`: lowrank fails on every head; the verdict is "unknown" and
    names exact and robust (they fit rounded answers and were not tried), not "strong". With them tried, the
    same defence is no longer unknown and robust recovers the heads (without --rank, nuclear cannot run)."""
    pytest.importorskip("safetensors")
    from test_hostile_audit import _random_checkpoint

    _random_checkpoint(tmp_path / "m.safetensors")
    argv = ("audit", "--safetensors", tmp_path / "m.safetensors", "--heads-per-layer", "2", "--heads", "0",
            "--defense", "round:4", "--quiet")
    rc, _, err = run(capsys, *argv, "--method", "lowrank", "--rank", "4", "--out", tmp_path / "narrow")
    html = (tmp_path / "narrow" / "report.html").read_text()
    assert "strong:" not in html, html
    assert "unknown: no head was recovered by lowrank; not tried, though they fit these answers: exact" in html
    assert "robust" in html.split("not tried, though they fit these answers:")[1][:200]
    rc, _, err = run(capsys, *argv, "--method", "lowrank,robust,exact", "--out", tmp_path / "wide")
    assert rc == 0, err
    html = (tmp_path / "wide" / "report.html").read_text()
    assert "unknown:" not in html and "not tried, though" not in html  # (nuclear needs --rank: not ready here)
    res = json.loads((tmp_path / "wide" / "results.json").read_text())
    robust = [h for h in res["heads"] if h["method"] == "robust"]
    assert robust and all(h["relative_error"]["W"] < 0.2 for h in robust)
