"""``attnprobe verify``: per-parameter errors of a result against the true model."""

from __future__ import annotations

from attnprobe.cli.common import plan_file
from attnprobe.errors import ConfigError
from attnprobe.models import load_model
from attnprobe.models.compare import parameter_errors
from attnprobe.models.io import json_writer, write_files


def run(args) -> int:
    json_path = plan_file(args.json, [args.target, args.result], "--json") if args.json else None
    true_model = load_model(args.target)
    result = load_model(args.result)
    try:
        errs = parameter_errors(true_model, result)
    except ConfigError as exc:
        raise ConfigError(f"--result {args.result} vs --target {args.target}: {exc}") from None
    width = max(map(len, errs))
    for name, e in errs.items():
        if name.startswith("heads_"):
            print(f"{name:<{width}}  {int(e)}")
        else:
            print(f"{name:<{width}}  relative error {e:.3e}")
    if json_path:
        write_files([(json_path, json_writer(errs))])
    return 0


def add_parser(sub) -> None:
    v = sub.add_parser("verify", help="compare a result with the true model")
    v.add_argument("--target", required=True, metavar="TRUE.npz")
    v.add_argument("--result", required=True, metavar="OUT.npz")
    v.add_argument("--json", metavar="FILE", help="also write the errors as JSON")
    v.set_defaults(func=run)
