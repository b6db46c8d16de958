"""The RoPE learner against real ``transformers`` attention modules (random init, d = 128, 8 heads, d_h = 16), whole
output rows at the last position. Per family and answer precision: sequences asked against the unknowns, the
function's error at the last position of sequences of every length up to 256 (relative to the answers' spread),
or the one-line refusal; ``unknowns`` counts the module's function (its biases included), ``limit`` =
⌈unknowns / K⌉ sequences (each answers K numbers).

    PYTHONPATH=src python benchmarks/positional.py --write
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners.positional import extract_positional
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.reports import Table
from attnprobe.targets.positional_modules import positional_victim, reference_model
from sections import command_line, write_section

DOC = "positional"  # its results file: docs/benchmarks/positional.md
LLAMA3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
#: family, victim options, answer precision, learner options
CASES = (("llama", {"kv_heads": 2}, "float64", {}),
         ("llama", {"kv_heads": 2, "rope": LLAMA3}, "float64", {}),
         ("qwen2", {"kv_heads": 2}, "float64", {}), ("gpt_neox", {}, "float64", {}),
         ("llama", {"kv_heads": 2}, "float32", {}), ("llama", {"kv_heads": 2}, "bfloat16", {}))
#: GPT-NeoX's partial rotary with its biases zero, then drawn
PARTIAL = (("gpt_neox", {"bias_std": 0.0, "rotary_pct": 0.25}, "float64", {}),
           ("gpt_neox", {"rotary_pct": 0.25}, "float64", {}))
LENGTHS = (1, 2, 3, 5, 17, 64, 100, 200, 256)


def function_error(model, truth, rng, per_length: int = 4) -> float:
    """Largest ‖f̂(X) − f(X)‖∞ / ‖f(X) − c‖∞ at the last position over Gaussian sequences of every length in
    :data:`LENGTHS` (entries N(0, 1), the answers' scale)."""
    return function_error_over_lengths(model, truth, rng, LENGTHS, per_length=per_length)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/positional.md")
    ap.add_argument("--walks", type=int, nargs="+", help="instead: LLaMA (8/2, float64) with these walk lengths")
    ap.add_argument("--partial", action="store_true", help="instead: GPT-NeoX partial rotary (0.25), biases zero "
                                                              "and drawn (float64)")
    args = ap.parse_args()
    cases = CASES if not args.walks else tuple(("llama", {"kv_heads": 2}, "float64", {"walk": w}) for w in args.walks)
    if args.partial:
        cases = PARTIAL
    table = Table(["module", "GQA", "answers", "sequences", "unknowns", "limit", "error ≤ 256", "θ spread",
                   "base found", "seconds", "result"])
    for family, kw, precision, opts in cases:
        victim = positional_victim(family, d=128, heads=8, seed=args.seed, dtype=precision, **kw)
        truth = reference_model(victim)
        oracle = oracle_from_torch(victim, 128, precision=precision)
        name = (family + (" (llama3 scaling)" if "rope" in kw else "") + (" (no biases)" if "bias_std" in kw else "")
                + "".join(f" ({k} {v})" for k, v in opts.items()))
        gqa = f"8/{kw['kv_heads']}" if "kv_heads" in kw else "8/8"
        unknowns = truth.unknowns(truth.d, truth.H, truth.G, truth.head_dim, truth.outputs,
                                  bias=bool(np.any(truth.bk) or np.any(truth.bq)))
        limit = -(-unknowns // truth.outputs)  # each sequence answers K numbers
        t0 = time.perf_counter()
        try:
            res = extract_positional(oracle, seed=args.seed, **opts)
        except AttnprobeError as exc:
            table.add(name, gqa, precision, oracle.queries, unknowns, limit, "–", "–", "–",
                      round(time.perf_counter() - t0), f"refused: {exc}")
        else:
            err = function_error(res.model, truth, np.random.default_rng(100 + args.seed))
            det = res.details
            base = det["base_estimate"]
            table.add(name, gqa, precision, res.queries, unknowns, limit, f"{err:.1e}",
                      f"{det['theta_spread']:.1e}", "–" if base is None else f"{base:.6g}", round(res.seconds),
                      f"check {'passed' if res.passed else 'FAILED'} ({res.check.error:.1e}); groups "
                      f"{det['kv_groups']}")
        print(table.markdown().splitlines()[-1], flush=True)
    print(table.markdown())
    if args.write:
        title = ("Positional: the pair probe's walk (LLaMA, GQA 8/2, d = 128, float64)" if args.walks else
                 "Positional: partial rotary (GPT-NeoX, rotary on 4 of 16 dims, d = 128, float64)" if args.partial
                 else "Positional: RoPE layers (transformers modules, d = 128, 8 heads, d_h = 16)")
        write_section(title, table.markdown(), command_line(), doc=DOC)


if __name__ == "__main__":
    main()
