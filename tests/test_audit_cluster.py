"""Audits that resume after a kill (finished tasks are not redone) and run on a multi-node Ray cluster."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_audit import HEADS, _numbers, _tasks
import test_audit

from attnprobe.audit import run_audit
from attnprobe.audit.run import JOURNAL

tiny_checkpoint = test_audit.checkpoint  # the fixture of a tiny BERT-family checkpoint
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _journal_lines(out: Path) -> list[str]:
    """The journal's records (its first line names the audit: models and settings)."""
    p = out / JOURNAL
    lines = [line for line in p.read_text().splitlines() if line.strip()] if p.exists() else []
    return [line for line in lines if '"audit"' not in line[:10]]


def test_rerun_reuses_finished_tasks_and_ignores_a_torn_line(tiny_checkpoint, tmp_path):
    path, _ = tiny_checkpoint
    tasks = _tasks(path, "none,float16")
    out = tmp_path / "cut"
    first = run_audit(tasks, out, workers=1, progress=False)
    lines = _journal_lines(out)
    assert len(lines) == len(tasks) and first.info["resumed"] == 0
    # as if killed after two tasks, in the middle of writing the third line
    header = (out / JOURNAL).read_text().splitlines()[0]
    assert json.loads(header)["audit"]["settings"]["seed"] == [1]
    (out / JOURNAL).write_text("\n".join([header] + lines[:2]) + "\n" + lines[2][:25])
    kept = {json.loads(line)["record"]["file"] for line in lines[:2]}
    mtimes = {f: (out / f).stat().st_mtime_ns for f in kept}
    again = run_audit(tasks, out, workers=1, progress=False)
    assert again.info["resumed"] == 2
    assert _numbers(again.records) == _numbers(first.records)
    assert all((out / f).stat().st_mtime_ns == mtimes[f] for f in kept)  # not rewritten: not redone
    assert len(_journal_lines(out)) == len(tasks)
    # a finished task whose head file is gone is redone; resume=False redoes all
    (out / sorted(kept)[0]).unlink()
    assert run_audit(tasks, out, workers=1, progress=False).info["resumed"] == len(tasks) - 1
    assert run_audit(tasks, out, workers=1, progress=False, resume=False).info["resumed"] == 0


def test_other_tasks_in_the_folder_are_not_reused(tiny_checkpoint, tmp_path):
    path, _ = tiny_checkpoint
    run_audit(_tasks(path, "none"), tmp_path, workers=1, progress=False)
    other = run_audit(_tasks(path, "float16"), tmp_path, workers=1, progress=False)
    assert other.info["resumed"] == 0
    assert sorted(p.name for p in (tmp_path / "heads").glob("*.npz")) == sorted(
        Path(r["file"]).name for r in other.records)


def test_sigkill_mid_audit_then_rerun_redoes_only_unfinished_tasks(tiny_checkpoint, tmp_path):
    """The CLI audit killed with SIGKILL after some tasks finished; the same command again finishes the rest."""
    path, _ = tiny_checkpoint
    out = tmp_path / "audit"
    cmd = [sys.executable, "-m", "attnprobe", "audit", "--safetensors", str(path), "--heads-per-layer", str(HEADS),
           "--defense", "none,float16,round:8", "--method", "exact", "--quiet", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=SRC, OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    total = 2 * HEADS * 3
    try:
        t0 = time.monotonic()
        while len(_journal_lines(out)) < 1 and proc.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finished = len(_journal_lines(out))
    assert 1 <= finished
    assert not (out / "results.json").exists() or finished == total
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["resumed"] >= finished and res["finished"] == total
    if finished < total:
        assert f"resumed {res['resumed']} finished tasks" in r.stdout
    assert all(h["error"] is None and h["passed"] for h in res["heads"])
    assert len(_journal_lines(out)) == total


@pytest.mark.slow
def test_multinode_ray_cluster_gives_the_numbers_of_the_process_pool(tiny_checkpoint, tmp_path, monkeypatch):
    """A head node and a worker node (ray.cluster_utils.Cluster, 127.0.0.1, 1 CPU each): whole layers as
    multi-head tasks plus single heads, identical records and head files to the process pool."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from attnprobe.audit import HeadSpec, Task

    path, _ = tiny_checkpoint
    monkeypatch.setenv("PYTHONPATH", SRC)  # the nodes' workers import this checkout
    # every node on 127.0.0.1: Ray would otherwise rewrite the loopback address to the machine's own IP
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setattr("ray._private.ray_constants.ENABLE_RAY_CLUSTER", False)
    tasks = _tasks(path, "none,gaussian:1e-4") + [Task(HeadSpec(str(path), layer, None, 3, HEADS), "multihead",
                                                       seed=1, rank=8) for layer in range(2)]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        ray_run = run_audit(tasks, tmp_path / "ray", engine="ray", address=cluster.address, progress=False)
    finally:
        ray.shutdown()
        cluster.shutdown()
    pool_run = run_audit(tasks, tmp_path / "pool", engine="processes", workers=2, progress=False)
    assert not ray_run.interrupted and len(ray_run.records) == len(tasks)
    assert all(r["error"] is None and r["passed"] for r in ray_run.records)
    assert _numbers(ray_run.records) == _numbers(pool_run.records)
    for r in ray_run.records:
        a, b = np.load(tmp_path / "ray" / r["file"]), np.load(tmp_path / "pool" / r["file"])
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
