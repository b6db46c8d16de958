"""``attnprobe verify``: per-parameter errors of a result against the true model."""

from __future__ import annotations

from attnprobe.cli.common import plan_file, relative_error, relative_errors
from attnprobe.errors import ConfigError
from attnprobe.models import load_model
from attnprobe.models.io import json_writer, write_files


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


def _multihead_errors(true_model, result) -> dict[str, float]:
    """Multi-head results: heads matched up to permutation (Hungarian), per-head worst of W/v/u errors, c."""
    from attnprobe.models import match_heads

    m = match_heads(true_model, result)
    out = {"heads_found": float(result.H), "heads_true": float(true_model.H)}
    for h in range(true_model.H):
        out[f"head{h}<-{int(m.perm[h])}"] = float(m.head_error[h])
    out["worst_head"] = m.worst
    out["c"] = m.c
    return out


#: which result kinds compare with which target kinds
COMPARABLE = {"attention_head": {"attention_head"},
              "one_layer_transformer": {"one_layer_transformer", "relu_net", "multihead_transformer"},
              "relu_net": {"relu_net", "one_layer_transformer"}, "multi_head": {"multi_head"},
              "multihead_transformer": {"multihead_transformer", "one_layer_transformer"}}
#: kinds compared by :func:`attnprobe.models.transformer.transformer_errors` (heads matched, then the function)
TRANSFORMERS = {"one_layer_transformer", "multihead_transformer"}


def run(args) -> int:
    json_path = plan_file(args.json, [args.target, args.result], "--json") if args.json else None
    true_model = load_model(args.target)
    result = load_model(args.result)
    if result.kind not in COMPARABLE.get(true_model.kind, {true_model.kind}):
        raise ConfigError(f"--result {args.result} holds a {result.kind} but --target {args.target} holds a "
                          f"{true_model.kind}; they cannot be compared")
    if result.d != true_model.d:
        raise ConfigError(f"--result {args.result} has d = {result.d} but --target {args.target} has d = "
                          f"{true_model.d}")
    if true_model.kind == "multi_head":
        errs = _multihead_errors(true_model, result)
    elif "multihead_transformer" in (true_model.kind, result.kind) and result.kind in TRANSFORMERS:
        from attnprobe.models.transformer import transformer_errors

        errs = transformer_errors(true_model, result)
    elif true_model.kind in ("one_layer_transformer", "relu_net"):
        errs = _ffn_errors(true_model, result)
    else:
        errs = relative_errors(true_model, result)
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
