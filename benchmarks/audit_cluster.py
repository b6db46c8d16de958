"""The whole MiniLM-L6 model audited as six whole-layer tasks (every head of a layer at once from whole output rows:
vector answers, K = 384, the multi-head learner's vector route) on four engines: the process pool with 1 and 2
workers, a private local Ray cluster (2 CPUs) and a 2-node Ray cluster simulated on this machine
(``ray.cluster_utils.Cluster``: a head node and a worker node of 1 CPU each, 127.0.0.1 only). Wall time, queries,
the worst head's error per engine, and whether every engine's records and head files equal the 1-worker pool's.
Then the Ray kill-and-resume tests (too slow for the default suite) are run and their outcome tabled; ``--parts
heads`` runs every single head (72 low-rank tasks) on the same four engines.

    PYTHONPATH=src python benchmarks/audit_cluster.py [--layers 0-5] [--parts engines,resume,heads] [--no-docs]

On a real cluster the same audit is ``attnprobe audit --model minilm --tasks layers --ray HOST:6379`` (attnprobe
installed on every node).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = str(ROOT / "src")  # the Ray nodes import this checkout
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep every node on 127.0.0.1 (read when ray is imported)

from attnprobe.audit import HeadSpec, Task, run_audit  # noqa: E402
from attnprobe.reports import Table  # noqa: E402
from sections import command_line, write_section  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audit import load  # noqa: E402  (the benchmark of the local engines)

DOC = "audit"  # its results file: docs/benchmarks/audit.md
SECTION = "Whole-model audit on a multi-node Ray cluster"
ENGINES_TITLE = "MiniLM-L6, all six layers as whole-layer vector tasks, on four engines"
RESUME_TITLE = "Kill and resume on Ray"
HEADS_TITLE = "MiniLM-L6, every single head (low-rank sketch), on four engines"
#: the Ray tests that kill an audit mid-way and rerun it (marked slow: run here)
RESUME_TESTS = ["tests/test_audit_cluster.py::test_ctrl_c_during_a_ray_audit_keeps_what_finished_and_a_rerun_resumes",
                "tests/test_audit_cluster.py::test_sigkill_mid_ray_audit_then_rerun_on_ray",
                "tests/test_audit_cluster.py::test_sigkill_mid_audit_on_a_two_node_cluster_then_rerun_there",
                "tests/test_audit_cluster.py::test_multinode_ray_cluster_gives_the_numbers_of_the_process_pool"]


def numbers(records) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("seconds", "traceback")} for r in records]


def same_files(a: Path, b: Path, records) -> bool:
    for r in records:
        if r["file"] is None:
            continue
        x, y = np.load(a / r["file"]), np.load(b / r["file"])
        if x.files != y.files or not all(np.array_equal(x[k], y[k]) for k in x.files):
            return False
    return True


def two_node_run(tasks, out: Path):
    """The audit on a head node + a worker node started here (``ray.cluster_utils.Cluster``)."""
    import ray
    from ray.cluster_utils import Cluster

    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        started = time.perf_counter() - t0
        run = run_audit(tasks, out, engine="ray", address=cluster.address, progress=False)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return run, started


def on_engines(tasks, tmp: Path, worst: str = "worst head error (W, u or V_h)") -> tuple[Table, object]:
    """The tasks on the four engines: a table of each run against the 1-worker pool's, and that run."""
    runs, walls, starts = {}, {}, {}
    for label, engine, workers in (("processes, 1 worker", "processes", 1), ("processes, 2 workers", "processes", 2),
                                   ("Ray, local (2 CPUs)", "ray", 2)):
        t0 = time.perf_counter()
        runs[label] = run_audit(tasks, tmp / label.replace(" ", "_").replace(",", ""), engine=engine,
                                workers=workers, progress=False)
        walls[label], starts[label] = time.perf_counter() - t0, "-"
        print(label, round(walls[label], 1), load(), flush=True)
    label = "Ray, 2 nodes (1 CPU each)"
    t0 = time.perf_counter()
    runs[label], started = two_node_run(tasks, tmp / "ray_2_nodes")
    walls[label], starts[label] = time.perf_counter() - t0, started
    print(label, round(walls[label], 1), load(), flush=True)
    base = runs["processes, 1 worker"]
    t = Table(["engine", "tasks finished", "failed or not passed", "queries (all tasks, with checks)",
               worst, "wall s (incl. start-up)", "cluster start s", "Σ task s",
               "records and head files identical to 1 worker"])
    for label, run in runs.items():
        ok = numbers(run.records) == numbers(base.records) and same_files(base.out, run.out, base.records)
        failed = sum(1 for r in run.records if r["error"] or not r["passed"])
        largest = max((e for r in run.records for e in r.get("head_errors") or [max(r["relative_error"].values())]
                       if not r["error"]), default=None)
        t.add(label, len(run.records), failed, sum(r["queries"] + r.get("check_queries", 0) for r in run.records),
              largest, walls[label], starts[label], sum(r["seconds"] for r in run.records), "yes" if ok else "NO")
    return t, base


