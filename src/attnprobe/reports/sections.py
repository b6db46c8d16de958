"""The one docs-section writer: replace (or append) one section of docs/benchmarks.md, with its command,
date and machine beside the numbers; plus the timing helpers benchmarks share."""

from __future__ import annotations

import os
import platform
import re
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]  # the checkout: src/attnprobe/reports/sections.py
DOCS = ROOT / "docs"
BENCHMARKS_MD = DOCS / "benchmarks.md"
HEADER = ("# Benchmarks\n\nEvery number here was measured on this project's machine; every table sits under the "
          "command that regenerates it.\n")


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"numpy {np.__version__}")


def command_line() -> str:
    """How this script was run, as ``python benchmarks/NAME.py ARGS`` (for the docs)."""
    script = Path(sys.argv[0])
    shown = f"benchmarks/{script.name}" if script.parent.name == "benchmarks" else str(script)
    return " ".join(["python", shown] + sys.argv[1:])


def measured(fn):
    """Run ``fn()`` and return (result, seconds, peak traced memory in MiB)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        out = fn()
    finally:
        secs = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return out, secs, peak


def _span(text: str, level: int, title: str, start: int = 0, end: int | None = None):
    """(start, end) of the section ``#…# title`` inside text[start:end]: up to the next heading of the same
    or a higher level."""
    end = len(text) if end is None else end
    hashes = "#" * level
    m = re.compile(rf"^{hashes} {re.escape(title)}[ \t]*\n", re.M).search(text, start, end)
    if m is None:
        return None
    nxt = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, m.end(), end)
    return m.start(), (nxt.start() if nxt else end)


def write_section(title: str, body: str, command: str, *, parent: str | None = None,
                  path: str | Path = BENCHMARKS_MD, stamp: bool = True) -> Path:
    """Put ``body`` under ``## title`` (or ``### title`` inside ``## parent``) of ``path``, replacing what
    was there, and leave every other section alone. The command that made the numbers heads the body."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else HEADER
    when = f" ({time.strftime('%Y-%m-%d')}; {machine()})" if stamp else ""
    level = 3 if parent else 2
    section = f"{'#' * level} {title}\n\nCommand: `{command}`{when}\n\n{body.strip()}\n\n"
    lo, hi = 0, len(text)
    if parent:
        span = _span(text, 2, parent)
        if span is None:
            text = text.rstrip("\n") + f"\n\n## {parent}\n\n"
            span = _span(text, 2, parent)
        lo, hi = span
    span = _span(text, level, title, lo, hi)
    if span is None:
        before = text[:hi].rstrip("\n") + "\n\n"
        text = before + section + text[hi:]
    else:
        text = text[:span[0]] + section + text[span[1]:]
    path.write_text(text.rstrip("\n") + "\n")
    print(f"wrote section '{title}' of {path}", file=sys.stderr)
    return path
