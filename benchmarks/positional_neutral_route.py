"""The RoPE route on layers with q/k/v biases once the keys are neutral (``Qwen2Attention``,
``GPTNeoXAttention``; d = 32, 2 heads, float64): every token is shifted by a neutral key ``x₀`` (``W_K x₀ + b_K =
0`` in every group, taken from the module's weights here, so this is a measurement of the later stages, not a
learner), which removes the key bias (the value bias becomes a constant of the output); what is left is the query
bias ``b' = W_Q x₀ + b_Q``. Rows: the query bias as the shift leaves it or cancelled in the module (``b_Q = −W_Q
x₀``), the pair probe's settings (the route's, whose query scale t varies, or t fixed with more zero keys), and
what the unchanged route then returns: sequences, the function error at lengths 1 … 256 against the module (the
recovered model shifted back: ``b_K = −W_K x₀``, ``b_Q = −W_Q x₀``, ``b_V = −W_V x₀``), or its refusal.

    PYTHONPATH=src python benchmarks/positional_neutral_route.py --write
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

import attnprobe.learners.positional.rope as rope
from attnprobe.errors import AttnprobeError
from attnprobe.learners.positional.neutral import extract_neutral, shifted_back
from attnprobe.models.positional import PositionalAttention
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.base import Oracle
from attnprobe.reports import Table
from attnprobe.targets.positional_modules import positional_victim, reference_model
from sections import command_line, write_section

DOC = "positional"
CASES = (("qwen2", {"kv_heads": 1}), ("gpt_neox", {}))
LENGTHS = (1, 2, 8, 64, 256)


def neutral_key(model) -> np.ndarray:
    """A token whose key is zero in every group: ``W_K x₀ = −b_K`` (least squares; exact when ``G·d_h ≤ d``)."""
    return -np.linalg.lstsq(model.Wk.reshape(-1, model.d), model.bk.reshape(-1), rcond=None)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/positional.md")
    args = ap.parse_args()
    table = Table(["module", "query bias b'", "pair-probe settings", "sequences", "error ≤ 256", "result"])
    route_settings = rope.SETTINGS
    for family, kw in CASES:
        truth = reference_model(positional_victim(family, d=32, heads=2, seed=args.seed, **kw))
        x0 = neutral_key(truth)
        for bias in ("as the shift leaves it", "cancelled (b_Q = −W_Q x₀)"):
            layer = truth if bias.startswith("as") else dataclasses.replace(
                truth, bq=-np.einsum("hkd,d->hk", truth.Wq, x0))
            for label, settings in (("t varies (route)", route_settings), ("t fixed", rope.UNIT_SETTINGS)):
                rope.SETTINGS = settings
                oracle = Oracle(lambda X, layer=layer: layer(np.asarray(X) + x0), truth.d)
                try:
                    res = rope.extract_positional(oracle, heads=truth.H, seed=0, check=False)
                    err = function_error_over_lengths(shifted_back(res.model, x0), layer, np.random.default_rng(0),
                                                      LENGTHS)
                    table.add(family, bias, label, res.queries, f"{err:.1e}", "recovered" if err < 1e-6 else
                              "wrong function (no query bias in the model)")
                except AttnprobeError as exc:
                    table.add(family, bias, label, oracle.queries, "–", f"refused: {str(exc)[:90]}")
                finally:
                    rope.SETTINGS = route_settings
    print(table.markdown())
    learned = Table(["module", "d", "GQA", "sequences", "unknowns", "error ≤ 256", "check", "wrong x₀ (+1e-3 noise)"])
    learner_cases = [(f, 32, 2, kw) for f, kw in CASES] + [("qwen2", 128, 8, {"kv_heads": 2})]
    for family, d, H, kw in learner_cases:  # the learner (neutral.py): query bias read from ±z; x₀ from the weights
        truth = reference_model(positional_victim(family, d=d, heads=H, seed=args.seed, **kw))
        x0 = neutral_key(truth)
        res = extract_neutral(Oracle(truth, truth.d), x0, heads=truth.H, seed=0)
        err = function_error_over_lengths(res.model, truth, np.random.default_rng(0), LENGTHS)
        try:
            extract_neutral(Oracle(truth, truth.d), x0 + 1e-3 * np.random.default_rng(5).standard_normal(truth.d),
                            heads=truth.H, seed=0)
            wrong = "ACCEPTED"
        except AttnprobeError as exc:
            wrong = f"refused: {str(exc)[:70]}"
        unknowns = PositionalAttention.unknowns(truth.d, truth.H, truth.G, truth.head_dim, truth.d, bias=True)
        learned.add(family, d, f"{truth.H}/{truth.G}", res.queries, unknowns, f"{err:.1e}",
                    f"{res.check.verdict} ({res.check.error:.1e})", wrong)
    print(learned.markdown())
    if args.write:
        write_section("Positional: the RoPE route behind a neutral-key shift, query bias left or cancelled "
                      "(d = 32, float64)", table.markdown(), command_line(), doc=DOC)
        write_section("Positional: Qwen2 / GPT-NeoX with biases behind a given neutral key, query bias read from ±z "
                      "(float64)", learned.markdown(), command_line(), doc=DOC)


if __name__ == "__main__":
    main()
