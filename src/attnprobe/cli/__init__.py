"""Command line: ``attnprobe extract | verify | demo | target | audit | reproduce``, one module per subcommand.

Errors from :mod:`attnprobe.errors` become one readable line and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from attnprobe.cli import audit, demo, extract, reproduce, target, verify
from attnprobe.cli.common import relative_errors
from attnprobe.errors import AttnprobeError

#: the subcommands, in the order ``--help`` lists them; each module has ``add_parser(sub)`` and ``run(args)``
SUBCOMMANDS = (extract, verify, demo, target, audit, reproduce)
METHODS = extract.METHODS

__all__ = ["METHODS", "build_parser", "main", "relative_errors"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnprobe", description="Recover attention weights from black-box queries.")
    sub = p.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except AttnprobeError as exc:
        print(f"attnprobe: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnprobe: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
