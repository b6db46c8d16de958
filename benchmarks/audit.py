"""`attnprobe audit` wall times: the process pool with 1 and 2 workers and a local Ray cluster on the same
MiniLM-L6 heads and defences, the verdicts the audit reports, and each engine's per-task overhead measured on
tiny heads (d = 16) where the extraction itself takes milliseconds.

    python benchmarks/audit.py [--parts minilm,overhead] [--layers 0] [--heads 0-1]
        [--defense none,float32,float16] [--method exact] [--tiny-tasks 40]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from attnprobe.audit import HeadSpec, Task, parse_defenses, run_audit
from attnprobe.audit.report import verdicts
from attnprobe.cli.audit import parse_range
from attnprobe.reports import Table
from sections import command_line, write_section

DOC = "audit"  # its results file: docs/benchmarks/audit.md
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


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def minilm_part(args, tmp: Path) -> None:
    """Wall time of one audit of real MiniLM heads on each engine, and its verdicts."""
    before = load()
    tasks = [Task(HeadSpec("minilm", layer, head), args.method, d)
             for d in parse_defenses(args.defense) for layer in parse_range(args.layers, 6, "layers")
             for head in parse_range(args.heads, 12, "heads")]
    rows, runs = time_engines(tasks, tmp, "minilm")
    same = all(
        [{k: v for k, v in r.items() if k != "seconds"} for r in run.records]
        == [{k: v for k, v in r.items() if k != "seconds"} for r in runs[ENGINES[0]].records]
        for run in runs.values())
    t = Table(["engine", "workers", "tasks", "wall s", "Σ task s", "overhead s per task (wall·workers − Σ)/tasks",
               "failed"], [list(r) for r in rows])
    body = (f"MiniLM-L6 layers {args.layers}, heads {args.heads}, defences {args.defense}, --method {args.method} "
            f"({len(tasks)} tasks); machine shared with other jobs ({before} at the start, {load()} at the end), "
            f"so the seconds are noisy. The same records (every number but the seconds) on every engine: "
            f"{'yes' if same else 'NO'}.\n\n{t.markdown()}\n\nWhat the audit reports (verdicts of the 2-worker "
            f"process-pool run):\n\n{verdicts(runs[('processes', 2)]).markdown()}\n")
    write_section("MiniLM heads on each engine", body, command_line(), parent=SECTION, doc=DOC)


def overhead_part(args, tmp: Path) -> None:
    """Start-up and per-task cost of each engine, on tiny heads whose extraction takes milliseconds."""
    before = load()
    ckpt = tiny_checkpoint(tmp / "tiny.safetensors")
    tiny = lambda n: [Task(HeadSpec(str(ckpt), i % 2, (i // 2) % 2, 0, 2), "exact", seed=i)  # noqa: E731
                      for i in range(n)]
    n1, n2 = args.tiny_tasks, 10 * args.tiny_tasks
    small, _ = time_engines(tiny(n1), tmp, "tiny")
    large, _ = time_engines(tiny(n2), tmp, "tiny10")
    t = Table(["engine", "workers", f"wall s, {n1} tasks", f"wall s, {n2} tasks", "start-up s",
               "wall s per extra task", "Σ task s per task"])
    for a, b in zip(small, large):
        per = (b[3] - a[3]) / (b[2] - a[2])
        t.add(a[0], a[1], a[3], b[3], a[3] - a[2] * per, per, b[4] / b[2])
    body = (f"Tiny heads (d = 16, undefended): each extraction takes milliseconds, so the wall time is the engine's "
            f"start-up and dispatch. Start-up = wall time not explained by the tasks; per extra task = the slope "
            f"between the two batch sizes ({before} at the start, {load()} at the end); a slope near zero or below "
            f"means the engine's cost per task is under the timing noise of this shared machine.\n\n{t.markdown()}\n")
    write_section("Engine overhead", body, command_line(), parent=SECTION, doc=DOC)


PARTS = {"minilm": minilm_part, "overhead": overhead_part}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
    p.add_argument("--layers", default="0")
    p.add_argument("--heads", default="0-1")
    p.add_argument("--defense", default="none,float32,float16")
    p.add_argument("--method", default="exact")
    p.add_argument("--tiny-tasks", type=int, default=40)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="attnprobe-audit-bench-"))
    for name in args.parts.split(","):
        PARTS[name](args, tmp)


if __name__ == "__main__":
    main()
