"""The post-norm (BERT) block learner end to end (``extract_block`` → ``learners/block/post_norm_learner.py``;
docs/block.md, "Post-norm blocks"): random transformers ``BertLayer`` s (weights N(0, 0.25), attention biases,
norm weights and biases moved; ``benchmarks/post_norm.py``'s ``tiny_bert_layer``), float64, from their answers
alone. Reported: the learner's own check (every position of 4 fresh sequences per length 1 … 64, the largest error
over the largest ``|y − x|``, against the claim), the same measure against the true block on 2 more fresh sequences
per length, the stages' diagnostics, queries by stage, seconds, peak memory.

    python benchmarks/post_norm_learner.py [--write] [--sizes 12:1 24:2]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from attnprobe.learners.block.learner import CHECK_LENGTHS, every_position_check, extract_block
from attnprobe.learners.block.post_norm_learner import CLAIM
from attnprobe.oracles import Oracle
from attnprobe.oracles.hf_block import block_model
from attnprobe.reports import Table
from post_norm import tiny_bert_layer
from sections import publish

DOC = "block"


def measure(d: int, heads: int, tmp: Path) -> list:
    truth = block_model(tiny_bert_layer(tmp / f"b{d}_{heads}", d=d, heads=heads))
    m = truth.ffn.W1.shape[0]
    oracle = Oracle(truth.every_position, d, outputs=d, precision="float64")
    t0 = time.perf_counter()
    res = extract_block(oracle, heads=heads, hidden=m)
    seconds = time.perf_counter() - t0
    fresh = Oracle(truth.every_position, d, outputs=d, precision="float64")
    vs_truth = every_position_check(fresh, res.model, np.random.default_rng(99), CHECK_LENGTHS, 2, claim=CLAIM)
    det = res.details
    stages = (f"{det['attention']['pairs_kept']} pairs kept; neurons {det['neurons']['sweeps']} sweeps, span "
              f"{det['neurons']['span_residual']:.1e}, curves {det['neurons']['curve_misfit']:.1e}; ffn null "
              f"{det['ffn']['null']:.1e} / {det['ffn']['gap']:.1e}; polish "
              + " → ".join(f"{h:.1e}" for h in det["polish"]["history"]))
    by = res.queries_by_phase
    phases = ", ".join(f"{k} {v:,}" for k, v in by.items())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return [f"BertLayer d = {d}, {heads} head{'s' if heads > 1 else ''}, FFN {m}",
            f"{'passed' if res.passed else 'FAILED'} {res.check.error:.1e} (worst N = "
            f"{res.check.extra['worst_length']})", f"{vs_truth.error:.1e}", stages,
            f"{res.queries:,} ({phases})", f"{seconds:.0f}", f"{peak:.1f}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/block.md")
    ap.add_argument("--sizes", nargs="*", default=["12:1", "24:2"], help="d:heads of the layers (FFN 2d)")
    args = ap.parse_args()
    t = Table(["victim", f"check (claim {CLAIM:.0e})", "against the truth (2 fresh per length 1 … 64)",
               "stages", "queries (by stage)", "seconds", "peak RSS GiB"])
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            d, heads = map(int, size.split(":"))
            t.add(*measure(d, heads, Path(tmp)))
    body = ("`extract_block` on post-norm blocks from their answers alone (float64; the check's error is the largest "
            "error at any position over the largest |y − x|, per length, the worst length's):\n\n" + t.markdown())
    publish("Post-norm block learner end to end (float64)", body, doc=DOC, write=args.write)


if __name__ == "__main__":
    main()
