"""Shared helpers of the issue-4 benchmarks: Thm 6.1 targets, errors, and writing table fragments."""

from __future__ import annotations

import sys
from pathlib import Path


from attnprobe.targets.theorem_heads import margin, theorem_head  # noqa: F401 - re-exported to the scripts
from report import rel  # noqa: F401 - re-exported to the scripts

DOCS = Path(__file__).resolve().parent.parent / "docs"
FRAG = DOCS / "issue4"


def write_fragment(name: str, title: str, command: str, table: str, extra: str = "") -> None:
    FRAG.mkdir(parents=True, exist_ok=True)
    text = f"### {title}\n\n`{command}`\n\n{table}\n{extra}\n"
    (FRAG / f"{name}.md").write_text(text)
    print(text)


def md_table(header, rows) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def command() -> str:
    return "python " + " ".join(["benchmarks/" + Path(sys.argv[0]).name] + sys.argv[1:])
