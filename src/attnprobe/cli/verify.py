"""``attnprobe verify``: per-parameter errors of a result against the true model."""

from __future__ import annotations

import json
from pathlib import Path


from attnprobe.cli.common import relative_error, relative_errors
from attnprobe.models import load_model


def _ffn_errors(true_model, result) -> dict[str, float]:
    """Transformer / ReLU-network results: W and v compare entrywise, the FFN neurons only up to permutation and
    positive scale (Sec. 4.1), so they are matched first."""
    from attnprobe.models import neuron_errors

    out = {}
    if true_model.kind == "one_layer_transformer" and result.kind == true_model.kind:
        for name, a, b in (("W", result.W, true_model.W), ("v", result.v, true_model.v)):
            out[name] = relative_error(a, b)
    biases = {"b_true": getattr(true_model, "b", None), "b_hat": getattr(result, "b", None)}
    if all(b is None for b in biases.values()):
        biases = {}
    ne = neuron_errors(true_model.A, true_model.w_o, result.A, result.w_o, **biases)
    out["neuron_direction"], out["neuron_weight"] = ne["direction_error"], ne["weight_error"]
    return out


def run(args) -> int:
    true_model = load_model(args.target)
    result = load_model(args.result)
    if true_model.kind in ("one_layer_transformer", "relu_net"):
        errs = _ffn_errors(true_model, result)
    else:
        errs = relative_errors(true_model, result)
    width = max(map(len, errs))
    for name, e in errs.items():
        print(f"{name:<{width}}  relative error {e:.3e}")
    if args.json:
        Path(args.json).write_text(json.dumps(errs, indent=2) + "\n")
    return 0


def add_parser(sub) -> None:
    v = sub.add_parser("verify", help="compare a result with the true model")
    v.add_argument("--target", required=True, metavar="TRUE.npz")
    v.add_argument("--result", required=True, metavar="OUT.npz")
    v.add_argument("--json", metavar="FILE", help="also write the errors as JSON")
    v.set_defaults(func=run)
