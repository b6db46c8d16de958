"""A whole-model audit (every layer as one multi-head task, plus every single head) on four engines: the process
pool with 1 and 2 workers, a private local Ray cluster (2 CPUs) and a 2-node Ray cluster simulated on this machine
(``ray.cluster_utils.Cluster``: a head node and a worker node of 1 CPU each, 127.0.0.1 only). Wall time per engine
and whether every engine's records and head files equal the 1-worker pool's.

    PYTHONPATH=src python benchmarks/audit_cluster.py [--d 16] [--layers 4] [--heads-per-layer 2] [--rank 8]

On a real cluster the same audit is ``attnprobe audit ... --ray HOST:6379`` (attnprobe installed on every node).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from attnprobe.audit import HeadSpec, Task, run_audit
from attnprobe.reports import Table, command_line, write_section

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audit import load, tiny_checkpoint  # noqa: E402  (the benchmark of the local engines)

SECTION = "Whole-model audit on a multi-node Ray cluster"


def numbers(records) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("seconds", "traceback")} for r in records]


def same_files(a: Path, b: Path, records) -> bool:
    for r in records:
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads-per-layer", type=int, default=2)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")  # the Ray nodes import this checkout
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep every node on 127.0.0.1 (read when ray is imported)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ckpt = str(tiny_checkpoint(tmp / "tiny.safetensors", args.d, args.layers))
        H = args.heads_per_layer
        tasks = ([Task(HeadSpec(ckpt, layer, None, 0, H), "multihead", seed=0, rank=args.rank)
                  for layer in range(args.layers)]
                 + [Task(HeadSpec(ckpt, layer, h, 0, H), "exact", seed=0) for layer in range(args.layers)
                    for h in range(H)])
        rows, runs = [], {}
        for label, engine, workers in (("processes, 1 worker", "processes", 1),
                                       ("processes, 2 workers", "processes", 2),
                                       ("Ray, local (2 CPUs)", "ray", 2)):
            t0 = time.perf_counter()
            runs[label] = run_audit(tasks, tmp / label.replace(" ", "_"), engine=engine, workers=workers,
                                    progress=False)
            rows.append([label, time.perf_counter() - t0, "-"])
            print(rows[-1], flush=True)
        t0 = time.perf_counter()
        runs["Ray, 2 nodes"], started = two_node_run(tasks, tmp / "ray_2_nodes")
        rows.append(["Ray, 2 nodes (1 CPU each)", time.perf_counter() - t0, started])
        base = runs["processes, 1 worker"]
        table_rows = []
        for (label, run), row in zip(runs.items(), rows):
            ok = numbers(run.records) == numbers(base.records) and same_files(base.out, run.out, base.records)
            failed = sum(1 for r in run.records if r["error"] or not r["passed"])
            table_rows.append([row[0], len(run.records), failed, row[1], row[2], ok])
    table = Table(["engine", "tasks finished", "failed or not passed", "wall s (incl. start-up)",
                   "cluster start s", "records and heads identical to 1 worker"], table_rows).markdown()
    body = (f"A random BERT-family model (d = {args.d}, {args.layers} layers of {H} heads): {args.layers} whole-layer "
            f"multi-head tasks (rank {args.rank} given) and {args.layers * H} single-head exact tasks, one seed. "
            f"{load()}: the machine was loaded, so the times are a floor; the point is the last column.\n\n{table}\n\n"
            "`attnprobe audit --ray HOST:6379` runs the same tasks on a real cluster started with `ray start --head` "
            "(and `ray start --address HOST:6379` on each other node, attnprobe installed on every node).")
    print(body)
    if not args.no_docs:
        write_section(SECTION, body, command_line())


if __name__ == "__main__":
    main()
