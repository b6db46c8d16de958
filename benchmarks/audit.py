"""`attnprobe audit` wall times: the process pool with 1 and 2 workers and a local Ray cluster on the same
MiniLM-L6 heads and defences, the verdicts the audit reports, and each engine's per-task overhead measured on
tiny heads (d = 16) where the extraction itself takes milliseconds.

    python benchmarks/audit.py [--layers 0] [--heads 0-1] [--defense none,float32,float16] [--method exact]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from attnprobe.audit import HeadSpec, Task, parse_defenses, run_audit
from attnprobe.audit.report import verdicts
from attnprobe.cli.audit import parse_range
from attnprobe.reports import Table, command_line, write_section

SECTION = "Auditing a model (attnprobe audit)"
ENGINES = (("processes", 1), ("processes", 2), ("ray", 2))


def tiny_checkpoint(path: Path, d: int = 16, layers: int = 2) -> Path:
    """A BERT-family checkpoint with random weights, for measuring the engines' overhead."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    t = {}
    for i in range(layers):
        for name in ("self.query", "self.key", "self.value", "output.dense"):
            t[f"encoder.layer.{i}.attention.{name}.weight"] = (rng.standard_normal((d, d)) / 4).astype(np.float32)
            t[f"encoder.layer.{i}.attention.{name}.bias"] = (0.1 * rng.standard_normal(d)).astype(np.float32)
    save_file(t, str(path))
    return path


def time_engines(tasks, tmp: Path, label: str):
    rows, runs = [], {}
    for engine, workers in ENGINES:
        t0 = time.perf_counter()
        run = run_audit(tasks, tmp / f"{label}-{engine}-{workers}", engine=engine, workers=workers, progress=False,
                        info={"model": label, "method": tasks[0].method})
        wall = time.perf_counter() - t0
        busy = sum(r["seconds"] for r in run.records)
        rows.append((engine, workers, len(tasks), wall, busy, (wall * workers - busy) / len(tasks),
                     sum(1 for r in run.records if r["error"])))
        runs[(engine, workers)] = run
    return rows, runs


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", default="0")
    p.add_argument("--heads", default="0-1")
    p.add_argument("--defense", default="none,float32,float16")
    p.add_argument("--method", default="exact")
    p.add_argument("--tiny-tasks", type=int, default=24)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="attnprobe-audit-bench-"))
    defenses = parse_defenses(args.defense)
    tasks = [Task(HeadSpec("minilm", layer, head), args.method, d)
             for d in defenses for layer in parse_range(args.layers, 6, "layers")
             for head in parse_range(args.heads, 12, "heads")]
    rows, runs = time_engines(tasks, tmp, "minilm")
    same = all(
        [{k: v for k, v in r.items() if k != "seconds"} for r in run.records]
        == [{k: v for k, v in r.items() if k != "seconds"} for r in runs[ENGINES[0]].records]
        for run in runs.values())
    t = Table(["engine", "workers", "tasks", "wall s", "Σ task s", "overhead s per task (wall·workers − Σ)/tasks",
               "failed"], [list(r) for r in rows])
    ckpt = tiny_checkpoint(tmp / "tiny.safetensors")
    tiny = lambda n: [Task(HeadSpec(str(ckpt), i % 2, (i // 2) % 2, 0, 2), "exact", defenses[0], seed=i)  # noqa: E731
                      for i in range(n)]
    small, _ = time_engines(tiny(args.tiny_tasks), tmp, "tiny")
    large, _ = time_engines(tiny(3 * args.tiny_tasks), tmp, "tiny3")
    t2 = Table(["engine", "workers", f"wall s, {args.tiny_tasks} tasks", f"wall s, {3 * args.tiny_tasks} tasks",
                "start-up s", "wall s per extra task", "Σ task s per task"])
    for a, b in zip(small, large):
        per = (b[3] - a[3]) / (b[2] - a[2])
        t2.add(a[0], a[1], a[3], b[3], a[3] - a[2] * per, per, b[4] / b[2])
    body = (f"MiniLM-L6 layers {args.layers}, heads {args.heads}, defences {args.defense}, --method {args.method} "
            f"({len(tasks)} tasks). The same records (every number but the seconds) on every engine: "
            f"{'yes' if same else 'NO'}.\n\n{t.markdown()}\n\nWhat the audit reports (verdicts of the 2-worker "
            f"process-pool run):\n\n{verdicts(runs[('processes', 2)]).markdown()}\n\nOverhead of the engines, "
            f"measured on tiny heads (d = 16: each extraction takes milliseconds, so the wall time is start-up and "
            f"dispatch): start-up = wall time not explained by the tasks, per extra task = the slope between "
            f"the two batch sizes.\n\n{t2.markdown()}\n")
    write_section(SECTION, body, command_line())
    print(body)


if __name__ == "__main__":
    main()
