"""``attnprobe reproduce``: check every claim of the paper in one command (results.json, report.html)."""

from __future__ import annotations


def run(args) -> int:
    from pathlib import Path

    from attnprobe.cli.common import writable_folder
    from attnprobe.errors import ConfigError
    from attnprobe.reproduce import run_claims
    from attnprobe.reproduce.run import select

    select(args.claims)  # refused before anything runs
    out = Path(args.out)
    if not str(args.out).strip():
        raise ConfigError("--out names the folder for results.json, report.html and figures/; got ''", param="out")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a folder; give a folder for results.json, report.html "
                          "and figures/", param="out")
    writable_folder(out, "--out")
    args.written = []  # what an interrupted run leaves behind, for its last line
    claims = run_claims(args.out, quick=args.quick, names=args.claims, written=args.written)
    failed = [c.claim for c in claims if c.holds is False]
    print(f"reproduce: {sum(c.holds is True for c in claims)} claims hold, {len(failed)} do not"
          f"{' (' + ', '.join(failed) + ')' if failed else ''}, {sum(c.holds is None for c in claims)} not yet "
          f"available; wrote {args.out}/results.json and {args.out}/report.html")
    return 3 if failed else 0


def add_parser(sub) -> None:
    from attnprobe.reproduce import CLAIMS

    r = sub.add_parser("reproduce", help="check every claim of the paper; write a report")
    r.add_argument("--quick", action="store_true", help="small grids (under a minute on 2 cores)")
    r.add_argument("--claims", help="comma-separated subset: " + ", ".join(CLAIMS))
    r.add_argument("--out", required=True, metavar="DIR", help="results.json, report.html and figures/")
    r.set_defaults(func=run)
