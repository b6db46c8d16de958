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
    tiny = [Task(HeadSpec(str(ckpt), i % 2, (i // 2) % 2, 0, 2), "exact", defenses[0], seed=i)
            for i in range(args.tiny_tasks)]
    tiny_rows, _ = time_engines(tiny, tmp, "tiny")
    t2 = Table(["engine", "workers", "tiny tasks (d = 16)", "wall s (incl. start-up)", "Σ task s",
                "overhead s per task", "failed"], [list(r) for r in tiny_rows])
    body = (f"MiniLM-L6 layers {args.layers}, heads {args.heads}, defences {args.defense}, --method {args.method} "
            f"({len(tasks)} tasks). The same records (every number but the seconds) on every engine: "
            f"{'yes' if same else 'NO'}.\n\n{t.markdown()}\n\nWhat the audit reports (verdicts of the 2-worker "
            f"process-pool run):\n\n{verdicts(runs[('processes', 2)]).markdown()}\n\nPer-task overhead of the "
            f"engines on tiny heads (the extraction takes milliseconds, so the wall time is start-up and "
            f"dispatch):\n\n{t2.markdown()}\n")
    write_section(SECTION, body, command_line())
    print(body)


if __name__ == "__main__":
    main()
