"""Comparing a recovered model with the true one: the one relative-error formula and :func:`parameter_errors`,
used by ``verify``, ``audit``, tests and benchmarks."""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError


def relative_error(estimate, truth) -> float:
    """``‖x̂ − x‖ / ‖x‖`` (Frobenius), or the absolute error ``‖x̂‖`` when ``x = 0``."""
    a, b = np.asarray(estimate, dtype=float), np.asarray(truth, dtype=float)
    if a.shape != b.shape:
        raise ConfigError(f"cannot compare arrays of shapes {a.shape} and {b.shape}", param="estimate")
    n = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / n) if n > 0 else float(np.linalg.norm(a))


def function_error_over_lengths(model, truth, rng, lengths, *, per_length: int = 4, rows: bool = False) -> float:
    """Largest ``‖f̂(X) − f(X)‖∞ / ‖f(X) − c‖∞`` over Gaussian sequences (entries N(0, 1)) of every length in
    ``lengths``, at the last position (or at every row with ``rows``); ``c`` is the truth's output bias, so a model
    that answers only ``c`` scores 1. For models of sequences (``PositionalAttention``, blocks)."""
    worst = 0.0
    for N in lengths:
        X = rng.standard_normal((per_length, N, truth.d))
        y = truth.every_position(X) if rows else truth(X)
        yh = model.every_position(X) if rows else model(X)
        worst = max(worst, float(np.abs(yh - y).max() / np.abs(y - truth.output_bias()).max()))
    return worst


def relative_errors(true_model, result_model) -> dict[str, float]:
    """Per-parameter :func:`relative_error` of every array the two models share."""
    t, r = true_model.arrays(), result_model.arrays()
    out = {}
    for name in t:
        if name not in r:
            continue
        if np.shape(r[name]) != np.shape(t[name]):
            raise ConfigError(f"parameter {name} has shape {np.shape(r[name])} in the result but "
                              f"{np.shape(t[name])} in the target", param=name)
        out[name] = relative_error(r[name], t[name])
    return out


#: which result kinds compare with which truth kinds (a transformer's FFN is a ReLU network)
COMPARABLE = {"attention_head": {"attention_head"},
              "one_layer_transformer": {"one_layer_transformer", "relu_net", "multihead_transformer"},
              "relu_net": {"relu_net", "one_layer_transformer"}, "multi_head": {"multi_head"},
              "multihead_transformer": {"multihead_transformer", "one_layer_transformer"}}
#: kinds compared by :func:`attnprobe.models.transformer.transformer_errors` (heads matched, then the function)
TRANSFORMERS = {"one_layer_transformer", "multihead_transformer"}


def parameter_errors(truth, result, *, v_scale_free: bool = False) -> dict[str, float]:
    """Relative errors of a recovered model against the true one, as its kind allows them to be compared:

    - a head: every shared array (``W``, ``v``, ``u``, ``c``); ``v_scale_free``: answers that fix v only up to
      its norm (yes/no answers, App. B) compare ``W`` and v's direction;
    - a multi-head layer: heads matched up to permutation (Sec. 7): ``W``, ``v``, ``u`` of the worst head, ``c``,
      ``W[h]`` of each true head, ``head{h}<-{p}`` (worst of its W, v, u; ``p`` the matched head),
      ``worst_head``, ``heads_found``, ``heads_true``;
    - a transformer or ReLU network: ``W`` and ``v`` entrywise (transformers), the FFN neurons up to permutation
      and positive scale (Sec. 4.1): ``neuron_direction``, ``neuron_weight``;
    - a multi-head transformer (or a Sec. 4.1 one against it): heads matched by their scores, W and u of the
      worst head, and the function on fresh sequences (V_h and A are defined only up to an invertible map).

    Models of kinds that cannot be compared, or of different widths, are refused."""
    if result.kind not in COMPARABLE.get(truth.kind, {truth.kind}):
        raise ConfigError(f"the result is a model of kind {result.kind} but the truth is of kind {truth.kind}; they "
                          "cannot be compared", param="result")
    if result.d != truth.d:
        raise ConfigError(f"the result has d = {result.d} but the truth has d = {truth.d}", param="result")
    if truth.kind == "multi_head":
        return _multihead_errors(truth, result)
    if "multihead_transformer" in (truth.kind, result.kind) and result.kind in TRANSFORMERS:
        from attnprobe.models.transformer import transformer_errors

        return transformer_errors(truth, result)
    if truth.kind in ("one_layer_transformer", "relu_net"):
        return _network_errors(truth, result)
    if v_scale_free:
        unit = truth.v / np.linalg.norm(truth.v)
        return {"W": relative_error(result.W, truth.W), "v": relative_error(result.v, unit)}
    return relative_errors(truth, result)


def _multihead_errors(truth, result) -> dict[str, float]:
    from attnprobe.models.multihead import match_heads

    m = match_heads(truth, result)
    out = {"W": float(np.max(m.W)), "v": float(np.max(m.v)), "u": float(np.max(m.u)), "c": float(m.c)}
    out.update({f"W[{h}]": float(m.W[h]) for h in range(truth.H)})
    out.update({f"head{h}<-{int(m.perm[h])}": float(m.head_error[h]) for h in range(truth.H)})
    out.update(worst_head=float(m.worst), heads_found=float(result.H), heads_true=float(truth.H))
    return out


def _network_errors(truth, result) -> dict[str, float]:
    from attnprobe.models.ffn import neuron_errors

    out = {}
    if truth.kind == "one_layer_transformer" and result.kind == truth.kind:
        out = {"W": relative_error(result.W, truth.W), "v": relative_error(result.v, truth.v)}
    biases = {"b_true": getattr(truth, "b", None), "b_hat": getattr(result, "b", None)}
    if all(b is None for b in biases.values()):
        biases = {}
    ne = neuron_errors(truth.A, truth.w_o, result.A, result.w_o, **biases)
    out["neuron_direction"], out["neuron_weight"] = ne["direction_error"], ne["weight_error"]
    return out
