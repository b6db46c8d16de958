"""Assemble the Issue 3 section of docs/benchmarks.md from benchmarks/results/issue3_*.md.

    python benchmarks/issue3_report.py

Replaces the section headed HEADER (or appends it at the end of the file), leaving every other section alone.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = "## Issue 3: Low-rank heads: compressed sensing (Thm 5.1) and a query-optimal adaptive sketch"


def section() -> str:
    res = ROOT / "benchmarks" / "results"
    parts = [HEADER, "",
             "Timings: wall seconds on this 2-core machine while other jobs ran on the same cores — noisy, "
             "compare orders of magnitude only.", "",
             "### `--method lowrank` (adaptive sketch, 2dr − r² bilinear measurements)", "",
             (res / "issue3_lowrank.md").read_text().strip(), "",
             "![queries vs d](issue3_queries_vs_d.png)", "",
             "### `--method nuclear` (Thm 5.1: Gaussian rank-one measurements + nuclear-norm minimisation)", "",
             (res / "issue3_nuclear.md").read_text().strip(), "",
             "![phase transition](issue3_phase_transition.png)", "",
             "#### Solver for program (2)", "",
             (res / "issue3_solvers.md").read_text().strip(), ""]
    extra = res / "issue3_notes.md"
    if extra.exists():
        parts += [extra.read_text().strip(), ""]
    return "\n".join(parts)


def main():
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if HEADER in text:
        start = text.index(HEADER)
        nxt = text.find("\n## ", start + len(HEADER))
        text = text[:start] + section() + (text[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section()
    path.write_text(text.rstrip("\n") + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
