"""Helpers of the hostile-input tests: run the CLI in-process and check the contract (exit code, exactly one
line on stderr, no traceback) and that no file in the folder was harmed."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from attnprobe.cli import main

SRC = str(Path(__file__).parents[1] / "src")


def snapshot(folder: Path) -> dict[str, str]:
    """Name -> sha256 of every regular file under ``folder``."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def run(capsys, *argv) -> tuple[int, str, str]:
    """``attnprobe argv`` in-process; returns (exit code, stdout, stderr). A traceback would propagate here."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line(err: str) -> str:
    """The single non-empty stderr line a failed run must print (asserts there is exactly one)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("attnprobe: "), lines[0]
    return lines[0]


def refused(capsys, folder: Path, *argv, code: int = 2, says: str = "") -> str:
    """Assert the run ends with ``code``, one line containing ``says``, and every file in ``folder`` unchanged
    (none added, none removed, none modified). Returns the line."""
    before = snapshot(folder)
    rc, _, err = run(capsys, *argv)
    line = one_line(err)
    assert rc == code, (rc, err)
    assert says in line, line
    assert snapshot(folder) == before
    return line


def full_disk(folder: Path, size: str, args: list[str]):
    """Run ``attnprobe args`` with ``folder`` a tmpfs of ``size`` (a private mount namespace, the cwd); returns the
    finished process (stdout ends with ``rc=N`` and the folder's files), None when this machine does not allow
    one."""
    if shutil.which("unshare") is None:
        return None
    folder.mkdir()
    cmd = (f"mount -t tmpfs -o size={size} tmpfs {folder} && cd {folder} && {sys.executable} -m attnprobe "
           + " ".join(f"'{a}'" for a in args) + "; echo rc=$?; find . | sort")
    p = subprocess.run(["unshare", "-Urm", "sh", "-c", cmd], env=dict(os.environ, PYTHONPATH=SRC),
                       capture_output=True, text=True, timeout=300)
    if "rc=" not in p.stdout:
        return None
    return p
