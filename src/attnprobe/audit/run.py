"""Drive an audit: run the tasks on an engine with a progress bar, save each recovered head as it arrives,
then write ``results.json`` and ``report.html`` (also after Ctrl-C, with what finished)."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from attnprobe.audit.engines import ENGINES
from attnprobe.audit.tasks import Task
from attnprobe.errors import ConfigError
from attnprobe.learners.result import _jsonable
from attnprobe.models.io import model_class, save_model
from attnprobe.progress import Progress


@dataclass
class AuditRun:
    """What an audit produced: one record per finished task (in task order) and how the run went."""

    engine: str
    tasks: list[Task]
    records: list[dict]
    interrupted: bool
    seconds: float
    out: Path
    info: dict = field(default_factory=dict)
    terminated: bool = False  # stopped by SIGTERM rather than Ctrl-C

    @property
    def defenses(self) -> list[str]:
        return list(dict.fromkeys(t.defense.name for t in self.tasks))

    def summary(self) -> dict:
        failed = sum(1 for r in self.records if r["error"])
        return _jsonable({"engine": self.engine, **self.info, "defenses": self.defenses, "tasks": len(self.tasks),
                          "finished": len(self.records), "failed": failed, "interrupted": self.interrupted,
                          "seconds": self.seconds, "heads": self.records})


def head_file(task: Task, several_defenses: bool, several_learners: bool = False) -> str:
    """``heads/L{layer}H{head}.npz`` (``L{layer}.npz`` for a whole layer); with several defences the defended
    ones get ``_{defence}``; where several learners ran on a defence, its files get ``_{learner}``."""
    name = task.head.name
    if several_defenses and task.defense.name != "none":
        name += f"_{task.defense.slug}"
    if several_learners:
        name += f"_{task.learner}"
    return f"heads/{name}.npz"


def run_audit(tasks: Sequence[Task], out: str | Path, *, engine: str = "processes", workers: int = 1,
              address: str | None = None, progress: bool = True, info: dict | None = None) -> AuditRun:
    """Run every task, write ``out/heads/*.npz``, ``out/results.json`` and ``out/report.html``."""
    from attnprobe.audit.report import write_report

    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if not tasks:
        raise ConfigError("the audit has no tasks: check the layers, heads and defences asked for")
    out = Path(out)
    (out / "heads").mkdir(parents=True, exist_ok=True)
    several = len({t.defense.name for t in tasks}) > 1
    learners_per_defense = {name: len({t.learner for t in tasks if t.defense.name == name})
                            for name in {t.defense.name for t in tasks}}
    bar = Progress(f"audit ({engine})", enabled=progress, delay=0.0, unit="task")
    done = [0]
    bar(0, len(tasks))

    def on_result(i: int, rec: dict) -> None:
        arrays = rec.pop("arrays", None)
        rec["file"] = None
        if arrays is not None:
            task = tasks[i]
            rec["file"] = head_file(task, several, learners_per_defense[task.defense.name] > 1)
            save_model(model_class(rec["kind"]).from_arrays(arrays), out / rec["file"])
        done[0] += 1
        bar(done[0], len(tasks))

    terminated = []

    def on_sigterm(signum, frame):  # stop like Ctrl-C (keep what finished); the CLI exits 143
        terminated.append(signum)
        raise KeyboardInterrupt

    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, on_sigterm)
    t0 = time.perf_counter()
    def on_result_saved(i: int, rec: dict) -> None:
        """A head that cannot be saved (full disk, file-size limit) is a failed task; the audit goes on."""
        try:
            on_result(i, rec)
        except ConfigError as exc:
            rec["file"], rec["error"] = None, f"the recovered model could not be saved: {exc}"
            done[0] += 1
            bar(done[0], len(tasks))

    try:
        if engine == "ray":
            records, interrupted = ENGINES[engine](tasks, on_result_saved, address=address, workers=workers)
        else:
            records, interrupted = ENGINES[engine](tasks, on_result_saved, workers=workers)
    finally:
        bar.close()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    run = AuditRun(engine, list(tasks), [r for r in records if r is not None], interrupted,
                   time.perf_counter() - t0, out, dict(info or {}, workers=workers, address=address))
    run.terminated = bool(terminated)
    try:
        (out / "results.json").write_text(json.dumps(run.summary(), indent=2) + "\n")
        write_report(run, out / "report.html")
    except OSError as exc:
        raise ConfigError(f"cannot write the audit's results in {out}: {exc.strerror or exc}") from None
    return run
