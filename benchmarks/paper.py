"""Every claim of the paper, measured (the experiments of `attnprobe reproduce`), with the report and figures
kept in docs/paper/ and the overview table in docs/benchmarks/paper.md.

    python benchmarks/paper.py [--quick]
"""

from __future__ import annotations

import argparse

from attnprobe.reports import Table
from sections import DOCS, command_line, write_section
from attnprobe.reproduce import run_claims
from attnprobe.reproduce.run import figure_name

DOC = "paper"  # its results file: docs/benchmarks/paper.md
SECTION = "Reproducing the paper (attnprobe reproduce)"


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="the small grids of `attnprobe reproduce --quick`")
    args = p.parse_args()
    out = DOCS / "paper"
    claims = run_claims(out, quick=args.quick)
    t = Table(["claim", "holds", "measured", "seconds"])
    figures = []
    for c in claims:
        t.add(c.claim, "not yet available" if c.holds is None else c.holds, c.measured, round(c.seconds, 1))
        if c.figure:
            figures.append(f"![{c.claim}](../paper/figures/{figure_name(c.claim)})")
    body = (f"{'Quick' if args.quick else 'Full'} grids; the same as `attnprobe reproduce"
            f"{' --quick' if args.quick else ''} --out docs/paper` (report: `docs/paper/report.html`, per-claim "
            f"tables in `docs/paper/results.json`).\n\n{t.markdown()}\n\n" + "\n\n".join(figures) + "\n")
    write_section(SECTION, body, command_line(), doc=DOC)


if __name__ == "__main__":
    main()
