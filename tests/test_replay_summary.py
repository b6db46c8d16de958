"""A replayed run says where its functional check's answers came from: the log, not fresh sequences."""

import json

from attnprobe.models import save_model
from attnprobe.targets.random_heads import random_head
from hostile import run


def test_a_replay_does_not_call_its_check_fresh(tmp_path, capsys):
    save_model(random_head(5, seed=4), tmp_path / "t.npz")
    log = tmp_path / "q.sqlite"
    rc, out, err = run(capsys, "extract", "--target", tmp_path / "t.npz", "--log", log, "--out", tmp_path / "a.npz",
                       "--quiet")
    assert rc == 0 and "on 40 fresh sequences" in out, err
    rc, out, err = run(capsys, "extract", "--replay", "--log", log, "--out", tmp_path / "b.npz", "--quiet")
    assert rc == 0, err
    check = next(ln for ln in out.splitlines() if ln.startswith("functional check"))
    assert "fresh" not in check.replace("not asked afresh", "") and "answered by the query log (replay" in check
    assert json.loads((tmp_path / "b.json").read_text())["details"]["oracle"]["check_answered_by"] == \
        "the query log (replay)"
