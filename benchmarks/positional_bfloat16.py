"""RoPE from bfloat16 answers: the zero-key sweep's value maps, the start and the polish (``learners/positional/
bfloat16.py``).

Random-init ``transformers`` LLaMA attention served in bfloat16 (seed 0), whole output rows at the last position;
every error is against the float64 module of the same weights (largest relative error over lengths up to 256).
The route as ``extract --method positional`` runs it: the start (values, the sweep's value maps, the logit maps),
its check, the polish hook on the route's fresh sequences, then the verdict (the check held to the route's claim,
else refused naming bfloat16).

    PYTHONPATH=src python benchmarks/positional_bfloat16.py --d 32 --heads 2 --kv-heads 1 --write
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.positional.bfloat16 import extract_bfloat16_positional
from attnprobe.learners.positional.route import claim_verdict
from attnprobe.learners.positional.polish import polish_extraction
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.reports import Table
from attnprobe.targets.positional_modules import positional_victim, reference_model
from sections import command_line, write_section

DOC = "positional-precision"
LENGTHS = (1, 2, 3, 5, 17, 64, 100, 200, 256)


def value_map_error(model, truth) -> float:
    """Largest over heads of ``‖V̂_h − V_h‖/‖V_h‖``, heads matched."""
    V, T = model.value_maps(), truth.value_maps()
    C = np.array([[np.linalg.norm(a - b) / np.linalg.norm(b) for b in T] for a in V])
    rows, cols = linear_sum_assignment(C)
    return float(C[rows, cols].max())


def route_row(d: int, H: int, G: int) -> list:
    kw = dict(d=d, heads=H, kv_heads=G, seed=0)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    oracle = oracle_from_torch(positional_victim("llama", dtype="bfloat16", **kw), d, precision="bfloat16")
    t0 = time.perf_counter()
    res = extract_bfloat16_positional(oracle, heads=H, seed=0)
    start_queries = res.queries
    start = function_error_over_lengths(res.model, truth, np.random.default_rng(5), LENGTHS)
    vmaps = value_map_error(res.model, truth)
    plan = res.details["polish_plan"]
    polish_extraction(oracle, res, mode="always", sequences=plan["sequences"], rounds=plan["rounds"])
    polished = function_error_over_lengths(res.model, truth, np.random.default_rng(5), LENGTHS)
    try:
        claim_verdict(oracle, res)
        verdict = "kept"
    except UnidentifiableError as exc:
        verdict = f"refused: {str(exc)[:60]}…"
    return [f"LLaMA d={d} {H}/{G}", f"{vmaps:.1e}", start_queries, f"{start:.1e}",
            res.details["polish"].get("sequences", 0), f"{polished:.1e}", f"{res.check.error:.1e}", verdict,
            res.queries, f"{time.perf_counter() - t0:.0f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[32])
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/")
    args = ap.parse_args()
    table = Table(["module", "sweep: V_h error", "start: queries", "start: function error", "polish: sequences",
                   "polished: function error", "check (worst length)", "verdict", "queries", "seconds"])
    for d in args.d:
        table.add(*route_row(d, args.heads, args.kv_heads))
        print(table.markdown().splitlines()[-1], flush=True)
    print(table.markdown())
    if args.write:
        write_section("RoPE bfloat16 route: the zero-key sweep, the start and the polish", table.markdown(),
                      command_line(), doc=DOC)


if __name__ == "__main__":
    main()
