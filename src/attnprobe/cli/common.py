"""What every subcommand shares: the summary printout, per-parameter relative errors, the queries a run
spent (for the message that ends it) and the checks of output paths made before any query."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path


from attnprobe.errors import CheckFailedError, ConfigError

from attnprobe.models.compare import relative_error, relative_errors  # noqa: E402,F401  (re-exported)


def print_summary(res, out=None) -> None:
    per = res.queries / res.unknowns if res.unknowns else float("nan")
    print(f"method {res.method}  d={res.d}  queries {res.queries} for {res.unknowns} unknowns "
          f"({per:.4f} per unknown)  {res.seconds:.2f} s")
    if res.check is not None:
        replayed = (res.details.get("oracle") or {}).get("check_answered_by") == "the query log (replay)"
        which, by = ("", " answered by the query log (replay, not asked afresh)") if replayed else ("fresh ", "")
        print(f"functional check: relative error {res.check.error:.3e} on {res.check.queries} {which}sequences "
              f"of lengths {list(res.check.lengths)}{by}")
    for note in res.notes:
        print(f"note: {note}")
    if out:
        print(f"wrote {out[0]} and {out[1]}")


def track(args, oracle) -> None:
    """Remember the oracle of this run so that every message ending it can say how many queries it spent."""
    args.tracked_oracle = oracle


def queries_spent(args) -> str:
    """``"123 queries spent (not logged)"``: the tail of every message that ends a run."""
    oracle = getattr(args, "tracked_oracle", None)
    if oracle is None:
        return "no queries spent"
    if hasattr(oracle, "from_log"):  # an Oracle: asked vs answered from the log, and the assumed precision
        return spent(oracle)
    n = getattr(oracle, "queries", 0)
    log = getattr(args, "log", None)
    return f"{n} queries spent ({'logged in ' + str(log) if log else 'not logged'})"


def assumed_precision(oracle) -> str:
    """How the run read the answers' precision, for messages where it matters (no "; " inside)."""
    detector = getattr(oracle, "detector", None)
    if detector is None:
        from attnprobe.oracles.wrappers import declared_attribute

        cause = declared_attribute(getattr(oracle, "fn", None), "precision_cause")
        return f"answers taken as {oracle.precision} ({cause or 'declared'})"
    if not detector.decided:
        return ("answers taken as float64: too few answers to read their precision (declare it with "
                "--answer-precision if it is coarser)")
    return f"answers look like {detector.precision} (read from {detector.seen} answers, --answer-precision overrides)"


def spent(oracle) -> str:
    """The tail of every message that ends a run: the precision assumed (when read from the answers or coarser
    than float64), then ``N queries spent (...)`` saying whether and where they are logged."""
    asked = oracle.queries - getattr(oracle, "from_log", 0)
    log = getattr(oracle, "log", None)
    if log is None:
        where = f"{asked} queries spent (not logged)"
    elif log.refused:
        where = f"{asked} queries spent (asked to recognise the oracle of {log.path}; nothing logged)"
    elif log.readonly:
        where = f"0 queries spent (replay: {getattr(oracle, 'from_log', 0)} answered from {log.path})"
    else:
        where = (f"{asked} queries spent (logged in {log.path} with {getattr(oracle, 'from_log', 0)} more answered "
                 f"from it, {len(log)} answers in all: rerun the same command to resume)")
    detector = getattr(oracle, "detector", None)
    if (detector is None and oracle.precision == "float64") or (detector is not None and detector.seen == 0):
        return where  # float64 declared, or no fractional answer seen yet (e.g. 0/1 answers): nothing to say
    return f"{assumed_precision(oracle)}; {where}"


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name the same file (through symlinks, hard links and relative spellings)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # a symlink loop: compare the spellings
        return os.path.abspath(a) == os.path.abspath(b)


