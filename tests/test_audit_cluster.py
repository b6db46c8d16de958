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


def _readable(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


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
    # append-only: the cut line is ended (kept, unreadable) and the redone task's record follows it
    assert sum(_readable(line) for line in _journal_lines(out)) == len(tasks)
    assert run_audit(tasks, out, workers=1, progress=False).info["resumed"] == len(tasks)
    # a finished task whose head file is gone is redone; resume=False redoes all
    (out / sorted(kept)[0]).unlink()
    assert run_audit(tasks, out, workers=1, progress=False).info["resumed"] == len(tasks) - 1
    assert run_audit(tasks, out, workers=1, progress=False, resume=False).info["resumed"] == 0


def test_other_tasks_in_the_folder_are_not_reused(tiny_checkpoint, tmp_path):
    path, _ = tiny_checkpoint
    first = run_audit(_tasks(path, "none"), tmp_path, workers=1, progress=False)
    kept = {r["file"]: (tmp_path / r["file"]).read_bytes() for r in first.records}
    other = run_audit(_tasks(path, "float16"), tmp_path, workers=1, progress=False)
    assert other.info["resumed"] == 0
    # the other audit's head files are neither reused nor removed nor overwritten
    assert not set(kept) & {r["file"] for r in other.records}
    assert all((tmp_path / f).read_bytes() == b for f, b in kept.items())
    assert sorted(p.name for p in (tmp_path / "heads").glob("*.npz")) == sorted(
        Path(r["file"]).name for r in [*first.records, *other.records])


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    """A BERT-family checkpoint of 4 layers of 2 heads (d = 16): 24 exact tasks under three defences, enough that
    a kill lands mid-way."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(11)
    t = {}
    for i in range(4):
        for name in ("self.query", "self.key", "self.value", "output.dense"):
            t[f"encoder.layer.{i}.attention.{name}.weight"] = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
            t[f"encoder.layer.{i}.attention.{name}.bias"] = (0.1 * rng.standard_normal(16)).astype(np.float32)
    path = tmp_path_factory.mktemp("four") / "m.safetensors"
    save_file(t, str(path))
    return path


def _audit_cmd(path, out, *extra):
    return [sys.executable, "-m", "attnprobe", "audit", "--safetensors", str(path), "--heads-per-layer", "2",
            "--defense", "none,float16,round:8", "--method", "exact", "--quiet", "--out", str(out), *extra]


def _env():
    # Ray's nodes stay on 127.0.0.1 (otherwise the loopback address is rewritten to the machine's own IP)
    return dict(os.environ, PYTHONPATH=SRC, OPENBLAS_NUM_THREADS="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")


def _stop_mid_way(cmd, out: Path, sig=signal.SIGKILL):
    """Run ``cmd`` in its own process group, send ``sig`` to the whole group (as a terminal's Ctrl-C, or a kill of
    the job) once the first task is in the journal; returns (return code, stderr, the journal's whole records once
    the process has ended, its process group)."""
    proc = subprocess.Popen(cmd, env=_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while len(_journal_lines(out)) < 1 and proc.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
    records = []
    for line in _journal_lines(out):
        try:
            records.append(json.loads(line))
        except ValueError:  # a line cut short by SIGKILL
            pass
    return proc.returncode, err, records, proc.pid


def _group_gone(pgid: int, timeout: float = 20.0) -> bool:
    """Whether every process of group ``pgid`` (the audit and the Ray processes it started) has exited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def _check_resumed(out: Path, before: list[dict], reference: list[dict] | None, total: int) -> dict:
    """The rerun's results: every task finished, the same numbers as an uninterrupted run (``reference``, if
    given), and the tasks the journal held before not redone (their records, seconds included, untouched)."""
    res = json.loads((out / "results.json").read_text())
    assert res["finished"] == total and res["resumed"] == len(before)
    assert reference is None or _numbers(res["heads"]) == _numbers(reference)
    by_file = {h["file"]: h for h in res["heads"]}
    for entry in before:
        rec = entry["record"]
        assert by_file[rec["file"]]["seconds"] == rec["seconds"]  # the journal's record, not a second run
    assert len(_journal_lines(out)) == total
    return res


def _reference(path, tmp_path) -> list[dict]:
    """The records of the same audit run without interruption (process pool: the engines give the same numbers)."""
    from attnprobe.cli import main

    ref = tmp_path / "reference"
    assert main(_audit_cmd(path, ref)[3:]) == 0
    return json.loads((ref / "results.json").read_text())["heads"]


def test_sigkill_mid_audit_then_rerun_redoes_only_unfinished_tasks(tiny_checkpoint, tmp_path):
    """The CLI audit killed with SIGKILL after some tasks finished; the same command again finishes the rest."""
    path, _ = tiny_checkpoint
    out = tmp_path / "audit"
    cmd = [sys.executable, "-m", "attnprobe", "audit", "--safetensors", str(path), "--heads-per-layer", str(HEADS),
           "--defense", "none,float16,round:8", "--method", "exact", "--quiet", "--out", str(out)]
    total = 2 * HEADS * 3
    _, _, before, _ = _stop_mid_way(cmd, out)
    finished = len(before)
    assert 1 <= finished
    assert not (out / "results.json").exists() or finished == total
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["resumed"] >= finished and res["finished"] == total
    if finished < total:
        assert f"resumed {res['resumed']} finished tasks" in r.stdout
    assert all(h["error"] is None and h["passed"] for h in res["heads"])
    assert len(_journal_lines(out)) == total


# slow: 14–26 s under load, and Ray itself now and then aborts in its C++ task manager when SIGINT lands mid-task
# ("Tried to complete task that was not pending", exit 1): run from benchmarks/audit_cluster.py --parts resume
@pytest.mark.slow
def test_ctrl_c_during_a_ray_audit_keeps_what_finished_and_a_rerun_resumes(four_layers, tmp_path, capsys):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) during an audit on a private local Ray
    cluster: exit 130 with one line, results.json lists the finished tasks, no Ray process is left behind, and the
    same audit run again (here on the process pool: the journal does not depend on the engine) redoes only the
    rest (the records equal an uninterrupted run's in the slow tests below, which rerun on Ray)."""
    pytest.importorskip("ray")
    out = tmp_path / "audit"
    cmd = _audit_cmd(four_layers, out, "--ray", "--workers", "1")
    rc, err, before, group = _stop_mid_way(cmd, out, signal.SIGINT)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 130 and len(lines) == 1 and "interrupted: audit stopped by SIGINT (Ctrl-C)" in lines[0], err
    assert 1 <= len(before) < 24 and _group_gone(group)
    assert json.loads((out / "results.json").read_text())["finished"] == len(before)
    from attnprobe.cli import main

    capsys.readouterr()
    assert main(cmd[3: cmd.index("--ray")]) == 0
    assert f"resumed {len(before)} finished tasks" in capsys.readouterr().out
    res = _check_resumed(out, before, None, 24)  # against an uninterrupted run: the slow tests below
    assert all(h["passed"] for h in res["heads"] if h["defense"] == "none")  # all 8 undefended heads recovered


@pytest.mark.slow
def test_sigkill_mid_ray_audit_then_rerun_on_ray(four_layers, tmp_path):
    """SIGKILL of an audit on a private local Ray cluster (the whole group: the driver and the Ray processes it
    started), then the same command on Ray again: finished tasks are not redone, the final records equal an
    uninterrupted run's; Ctrl-C while Ray is still starting leaves no Ray process behind either, and SIGTERM
    ends the audit like Ctrl-C (exit 143, one line, what finished kept)."""
    pytest.importorskip("ray")
    out = tmp_path / "audit"
    cmd = _audit_cmd(four_layers, out, "--ray", "--workers", "1")
    rc, _, before, _ = _stop_mid_way(cmd, out)
    assert rc == -signal.SIGKILL and 1 <= len(before) < 24
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and f"resumed {len(before)} finished tasks" in r.stdout, r.stderr
    _check_resumed(out, before, _reference(four_layers, tmp_path), 24)
    early = subprocess.Popen(_audit_cmd(four_layers, tmp_path / "early", "--ray", "--workers", "1"), env=_env(),
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(2)  # Ray is starting its processes
    os.killpg(early.pid, signal.SIGINT)
    _, err = early.communicate(timeout=120)
    assert early.returncode == 130 and len([x for x in err.splitlines() if x.strip()]) == 1, err
    assert _group_gone(early.pid)
    # SIGTERM to the group (Ray's core worker would take SIGTERM over: a stack dump and an abort)
    term = tmp_path / "term"
    rc, err, before, group = _stop_mid_way(_audit_cmd(four_layers, term, "--ray", "--workers", "1"), term,
                                           signal.SIGTERM)
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 143 and len(lines) == 1 and "audit stopped by SIGTERM" in lines[0], err
    assert json.loads((term / "results.json").read_text())["finished"] == len(before) and _group_gone(group)


def _two_node_cluster(monkeypatch):
    """A head node and a worker node of 1 CPU each on 127.0.0.1 (``ray.cluster_utils.Cluster``)."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # the nodes' workers import this checkout (and whatever else the path held: Ray may be installed off the venv)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    # every node on 127.0.0.1: Ray would otherwise rewrite the loopback address to the machine's own IP
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setattr("ray._private.ray_constants.ENABLE_RAY_CLUSTER", False)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    return cluster


@pytest.mark.slow
def test_sigkill_mid_audit_on_a_two_node_cluster_then_rerun_there(four_layers, tmp_path, monkeypatch):
    """The audit driven from another process against a simulated 2-node cluster (``--ray ADDRESS``), killed with
    SIGKILL mid-way, run again against the same cluster (which outlives the driver); then Ctrl-C of a third run:
    exit 130, one line, and the cluster is still there for the next."""
    import ray

    cluster = _two_node_cluster(monkeypatch)
    try:
        out = tmp_path / "audit"
        cmd = _audit_cmd(four_layers, out, "--ray", cluster.address)
        rc, _, before, _ = _stop_mid_way(cmd, out)
        assert rc == -signal.SIGKILL and 1 <= len(before) < 24
        r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and f"resumed {len(before)} finished tasks" in r.stdout, r.stderr
        _check_resumed(out, before, _reference(four_layers, tmp_path), 24)
        again = tmp_path / "again"
        rc, err, before, _ = _stop_mid_way(_audit_cmd(four_layers, again, "--ray", cluster.address), again,
                                           signal.SIGINT)
        assert rc == 130 and len([x for x in err.splitlines() if x.strip()]) == 1, err
        r = subprocess.run(_audit_cmd(four_layers, again, "--ray", cluster.address), env=_env(),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        _check_resumed(again, before, _reference(four_layers, tmp_path / "ref2"), 24)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_multinode_ray_cluster_gives_the_numbers_of_the_process_pool(tiny_checkpoint, tmp_path, monkeypatch):
    """A head node and a worker node (ray.cluster_utils.Cluster, 127.0.0.1, 1 CPU each): whole layers as
    multi-head tasks (one output row, and whole output rows) plus single heads, identical records and head files to
    the process pool."""
    import ray

    from attnprobe.audit import HeadSpec, Task

    path, _ = tiny_checkpoint
    tasks = _tasks(path, "none,gaussian:1e-4") + [Task(HeadSpec(str(path), layer, None, 3, HEADS), "multihead",
                                                       seed=1, rank=8) for layer in range(2)] + [
        Task(HeadSpec(str(path), layer, None, None, HEADS), "multihead", seed=1) for layer in range(2)]
    cluster = _two_node_cluster(monkeypatch)
    try:
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


def test_signals_are_held_back_until_the_block_ends():
    """A signal sent while a finished task is saved and journaled (here from another thread, as the kernel may
    deliver it to any thread) is handled once the block ends, by the handler that was there before."""
    import threading

    from attnprobe.audit.engines import signals_held

    seen = []
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda n, f: seen.append("handled"))
    try:
        with signals_held(signal.SIGINT, signal.SIGTERM):
            for sig in (signal.SIGINT, signal.SIGTERM):
                t = threading.Thread(target=os.kill, args=(os.getpid(), sig))
                t.start()
                t.join()
            time.sleep(0.05)
            seen.append("block done")
        pytest.fail("the held-back Ctrl-C was lost")
    except KeyboardInterrupt:
        seen.append("interrupted")
    finally:
        handler = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, before)
    assert seen[0] == "block done" and sorted(seen[1:]) == ["handled", "interrupted"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and callable(handler)
