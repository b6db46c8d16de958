"""``attnprobe verify`` ends with a verdict: exit 0 when every relative error is within --tolerance, exit 3 and one
line naming the parameter, its error and the tolerance when one is not."""

import json

import numpy as np

from attnprobe.models import save_model
from attnprobe.targets.random_heads import random_head
from hostile import refused, run


def test_the_verdict_names_the_worst_parameter_and_the_tolerance(tmp_path, capsys):
    truth = random_head(6, seed=1)
    save_model(truth, tmp_path / "t.npz")
    save_model(truth, tmp_path / "same.npz")
    from dataclasses import replace

    other = replace(truth, v=truth.v + 0.22 * np.linalg.norm(truth.v) * np.eye(6)[0])  # a different head: v 0.22 off
    save_model(other, tmp_path / "other.npz")
    rc, out, err = run(capsys, "verify", "--target", tmp_path / "t.npz", "--result", tmp_path / "same.npz")
    assert rc == 0 and not err
    assert out.splitlines()[-1].startswith("verdict: the result matches the target") and "1.0e-03" in out
    line = refused(capsys, tmp_path, "verify", "--target", tmp_path / "t.npz", "--result", tmp_path / "other.npz",
                   code=3, says="the result differs from the target: v has relative error 2.2")
    assert "> tolerance 1.0e-03 (--tolerance sets it)" in line
    rc, out, _ = run(capsys, "verify", "--target", tmp_path / "t.npz", "--result", tmp_path / "other.npz",
                     "--tolerance", "0.5", "--json", tmp_path / "e.json")
    assert rc == 0 and "within the tolerance 5.0e-01" in out
    assert json.loads((tmp_path / "e.json").read_text())["v"] > 0.2
    refused(capsys, tmp_path, "verify", "--target", tmp_path / "t.npz", "--result", tmp_path / "same.npz",
            "--tolerance", "0", says="--tolerance")
