"""The additive-bias positional learner (T5's relative buckets, BLOOM's ALiBi) against the real ``transformers``
modules (``T5Attention``, ``BloomAttention``; random init, d = 128, 8 heads, d_h = 16, float64 modules): sequences
asked against the unknowns, the function's largest error over sequences of lengths 1 … 256 (relative to the
answers' spread; the last row, or every row when the learner read every row), the buckets seen, the slopes.

    PYTHONPATH=src python benchmarks/positional_bias.py --write
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners.positional.additive import extract_additive
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.base import Oracle
from attnprobe.oracles.torch_adapter import TorchFunction
from attnprobe.reports import Table
from attnprobe.targets.positional_modules import EveryRow, positional_victim, reference_model
from sections import command_line, write_section

DOC = "positional"
LENGTHS = (1, 2, 3, 5, 17, 64, 100, 200, 256)


def function_error(model, truth, rng, rows: bool) -> float:
    return function_error_over_lengths(model, truth, rng, LENGTHS, rows=rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    table = Table(["module", "answers", "rows read", "sequences", "unknowns", "error ≤ 256", "position term found",
                   "seconds", "result"])
    for family, rows in (("t5", False), ("t5", True), ("bloom", False)):
        victim = positional_victim(family, d=128, heads=8, seed=args.seed)
        truth = reference_model(victim)
        precision = "float32" if family == "bloom" else "float64"  # BLOOM's softmax is float32 in any dtype
        fn = EveryRow(victim) if rows else TorchFunction(victim, 128)
        oracle = Oracle(fn, 128, precision=precision)
        t0 = time.perf_counter()
        answers = "float64 module" + (" (float32 softmax)" if family == "bloom" else "")
        try:
            res = extract_additive(oracle, seed=args.seed)
        except AttnprobeError as exc:
            table.add(family, answers, "every" if rows else "last", oracle.queries, "–", "–", "–",
                      round(time.perf_counter() - t0), f"refused: {exc}")
        else:
            det = res.details
            found = (f"ALiBi, slopes {min(det['slopes']):.6g} … {max(det['slopes']):.6g}" if det["position"] == "alibi"
                     else f"T5 buckets {det['buckets']} (max distance {det['max_distance']}), "
                          f"{det['buckets_seen']} seen")
            err = function_error(res.model, truth, np.random.default_rng(100 + args.seed), rows)
            table.add(family, answers, "every" if rows else "last", res.queries, res.unknowns, f"{err:.1e}", found,
                      round(res.seconds), f"check {'passed' if res.passed else 'FAILED'} ({res.check.error:.1e})")
        print(table.markdown().splitlines()[-1], flush=True)
    print(table.markdown())
    if args.write:
        write_section("Positional: T5 relative buckets and ALiBi (transformers modules, d = 128, 8 heads, d_h = 16)",
                      table.markdown(), command_line(), doc=DOC)


if __name__ == "__main__":
    main()
