"""The one docs-section writer of the benchmarks: replace (or add) one section of a results file
``docs/benchmarks/<capability>.md``, with its command, date and machine beside the numbers; plus the timing
helpers benchmarks share. It lives in ``benchmarks/`` (not in the installed package): it writes this checkout's
docs, which exist only in a source checkout."""

from __future__ import annotations

import os
import platform
import re
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]  # the checkout: benchmarks/sections.py
DOCS = ROOT / "docs"
RESULTS = DOCS / "benchmarks"  # one file per capability, listed in its README.md
DESIGN_NOTES = "Design notes"  # a capability file's hand-written reading; new sections go above it
LONG_LINE = 200  # prose lines longer than this are wrapped (tables and commands are left whole)
WRAP_AT = 120


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


def results_file(doc: str | Path) -> Path:
    """The results file of a capability: ``"lowrank"`` or ``"lowrank.md"`` is docs/benchmarks/lowrank.md; a path
    with a folder is taken as it is (tests write to temporary folders)."""
    doc = Path(doc)
    if doc.parent != Path("."):
        return doc
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*(\.md)?", doc.name):
        raise ValueError(f"doc={str(doc)!r}: name a capability file of docs/benchmarks/ in lower case with "
                         "dashes, e.g. 'lowrank' or 'lowrank.md'")
    return RESULTS / (doc.name if doc.suffix == ".md" else doc.name + ".md")


def wrap_prose(text: str, limit: int = LONG_LINE, width: int = WRAP_AT) -> str:
    """Wrap the prose lines of markdown longer than ``limit`` at ``width``; tables, headings, code, images and
    ``Command:`` lines stay whole (a command is copied as one line)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        keep = (fenced or len(line) <= limit or line.startswith(("|", "#", "    ", "![", "Command:", "Commands:"))
                or line.lstrip().startswith("|"))
        if keep:
            out.append(line)
            continue
        bullet = re.match(r"(\s*(?:[-*]|\d+\.)\s+)", line)
        lead = bullet.group(1) if bullet else re.match(r"\s*", line).group(0)
        rest = " " * len(lead)
        out.extend(textwrap.wrap(line[len(lead):], width=width, initial_indent=lead, subsequent_indent=rest,
                                 break_long_words=False, break_on_hyphens=False))
    return "\n".join(out)


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


def _header(path: Path) -> str:
    title = path.stem.replace("-", " ").capitalize()
    return (f"# {title}\n\nMeasured on this project's machine; every table sits under the command that regenerates "
            "it (index: [README.md](README.md)).\n")


def publish(title: str, body: str, *, doc: str | Path, write: bool) -> None:
    """Print ``body``; with ``write`` (a benchmark's ``--write``), also put it under ``title`` in ``doc`` with the
    command that ran (:func:`write_section`)."""
    print(body)
    if write:
        write_section(title, body, command_line(), doc=doc)


def write_section(title: str, body: str, command: str, *, doc: str | Path, parent: str | None = None,
                  stamp: bool = True) -> Path:
    """Put ``body`` under ``## title`` (or ``### title`` inside ``## parent``) of the results file ``doc``
    (:func:`results_file`), replacing what was there, and leave every other section alone; a new section goes
    above the file's "Design notes". The command that made the numbers heads the body."""
    path = results_file(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else _header(path)
    when = f" ({time.strftime('%Y-%m-%d')}; {machine()})" if stamp else ""
    level = 3 if parent else 2
    section = f"{'#' * level} {title}\n\nCommand: `{command}`{when}\n\n{wrap_prose(body.strip())}\n\n"
    lo, hi = 0, len(text)
    if parent:
        span = _span(text, 2, parent)
        if span is None:
            notes = _span(text, 2, DESIGN_NOTES)
            at = notes[0] if notes else len(text)
            text = text[:at].rstrip("\n") + f"\n\n## {parent}\n\n" + text[at:]
            span = _span(text, 2, parent)
        lo, hi = span
    elif (notes := _span(text, 2, DESIGN_NOTES)) is not None:
        hi = notes[0]
    span = _span(text, level, title, lo, len(text) if parent is None else hi)
    if span is None:
        before = text[:hi].rstrip("\n") + "\n\n"
        text = before + section + text[hi:]
    else:
        text = text[:span[0]] + section + text[span[1]:]
    path.write_text(text.rstrip("\n") + "\n")
    print(f"wrote section '{title}' of {path}", file=sys.stderr)
    return path