def engines_part(layers: list[int], tmp: Path) -> str:
    tasks = [Task(HeadSpec("minilm", layer, None, None), "multihead", seed=0) for layer in layers]
    before = load()
    t, base = on_engines(tasks, tmp)
    per_layer = Table(["layer", "heads", "queries", "worst head error", "W (worst head)", "u", "V_h", "c",
                       "check passed", "task s (1 worker)"])
    for r in base.records:
        e = r["relative_error"]
        per_layer.add(r["layer"], len(r.get("head_errors", [])), r["queries"], max(r.get("head_errors") or [np.nan]),
                      e.get("W"), e.get("u"), e.get("v"), e.get("c"), r["passed"], r["seconds"])
    return (f"All {len(layers)} layers of MiniLM-L6 (layers {layers[0]}–{layers[-1]}) as whole-layer tasks: every head "
            "of a layer at once from whole output rows (vector answers, K = 384; `--tasks layers`, the multi-head "
            f"learner's vector route, float64 answers, seed 0), one task per layer. {before} at the start, {load()} at "
            "the end (a load above the 2 cores' idle means other jobs shared them: the seconds are then noisy, and "
            f"the point is the last column).\n\n{t.markdown()}\n\n"
            "Per layer (the 1-worker run; every engine gave these numbers):\n\n"
            f"{per_layer.markdown()}\n\nThe same audit from the command line: `attnprobe audit --model minilm --tasks "
            "layers --workers 2 --out DIR` (or `--ray`, or `--ray HOST:6379` on a real cluster started with "
            "`ray start --head`, and `ray start --address HOST:6379` on each other node, attnprobe installed on every "
            "node).")


def heads_part(layers: list[int], tmp: Path) -> str:
    """Every single head of the layers (12 per layer) with the rank-32 sketch (lowrank learner), one output row."""
    tasks = [Task(HeadSpec("minilm", layer, head, 0), "lowrank", seed=0, rank=32) for layer in layers
             for head in range(12)]
    before = load()
    (tmp / "heads").mkdir()
    t, _ = on_engines(tasks, tmp / "heads", "worst head error (W, v, u or c)")
    return (f"The same four engines on every single head of MiniLM-L6 layers {layers[0]}–{layers[-1]} ({len(tasks)} "
            "tasks, `--tasks heads --method lowrank --rank 32`, output row 0, float64 answers, seed 0). "
            f"{before} at the start, {load()} at the end.\n\n{t.markdown()}")


def resume_part(tmp: Path) -> str:
    """Run the Ray kill-and-resume tests (slow) and table their outcome."""
    xml = tmp / "resume.xml"
    before = load()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
           f"--junitxml={xml}", *RESUME_TESTS]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    t = Table(["test", "outcome", "seconds"])
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else (
            "skipped" if case.find("skipped") is not None else "passed")
        t.add(case.get("name"), outcome, float(case.get("time", 0)))
    text = (f"The Ray tests run by this script (`python -m pytest -m 'slow or not slow' TESTS`, TESTS below; {before} "
            "at the start): an audit of a 4-layer d = 16 checkpoint (24 tasks) stopped once its first task is "
            "journaled — Ctrl-C to the whole process group on a private local cluster; SIGKILL of the driver and the "
            "Ray processes it started, then SIGTERM; SIGKILL of a driver joined to a simulated 2-node cluster (which "
            "outlives it), then Ctrl-C there — and run again (the first test reruns on the process pool, the others "
            "on Ray): exit 130 and one line on Ctrl-C, 143 and one line on SIGTERM, no Ray process left behind (also "
            "after a Ctrl-C while Ray is starting), the tasks journaled before the stop not redone (their records, "
            "seconds included, and head files untouched), and the final records equal to an uninterrupted run's "
            "(tests 2 and 3); and the 2-node cluster's records and head files (single heads, whole layers at one "
            "output row and from whole output rows) equal to the process pool's. The first test (Ctrl-C on a local "
            "cluster) was in the default suite until Ray once aborted in its own task manager on the SIGINT; it is "
            "slow now.")
    return f"{text}\n\n{t.markdown()}\n\nTESTS: {' '.join(f'`{x}`' for x in RESUME_TESTS)}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="0-5", help="MiniLM layers: A-B")
    ap.add_argument("--parts", default="engines,resume")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    lo, _, hi = args.layers.partition("-")
    layers = list(range(int(lo), int(hi or lo) + 1))
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for name, title, make in (("engines", ENGINES_TITLE, lambda: engines_part(layers, Path(tmp))),
                                  ("heads", HEADS_TITLE, lambda: heads_part(layers, Path(tmp))),
                                  ("resume", RESUME_TITLE, lambda: resume_part(Path(tmp)))):
            if name in parts:
                text = make()
                print(text)
                if not args.no_docs:
                    write_section(title, text, command_line(), parent=SECTION, doc=DOC)


if __name__ == "__main__":
    main()
