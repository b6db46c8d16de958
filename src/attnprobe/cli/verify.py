"""``attnprobe verify``: per-parameter errors of a result against the true model, and a verdict: exit 0 when every
error is within ``--tolerance`` (and a multi-head result found every head), 3 when one is not."""

from __future__ import annotations

import math

from attnprobe.cli.common import plan_file, positive_float
from attnprobe.errors import CheckFailedError, ConfigError
from attnprobe.models import load_model
from attnprobe.models.compare import parameter_errors
from attnprobe.models.io import json_writer, write_files

#: the default largest relative error of a recovered parameter (float64 answers recover to ~1e-10 or better;
#: float32 answers to ~1e-4; noisy ones need a larger --tolerance)
DEFAULT_TOLERANCE = 1e-3


def verdict(errs: dict[str, float], tolerance: float) -> tuple[bool, str]:
    """Whether the result matches (every relative error ≤ ``tolerance``, as many heads as the truth) and the
    sentence saying so."""
    found, true = errs.get("heads_found"), errs.get("heads_true")
    if found is not None and true is not None and found != true:
        return False, f"the result has {int(found)} heads where the target has {int(true)}"
    rel = {k: v for k, v in errs.items() if not k.startswith("heads_")}
    if not rel:
        return True, "nothing to compare"
    name, worst = max(rel.items(), key=lambda kv: kv[1] if math.isfinite(kv[1]) else math.inf)
    if not worst <= tolerance:
        return False, (f"the result differs from the target: {name} has relative error {worst:.3e} > tolerance "
                       f"{tolerance:.1e} (--tolerance sets it)")
    return True, (f"the result matches the target: the worst relative error, {worst:.3e} ({name}), is within the "
                  f"tolerance {tolerance:.1e}")


def run(args) -> int:
    json_path = plan_file(args.json, [args.target, args.result], "--json") if args.json else None
    true_model = load_model(args.target)
    result = load_model(args.result)
    try:
        errs = parameter_errors(true_model, result)
    except ConfigError as exc:
        raise ConfigError(f"--result {args.result} vs --target {args.target}: {exc}", param="result") from None
    width = max(map(len, errs))
    for name, e in errs.items():
        if name.startswith("heads_"):
            print(f"{name:<{width}}  {int(e)}")
        else:
            print(f"{name:<{width}}  relative error {e:.3e}")
    if json_path:
        write_files([(json_path, json_writer(errs))])
    ok, sentence = verdict(errs, args.tolerance)
    if not ok:
        raise CheckFailedError(sentence)
    print(f"verdict: {sentence}")
    return 0


def add_parser(sub) -> None:
    v = sub.add_parser("verify", help="compare a result with the true model (exit 3 when they differ)")
    v.add_argument("--target", required=True, metavar="TRUE.npz")
    v.add_argument("--result", required=True, metavar="OUT.npz")
    v.add_argument("--tolerance", type=positive_float, default=DEFAULT_TOLERANCE, metavar="T",
                   help=f"the largest relative error a recovered parameter may have (default {DEFAULT_TOLERANCE:g}: "
                        "float64 answers recover to ~1e-10, float32 ones to ~1e-4; give more for noisy answers); "
                        "above it the verdict is 'differs' and the exit code 3")
    v.add_argument("--json", metavar="FILE", help="also write the errors as JSON")
    v.set_defaults(func=run)
