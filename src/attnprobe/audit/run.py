"""Drive an audit: run the tasks on an engine with a progress bar, save each recovered head as it arrives,
then write ``results.json`` and ``report.html`` (also after Ctrl-C, with what finished).

Each finished task is appended to ``finished.jsonl`` (flushed to disk) as soon as its head file is saved, so an
audit killed at any moment (even SIGKILL) and rerun into the same folder redoes only the tasks that had not
finished; ``resume=False`` starts afresh.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import time
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from attnprobe.audit.engines import ENGINES, signals_held
from attnprobe.audit.tasks import HeadSpec, Task
from attnprobe.errors import ConfigError
from attnprobe.learners.core.result import jsonable
from attnprobe.models.io import json_writer, model_class, save_model, write_files
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
        return jsonable({"engine": self.engine, **self.info, "defenses": self.defenses, "tasks": len(self.tasks),
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


JOURNAL = "finished.jsonl"


def task_key(task: Task) -> str:
    """What makes two tasks the same work: head spec, method, defence, seed, budget and rank (a spec's ``block``
    only when set, so journals written before blocks were audited keep their keys)."""
    spec = asdict(task.head)
    if not spec["block"]:
        del spec["block"]
    return json.dumps([spec, task.method, task.defense.name, task.seed, task.budget, task.rank])


def _fingerprint(source: str) -> str:
    """``sha256:…`` of a checkpoint's bytes (``minilm``: the installed weights), so that a journal written for one
    model is never read for another, even under the same file name."""
    from attnprobe.oracles.querylog import file_sha256

    if Path(source).is_dir():  # a Hugging Face folder: its weights and the config that says how to read them
        return "sha256:" + "+".join(file_sha256(Path(source) / f) for f in ("model.safetensors", "config.json"))
    return "sha256:" + file_sha256(HeadSpec(source, 0, 0).checkpoint().path if source == "minilm" else source)


#: the settings that change every task's numbers: a journal is reused only under the same ones
SETTINGS = ("tasks", "seed", "budget", "rank", "row", "heads_per_layer")


def audit_identity(tasks: Sequence[Task]) -> dict:
    """What a journal must match to be reused: the models audited (by content) and the values of each of
    :data:`SETTINGS` over the tasks (defences, learners, layers and heads may differ: a rerun may add or drop
    some)."""
    values = {k: set() for k in SETTINGS}
    for t in tasks:
        for k, v in (("tasks", t.head.kind.name), ("seed", t.seed), ("budget", t.budget), ("rank", t.rank),
                     ("row", t.head.row), ("heads_per_layer", t.head.heads_per_layer)):
            values[k].add(v)
    sources = sorted({t.head.source for t in tasks})
    return {"models": {s: _fingerprint(s) for s in sources},
            "settings": {k: sorted(v, key=lambda x: (x is None, str(x))) for k, v in values.items()}}


def _journal_identity(path: Path) -> dict | None:
    """The identity line a journal starts with (None for a journal without one, or an unreadable first line)."""
    with open(path, errors="replace") as f:
        first = f.readline()
    try:
        entry = json.loads(first)
    except ValueError:
        return None
    return entry.get("audit") if isinstance(entry, dict) and isinstance(entry.get("audit"), dict) else None


def _holds_records(path: Path) -> bool:
    """Whether a journal holds at least one readable task record (a line with a key and a record)."""
    with open(path, errors="replace") as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and "key" in entry and "record" in entry:
                return True
    return False


def refuse_other_journal(out: Path, identity: dict) -> None:
    """Refuse (one :class:`ConfigError`, nothing touched) a ``finished.jsonl`` in ``out`` written by an audit of
    another model or with other :data:`SETTINGS`: its tasks would be dropped, and with them its head files."""
    what = _other_audit(out, identity)
    if what == _NO_IDENTITY:
        raise ConfigError(f"{out / JOURNAL} holds finished tasks but no readable identity line (cut short or "
                          "damaged): they cannot be told to be of these weights and settings; give --fresh to replace "
                          "it, or another --out folder", param="fresh")
    if what:
        raise ConfigError(f"{out / JOURNAL} records an audit {what}; give --fresh to replace it, or another "
                          "--out folder", param="fresh")


#: what :func:`_other_audit` says of a journal with records but no readable identity line
_NO_IDENTITY = "with no readable identity line"


def _other_audit(out: Path, identity: dict) -> str | None:
    """How the audit ``out/finished.jsonl`` records differs from this one (None: the same, or no journal)."""
    path = out / JOURNAL
    if not path.is_file():
        return None
    theirs = _journal_identity(path)
    if theirs is None:
        return _NO_IDENTITY if _holds_records(path) else None  # cut or damaged: its records cannot be matched
    what = []
    if _weights(theirs.get("models")) != _weights(identity["models"]):  # by content: a moved file is the same
        what.append(f"of other weights ({_described(theirs.get('models'))} there, {_described(identity['models'])} "
                    "here)")
    differ = [k for k in SETTINGS if (theirs.get("settings") or {}).get(k) != identity["settings"][k]]
    if differ:
        what.append("with other " + ", ".join(f"{k} ({_listed(theirs.get('settings', {}).get(k))} there, "
                                              f"{_listed(identity['settings'][k])} here)" for k in differ))
    return " and ".join(what) or None


def _weights(models) -> list[str] | None:
    """The checkpoints' fingerprints of a journal's identity, whatever paths named them."""
    return sorted(map(str, models.values())) if isinstance(models, dict) else None


def _described(models) -> str:
    if not isinstance(models, dict) or not models:
        return "none"
    return ", ".join(f"{Path(k).name} {v}" for k, v in models.items())


def _listed(values) -> str:
    return "/".join("none" if v is None else str(v) for v in values) if isinstance(values, list) else "none"


def content_key(key: str, models: dict | None) -> str:
    """A :func:`task_key` with its checkpoint named by content (``models``: path -> fingerprint, as in
    :func:`audit_identity`): the same weights under another path or spelling are the same work."""
    try:
        parts = json.loads(key)
        source = parts[0]["source"]
        parts[0]["source"] = (models or {}).get(source, source)
    except (ValueError, KeyError, TypeError, IndexError):
        return key
    return json.dumps(parts)


def _journal_entries(out: Path) -> list[tuple[str, dict]]:
    """``(task key by content, record)`` of every whole line of ``out/finished.jsonl`` (a line cut short by a kill,
    or not a record, is skipped), in the order written: a key written twice is a task redone, and its last line
    counts."""
    path = out / JOURNAL
    entries = []
    if path.is_file():
        models = (_journal_identity(path) or {}).get("models")
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
                key, rec = entry["key"], dict(entry["record"])
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(key, str):
                entries.append((content_key(key, models), rec))
    return entries


def _written_file(rec: dict) -> str | None:
    """The head file a journal record names, if it is one an audit writes (``heads/NAME.npz``), else None."""
    name = rec.get("file")
    if isinstance(name, str) and name.startswith("heads/") and name.endswith(".npz") and name.count("/") == 1 \
            and ".." not in name:
        return name
    return None


def _finished(out: Path, tasks: Sequence[Task], entries: list[tuple[str, dict]], models: dict) -> dict[int, dict]:
    """Records of ``tasks`` that the journal ``entries`` hold (with their head file still there), by task index.
    Nothing is removed: the journal keeps the records of tasks this run does not ask for (a narrower rerun
    keeps what a wider one finished) and every file in ``out`` stays."""
    keys = {content_key(task_key(t), models): i for i, t in enumerate(tasks)}
    found: dict[int, dict] = {}
    for key, rec in entries:
        i = keys.get(key)
        if i is None:
            continue
        name = _written_file(rec)
        if rec.get("file") is None or (name is not None and (out / name).is_file()):
            found[i] = rec
        else:
            found.pop(i, None)  # its head file is gone: the task is run again
    return found


def _claimed_files(entries: list[tuple[str, dict]]) -> dict[str, str]:
    """Head file -> the task key whose (latest) journal record names it."""
    claimed: dict[str, str] = {}
    for key, rec in entries:
        name = _written_file(rec)
        if name is not None:
            claimed[name] = key
    return claimed


def _holds(path: Path, arrays: dict | None) -> bool:
    """Whether ``path`` is a saved model holding exactly ``arrays`` (this task's own file, written before a kill cut
    its journal line: the rerun computes the same arrays)."""
    if arrays is None or not path.is_file():
        return False
    try:
        with np.load(path, allow_pickle=False) as saved:
            return set(saved.files) - {"kind"} == set(arrays) and all(
                np.array_equal(saved[k], np.asarray(arrays[k])) for k in arrays)
    except (OSError, ValueError, zipfile.BadZipFile):
        return False


def _free_name(task: Task, name: str, claimed: dict[str, str], out: Path, models: dict,
               arrays: dict | None = None) -> str:
    """``name``, or (when a journal record of another task names it, or a file the journal does not know is there
    and does not hold this task's arrays) a longer name with the defence and learner, then a number: a head file of
    another task, or a user's own file, is never overwritten."""
    key = content_key(task_key(task), models)

    def free(n: str) -> bool:
        if claimed.get(n, key) != key:
            return False
        return n in claimed or not (out / n).exists() or _holds(out / n, arrays)

    if free(name):
        return name
    long = head_file(task, True, True).removesuffix(".npz")
    if task.defense.name == "none":
        long = long.replace(f"_{task.learner}", f"_none_{task.learner}")
    for n in [f"{long}.npz", *(f"{long}_{k}.npz" for k in range(2, 10_000))]:
        if free(n):
            return n
    raise ConfigError(f"no free head file name for {name} in {out}", param="out")  # pragma: no cover - 10,000 taken


def _journal(out: Path, task: Task, rec: dict, identity: dict) -> None:
    """Append a finished task's record (the journal starts with the audit's identity line); a line cut short by an
    earlier kill is ended first, so the new line stays whole. A journal that cannot be written (full disk,
    file-size limit) ends the audit with a :class:`ConfigError`; a journal this call created is removed again."""
    path = out / JOURNAL
    new, size = not path.exists(), None
    try:
        with open(path, "ab+", opener=_no_symlink) as f:
            size = f.seek(0, os.SEEK_END)
            head = b""
            if size == 0:
                head = (json.dumps({"audit": identity}) + "\n").encode()
            else:
                f.seek(size - 1)
                head = b"" if f.read(1) == b"\n" else b"\n"
            f.seek(0, os.SEEK_END)
            f.write(head + (json.dumps({"key": task_key(task), "record": jsonable(rec)}) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        if new:
            with contextlib.suppress(OSError):
                path.unlink()
        elif size is not None:
            with contextlib.suppress(OSError):  # a partly written line is cut off again
                os.truncate(path, size)
        raise ConfigError(f"cannot record a finished task in {path} ({exc.strerror or exc}); the audit stopped, "
                          "the tasks recorded before are kept: make room (disk space, file-size limit) and rerun the "
                          "same command to resume", param="out") from None


def _no_symlink(path, flags):
    """``open``'s opener that refuses to follow a symlink at the last step (the journal is never written through
    one: it could point at any file)."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)


#: the folder of ``out`` holding the query logs of block tasks that have not finished
LOGS = "logs"


def with_query_logs(tasks: Sequence[Task], out: Path, models: dict) -> list[Task]:
    """The tasks, each block task given its query log ``out/logs/B{layer}-{key hash}.sqlite`` (an absolute path: a
    worker may run in another folder), named by the task's work with its folder named by content
    (:func:`content_key`), so a rerun finds it whatever path spells the folder."""
    def log(t: Task) -> str:
        key = hashlib.sha256(content_key(task_key(t), models).encode()).hexdigest()[:12]
        return str((out / LOGS / f"{t.head.name}-{key}.sqlite").resolve())

    return [replace(t, log=log(t)) if t.head.block and t.log is None else t for t in tasks]


def drop_query_log(task: Task) -> None:
    """Remove a finished task's query log (its record is in the journal; the answers are not needed again)."""
    if task.log is not None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                Path(task.log + suffix).unlink()


def refuse_odd_files(out: Path) -> None:
    """Refuse (one :class:`ConfigError`, before any task runs) an ``out`` folder where the audit's own names are
    taken by something it cannot write as intended: a symlink (it could point anywhere), a folder, a FIFO."""
    for name, folder in ((JOURNAL, False), ("results.json", False), ("report.html", False), ("heads", True)):
        p = out / name
        if p.is_symlink() or (p.exists() and not (p.is_dir() if folder else p.is_file())):
            what = "a symlink" if p.is_symlink() else "not a folder" if folder else "not a regular file"
            raise ConfigError(f"{p} is {what}, where the audit writes {'its head files' if folder else 'its ' + name}: "
                              "move it away or give another --out folder", param="out")


def _forget_written(out: Path, entries: list[tuple[str, dict]]) -> None:
    """``--fresh``: remove the head files the journal says an audit wrote, then the journal (nothing else)."""
    for name in sorted(_claimed_files(entries)):
        with contextlib.suppress(OSError):
            (out / name).unlink()
    (out / JOURNAL).unlink(missing_ok=True)


def run_audit(tasks: Sequence[Task], out: str | Path, *, engine: str = "processes", workers: int = 1,
              address: str | None = None, progress: bool = True, info: dict | None = None,
              resume: bool = True) -> AuditRun:
    """Run every task, write ``out/heads/*.npz``, ``out/results.json`` and ``out/report.html``; with ``resume``,
    tasks that ``out/finished.jsonl`` records as finished are not run again (their records are reused)."""
    from attnprobe.audit.report import write_report

    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}", param="engine")
    if not tasks:
        raise ConfigError("the audit has no tasks: check the layers, heads and defences asked for", param="tasks")
    if engine == "ray" and address:  # a dead address is refused before anything in ``out`` is touched
        from attnprobe.audit.engines import reachable

        reachable(address)
    out = Path(out)
    identity = audit_identity(tasks)
    refuse_odd_files(out)
    tasks = with_query_logs(tasks, out, identity["models"])
    if resume:
        refuse_other_journal(out, identity)
    (out / "heads").mkdir(parents=True, exist_ok=True)
    several = len({t.defense.name for t in tasks}) > 1
    learners_per_defense = {name: len({t.learner for t in tasks if t.defense.name == name})
                            for name in {t.defense.name for t in tasks}}
    if not resume and _other_audit(out, identity):  # --fresh over another audit: what it wrote is replaced
        _forget_written(out, _journal_entries(out))
    entries = _journal_entries(out)
    # --fresh over the same audit redoes this run's tasks (in their old files) and keeps every other record
    reused = _finished(out, tasks, entries, identity["models"]) if resume else {}
    if not resume:  # --fresh: no answer is taken from a log of an earlier run
        for t in tasks:
            drop_query_log(t)
    claimed = _claimed_files(entries)
    todo = [i for i in range(len(tasks)) if i not in reused]
    bar = Progress(f"audit ({engine})", enabled=progress, delay=0.0, unit="task")
    done = [len(reused)]
    bar(done[0], len(tasks))

    def on_result(i: int, rec: dict) -> None:
        arrays = rec.pop("arrays", None)
        rec["file"] = None
        if arrays is not None:
            task = tasks[i]
            model = model_class(rec["kind"]).from_arrays(arrays)
            rec["file"] = _free_name(task, head_file(task, several, learners_per_defense[task.defense.name] > 1),
                                     claimed, out, identity["models"], model.arrays())
            claimed[rec["file"]] = content_key(task_key(task), identity["models"])
            save_model(model, out / rec["file"])
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
    completed: dict[int, dict] = {}  # tasks whose record is in the journal: what results.json may list

    def on_result_saved(i: int, rec: dict) -> None:
        """A head that cannot be saved (full disk, file-size limit) is a failed task; the audit goes on. A task
        counts as finished once its journal line is written; Ctrl-C and SIGTERM wait the few milliseconds of saving
        and journaling, so the head file, the journal and results.json agree on which tasks finished."""
        with signals_held(signal.SIGINT, signal.SIGTERM):
            try:
                on_result(i, rec)
            except ConfigError as exc:
                rec["file"], rec["error"] = None, f"the recovered model could not be saved: {exc}"
                done[0] += 1
                bar(done[0], len(tasks))
            try:
                _journal(out, tasks[i], rec, identity)
            except ConfigError:  # no record names the head file just saved: it goes too
                if rec.get("file"):
                    with contextlib.suppress(OSError):
                        (out / rec["file"]).unlink()
                raise
            completed[i] = rec
            drop_query_log(tasks[i])

    try:
        pending = [tasks[i] for i in todo]

        def on_pending_result(j: int, rec: dict) -> None:
            on_result_saved(todo[j], rec)

        if not pending:
            interrupted = False
        elif engine == "ray":
            _, interrupted = ENGINES[engine](pending, on_pending_result, address=address, workers=workers)
        else:
            _, interrupted = ENGINES[engine](pending, on_pending_result, workers=workers)
        records = [reused.get(i, completed.get(i)) for i in range(len(tasks))]
    finally:
        bar.close()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    with contextlib.suppress(OSError):  # the logs' folder, once every task in it has finished
        (out / LOGS).rmdir()
    run = AuditRun(engine, list(tasks), [r for r in records if r is not None], interrupted,
                   time.perf_counter() - t0, out,
                   dict(info or {}, workers=workers, address=address, resumed=len(reused)))
    run.terminated = bool(terminated)
    try:
        write_files([(out / "results.json", json_writer(run.summary()))])
        write_report(run, out / "report.html")
    except (OSError, ConfigError) as exc:
        why = exc.__cause__ if isinstance(exc, ConfigError) and isinstance(exc.__cause__, OSError) else exc
        raise ConfigError(f"cannot write the audit's results in {out} ({getattr(why, 'strerror', None) or why}); "
                          f"the {len(completed) + len(reused)} finished tasks are recorded in {out / JOURNAL}: make "
                          "room (disk space, file-size limit) and rerun the same command to write them",
                          param="out") from None
    return run
