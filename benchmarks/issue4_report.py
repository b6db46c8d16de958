"""Assemble the issue-4 section of docs/benchmarks.md from the fragments in docs/issue4/ (appends or replaces
the section headed "## Issue 4: ...")."""

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
HEAD = "## Issue 4: Imperfect answers: noisy oracles (Thm 6.1), membership queries (App. B), precision limits"
INTRO = """Measured on this machine (2 cores shared with other helpers, so seconds are noisy). Errors are against the
true parameters, which the learners never see. Scripts: `benchmarks/robust_bench.py`,
`benchmarks/membership_bench.py`, `benchmarks/precision_study.py`; this section is put together by
`python benchmarks/issue4_report.py`.
"""


def main():
    parts = [HEAD, "", INTRO]
    for name in ("robust", "minilm_tau", "membership", "precision", "precision_best"):
        f = DOCS / "issue4" / f"{name}.md"
        if f.exists():  # fragments live in docs/issue4/; the section lives in docs/
            parts.append(f.read_text().replace("](../", "]("))
    section = "\n".join(parts)
    path = DOCS / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if HEAD in text:
        start = text.index(HEAD)
        nxt = text.find("\n## ", start + len(HEAD))
        text = text[:start] + section + ("" if nxt < 0 else text[nxt:])
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


if __name__ == "__main__":
    main()
