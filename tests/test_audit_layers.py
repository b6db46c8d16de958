"""attnprobe audit --tasks layers: every head of a layer at once from whole output rows (vector answers, App. C
with K outputs), beside the per-head tasks; the journal of such an audit, and its refusals."""

import json

import numpy as np
import pytest
from test_audit import HEADS, LAYERS, D, _numbers
import test_audit

from attnprobe.audit import HeadSpec, Task, parse_defenses, run_audit
from attnprobe.cli import main
from attnprobe.models.io import load_model
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.targets import BertCheckpoint

tiny_checkpoint = test_audit.checkpoint  # the fixture of a tiny BERT-family checkpoint (d = 16, 2 layers of 2)


def _truth(path, layer: int) -> MultiHeadAttention:
    """The layer's whole output row in the vector layout, built here from the raw tensors (App. C:
    ``W_h = K_hᵀQ_h/√d_h``, ``u_h = K_hᵀb_Q,h/√d_h``, ``V_h = W_O[:, h] W_V[h]``, ``c = W_O b_V + b_O``)."""
    p = BertCheckpoint(path, HEADS).layer_weights(layer)
    s = 1 / np.sqrt(D // HEADS)
    WO = p["WO"].reshape(D, HEADS, D // HEADS)
    return MultiHeadAttention(s * np.einsum("hkd,hke->hde", p["K"], p["Q"]), np.einsum("ohk,hkd->hod", WO, p["V"]),
                              s * np.einsum("hkd,hk->hd", p["K"], p["bQ"]), p["WO"] @ p["bV"].reshape(-1) + p["bO"])


def test_layer_tasks_recover_every_head_from_whole_output_rows(tiny_checkpoint, tmp_path, capsys):
    """One task per (layer, defence); the multi-head learner reads the K = d answers of each query. Undefended:
    every head to 1e-9; float32 answers: every head to 1e-3 but worse than float64; float16 answers: the learner
    refuses (coarser than float32), a finding. The per-head errors of the record are those of the saved file
    against the true layer, and a rerun resumes every task."""
    path, _ = tiny_checkpoint
    out = tmp_path / "layers"
    argv = ["audit", "--safetensors", str(path), "--heads-per-layer", str(HEADS), "--tasks", "layers",
            "--defense", "none,float32,float16", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["tasks"] == res["finished"] == 3 * LAYERS and res["task_kind"] == "layers"
    by = {(h["layer"], h["defense"]): h for h in res["heads"]}
    assert all(h["head"] is None and h["row"] is None and h["method"] == "multihead" for h in res["heads"])
    for layer in range(LAYERS):
        truth = _truth(path, layer)
        plain, single = by[(layer, "none")], by[(layer, "float32")]
        assert plain["error"] is None and plain["passed"] and max(plain["head_errors"]) < 1e-9
        assert len(plain["head_errors"]) == len(plain["head_W_errors"]) == HEADS
        assert plain["queries"] * D >= plain["unknowns"] == MultiHeadAttention.unknowns(D, HEADS, True, D)
        saved = load_model(out / plain["file"])
        assert plain["file"] == f"heads/L{layer}.npz" and saved.v.shape == (HEADS, D, D)
        m = match_heads(truth, saved)
        assert np.allclose(plain["head_errors"], m.head_error, rtol=1e-6, atol=0)
        assert np.allclose(plain["head_W_errors"], m.W, rtol=1e-6, atol=0)
        X = np.random.default_rng(5).standard_normal((4, 6, D))
        assert np.allclose(saved(X), truth(X), rtol=1e-8, atol=1e-10)
        assert single["error"] is None and single["passed"]
        assert max(plain["head_errors"]) < max(single["head_errors"]) < 1e-3  # float32 answers cost accuracy
        half = by[(layer, "float16")]
        assert half["file"] is None and "coarser than float32" in half["error"]
    html = (out / "report.html").read_text()
    assert "float16 answers: no head recovered" in html and f"<td>{2 * LAYERS}/{HEADS * LAYERS}</td>" in html
    assert "queries per layer" in html and "Tasks: layers (one task per layer" in html
    capsys.readouterr()
    assert main(argv) == 0  # the same command again: every task comes from the journal
    assert f"resumed {3 * LAYERS} finished tasks" in capsys.readouterr().out
    again = json.loads((out / "results.json").read_text())
    assert again["resumed"] == 3 * LAYERS and _numbers(again["heads"]) == _numbers(res["heads"])


def test_layer_and_head_tasks_run_side_by_side_with_their_own_files(tiny_checkpoint, tmp_path):
    """Whole rows, one row and single heads of the same layer in one audit: each task its own file and truth."""
    path, _ = tiny_checkpoint
    none = parse_defenses("none")[0]
    tasks = [Task(HeadSpec(str(path), 1, None, None, HEADS), "multihead", none, seed=2),
             Task(HeadSpec(str(path), 1, None, 3, HEADS), "multihead", none, seed=2, rank=D // HEADS),
             Task(HeadSpec(str(path), 1, 0, 3, HEADS), "exact", none, seed=2)]
    run = run_audit(tasks, tmp_path, progress=False)
    assert [r["file"] for r in run.records] == ["heads/L1_multihead.npz", "heads/L1R3_multihead.npz",
                                                  "heads/L1H0_exact.npz"]
    assert all(r["error"] is None and r["passed"] for r in run.records)
    assert [load_model(tmp_path / r["file"]).v.ndim for r in run.records] == [3, 2, 1]
    assert run.records[0]["head_errors"] and "head_errors" not in run.records[2]


def test_a_single_head_needs_an_output_row():
    from attnprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="one output row"):
        HeadSpec("minilm", 0, 0, None)
    assert HeadSpec("minilm", 0, None, None).kind.vector and not HeadSpec("minilm", 0, None, 0).kind.vector


@pytest.mark.parametrize("extra, says", [
    (["--tasks", "layers", "--rank", "8"], "drop --rank"),
    (["--tasks", "layers", "--row", "3"], "drop --row"),
    (["--tasks", "layers", "--heads", "0"], "drop --heads"),
    (["--tasks", "layers", "--defense", "membership"], "no multi-head learner of vector answers can read"),
    (["--tasks", "layers", "--method", "exact"], "whole output rows (--tasks layers) are auto or a comma-separated "
                                                 "list of multihead"),
    (["--tasks", "heads", "--multihead"], "drop one of --multihead and --tasks heads"),
])
def test_layer_task_refusals_leave_no_folder(tiny_checkpoint, tmp_path, capsys, extra, says):
    from hostile import refused

    path, _ = tiny_checkpoint
    refused(capsys, tmp_path, "audit", "--safetensors", path, "--heads-per-layer", HEADS, "--quiet", "--out",
            tmp_path / "out", *extra, says=says)
    assert not (tmp_path / "out").exists()


def test_layers_every_tasks_read_every_row_and_say_so(tiny_checkpoint, tmp_path):
    """--tasks layers-every: the same layers answering the output row at every position (bidirectional): every
    head to 1e-9 with fewer queries than from the last row, the records carrying the rows and positions."""
    path, _ = tiny_checkpoint
    res = {}
    for kind in ("layers", "layers-every"):
        out = tmp_path / kind
        assert main(["audit", "--safetensors", str(path), "--heads-per-layer", str(HEADS), "--tasks", kind,
                     "--quiet", "--out", str(out)]) == 0
        res[kind] = json.loads((out / "results.json").read_text())
    assert res["layers-every"]["task_kind"] == "layers-every"
    last = {h["layer"]: h for h in res["layers"]["heads"]}
    for h in res["layers-every"]["heads"]:
        assert h["error"] is None and h["passed"] and max(h["head_errors"]) < 1e-9
        assert h["positions"] == "bidirectional" and h["rows"] > h["queries"]
        assert h["queries"] < last[h["layer"]]["queries"] and last[h["layer"]]["positions"] == "last"
