"""Shared helpers for benchmark scripts: markdown tables and replacing one section of docs/benchmarks.md."""

from __future__ import annotations

import platform
import re
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

DOCS = Path(__file__).resolve().parent.parent / "docs"
BENCHMARKS_MD = DOCS / "benchmarks.md"


from attnprobe.models.compare import relative_error as rel  # noqa: E402,F401  (the library's one formula)


def table(headers: list[str], rows: list[list]) -> str:
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.2e}" if (x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e5)) else f"{x:.3g}"
        return str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


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


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__}"


def write_section(title: str, body: str, command: str) -> None:
    """Replace (or append) the section ``## title`` of docs/benchmarks.md with ``body``."""
    DOCS.mkdir(exist_ok=True)
    header = "# Benchmarks\n\nAll numbers were measured on this project's machine; each section names its command.\n"
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else header
    stamp = time.strftime("%Y-%m-%d")
    section = f"## {title}\n\nCommand: `{command}` ({stamp}; {machine()})\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    BENCHMARKS_MD.write_text(text)
    print(f"wrote section '{title}' of {BENCHMARKS_MD}", file=sys.stderr)
