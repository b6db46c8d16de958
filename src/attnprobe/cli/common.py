"""What every subcommand shares: the summary printout and per-parameter relative errors."""

from __future__ import annotations

from attnprobe.reports.metrics import relative_errors  # noqa: F401 - re-exported to the subcommands


def print_summary(res, out=None) -> None:
    s = res.summary()
    chk = s["check"] or {}
    print(f"method {s['method']}  d={s['d']}  queries {s['queries']} for {s['unknowns']} unknowns "
          f"({s['queries_per_unknown']:.4f} per unknown)  {s['seconds']:.2f} s")
    if chk:
        print(f"functional check: relative error {chk['relative_error']:.3e} on {chk['queries']} fresh sequences "
              f"of lengths {chk['lengths']}")
    for note in s["notes"]:
        print(f"note: {note}")
    if out:
        print(f"wrote {out[0]} and {out[1]}")