#: characters the atomic save adds to a file name for its temporary file (".NAME.XXXXXXXX.part")
TEMP_NAME_EXTRA = 16


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (through symlinks and relative spellings)."""
    try:
        p, f = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    except (OSError, ValueError):
        return False
    return p == f or f in p.parents


def hf_inputs(hf_dir) -> tuple[list[Path], list[Path]]:
    """A Hugging Face folder's input files and the folders no output may go into: the folder itself and those its
    files live in through symlinks."""
    if not hf_dir:
        return [], []
    files = [Path(hf_dir) / "config.json", Path(hf_dir) / "model.safetensors"]
    return files, [Path(hf_dir)] + [Path(os.path.realpath(f)).parent for f in files]


def flag_param(flag: str) -> str:
    """The parameter a flag sets: ``"--api-key"`` → ``"api_key"``."""
    return flag.lstrip("-").replace("-", "_")


def plan_outputs(out, inputs=(), flag: str = "--out", folders=()) -> tuple[Path, Path]:
    """OUT.npz and OUT.json for ``--out``, checked before any query is asked (:func:`plan_file`; ``folders``:
    input folders, such as a Hugging Face model folder, where no output may go)."""
    from attnprobe.models.io import npz_path

    text = str(out)
    if not text.strip() or text.endswith(("/", os.sep)) or Path(text).name in ("", ".", ".."):
        raise ConfigError(f"{flag} names the .npz file of the result; got {text!r}, which is not a file name",
                          param=flag_param(flag))
    if Path(text).exists() and not Path(text).is_file():
        raise ConfigError(f"{flag}: {text} exists and is not a regular file; give a file path", param=flag_param(flag))
    try:
        npz = npz_path(out)
    except ConfigError:
        raise ConfigError(f"{flag} names the .npz file of the result (a JSON summary goes beside it); "
                          f"got {out}", param=flag_param(flag)) from None
    return plan_file(npz, inputs, flag, folders), plan_file(npz.with_suffix(".json"), inputs, flag, folders)


def plan_file(path, inputs=(), flag: str = "--out", folders=()) -> Path:
    """Refuse an output ``path`` that is one of the run's ``inputs`` (the target file, the oracle's module, the
    query log) or lies in one of its input ``folders``, an existing folder or special file, or in a folder that
    cannot take a new file."""
    path = Path(path)
    for folder in folders:
        if folder is not None and inside(path, Path(folder)):
            raise ConfigError(f"{flag} {path} is inside the input folder {folder}, whose files it could overwrite; "
                              "write the result outside it", param=flag_param(flag))
    for inp in inputs:
        if inp is not None and same_file(path, Path(inp)):
            raise ConfigError(f"{flag} would overwrite the input {inp} (as {path}); choose another path",
                              param=flag_param(flag))
    if path.exists() and not path.is_file():
        raise ConfigError(f"{flag}: {path} exists and is not a regular file", param=flag_param(flag))
    writable_folder(path.parent, flag)
    try:
        name_max = os.pathconf(_existing(path.parent), "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if len(path.name.encode()) + TEMP_NAME_EXTRA > name_max:
        raise ConfigError(f"{flag}: the file name {path.name[:40]}... has {len(path.name.encode())} bytes; this "
                          f"folder allows {name_max - TEMP_NAME_EXTRA} (room is kept for a temporary name while "
                          "saving); choose a shorter name", param=flag_param(flag))
    return path


def _existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def writable_folder(folder: Path, flag: str) -> None:
    """Refuse early when ``folder`` (or, if it does not exist yet, its nearest existing parent) cannot hold a
    new file: probed by creating and removing a temporary file there."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{flag}: {probe} is not a folder, so {folder} cannot be created", param=flag_param(flag))
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot write in {probe} ({exc.strerror}); choose a writable folder",
                          param=flag_param(flag)) from None


def _number(text: str, cast, ok, what: str):
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}; got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    return _number(text, int, lambda x: x >= 1, "an integer ≥ 1")


def nonneg_int(text: str) -> int:
    """argparse type: an integer ≥ 0 (seeds, budgets)."""
    return _number(text, int, lambda x: x >= 0, "an integer ≥ 0")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    return _number(text, float, lambda x: math.isfinite(x) and x > 0, "a finite number > 0")


def finite_float(text: str) -> float:
    """argparse type: a finite number (the learner checks its range and names the parameter)."""
    return _number(text, float, math.isfinite, "a finite number")


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (MemAvailable on Linux), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return None


def refuse_memory(nbytes: float, what: str, param: str) -> None:
    """Refuse up front (no query asked) when ``what`` needs more memory than is available (``param``: the
    parameter that sets the size)."""
    avail = available_memory()
    if avail is not None and nbytes > avail:
        raise ConfigError(f"{what} needs about {nbytes / 2**30:.1f} GiB of memory but {avail / 2**30:.1f} GiB are "
                          "available; use a smaller width or a machine with more memory", param=param)


def check_outcome(res, kept: bool = False) -> CheckFailedError | None:
    """The error that ends a run whose functional check failed (None when it passed or has no verdict)."""
    from attnprobe.learners.core.skeleton import failed_check_hint

    if res.passed is not False:
        return None
    chk = res.check
    said = ("the recovered model is not certified: " if chk.verdict == "uncertified"
            else "the recovered model does not describe the oracle: ")
    return CheckFailedError(
        said + chk.describe() + failed_check_hint(chk, res.notes) + "; "
        + ("written anyway (--keep-failed; the JSON says passed: false)" if kept
           else "nothing written (--keep-failed writes it anyway)"))
