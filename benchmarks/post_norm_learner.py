"""The post-norm (BERT) block learner end to end (``extract_block`` → ``learners/block/post_norm_learner.py``;
docs/block.md, "Post-norm blocks"): random transformers ``BertLayer`` s (weights N(0, 0.25), attention biases,
norm weights and biases moved; ``benchmarks/post_norm.py``'s ``tiny_bert_layer``), float64, from their answers
alone. Reported: the learner's own check (every position of 4 fresh sequences per length 1 … 64, the largest error
over the largest ``|y − x|``, against the claim), the same measure against the true block on 2 more fresh sequences
per length, the stages' diagnostics, queries by stage, seconds, peak memory.

    python benchmarks/post_norm_learner.py [--write] [--sizes 12:1 24:2]
    python benchmarks/post_norm_learner.py --minilm DIR [--seconds 1080] [--write]

``--minilm DIR``: MiniLM layer 2's real ``BertLayer`` (float64), its stages kept in the folder DIR
(``post_norm_store.StageStore``): each sitting runs for ``--seconds`` at most and exits 3 with the stages so far
saved (run it again to resume); the sitting that finishes prints and writes the row (queries: each sitting's, summed
from DIR/sittings.txt).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from attnprobe.learners.block.learner import CHECK_LENGTHS, every_position_check, extract_block
from attnprobe.learners.block.post_norm_learner import CLAIM, on_span
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
    by = res.queries_by_phase
    return row(f"BertLayer d = {d}, {heads} head{'s' if heads > 1 else ''}, FFN {m}", res, truth,
               f"{res.queries:,} (" + ", ".join(f"{k} {v:,}" for k, v in by.items()) + ")", seconds,
               "sweeps" if on_span(d, m) else "Gauss–Newton steps")


def row(victim: str, res, truth, queries: str, seconds: float, steps: str) -> list:
    """The table's row: the check, the same measure against the true block on 2 fresh sequences per length, the
    stages' diagnostics (``steps``: what the neurons stage counts), queries, seconds, peak memory."""
    fresh = Oracle(truth.every_position, truth.d, outputs=truth.d, precision="float64")
    vs_truth = every_position_check(fresh, res.model, np.random.default_rng(99), CHECK_LENGTHS, 2, claim=CLAIM)
    det = res.details
    stages = (f"{det['attention']['pairs_kept']} pairs kept; neurons {det['neurons']['sweeps']} {steps}, span "
              f"{det['neurons']['span_residual']:.1e}, curves {det['neurons']['curve_misfit']:.1e}; ffn null "
              f"{det['ffn']['null']:.1e} / {det['ffn']['gap']:.1e}; polish "
              + " → ".join(f"{h:.1e}" for h in det["polish"]["history"]))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return [victim, f"{'passed' if res.passed else 'FAILED'} {res.check.error:.1e} (worst N = "
                    f"{res.check.extra['worst_length']})", f"{vs_truth.error:.1e}", stages, queries, f"{seconds:.0f}",
            f"{peak:.1f}"]


def minilm(folder: Path, seconds: float) -> list | None:
    """One sitting on MiniLM layer 2 (module docstring): the row, or None when paused."""
    from attnprobe.learners.block.post_norm_store import Paused, StageStore
    from attnprobe.oracles.hf_block import hf_block, oracle_from_hf_block
    from attnprobe.targets.hf import minilm_dir

    store = StageStore(folder, seconds)
    oracle = oracle_from_hf_block(str(minilm_dir()), 2)
    t0 = time.perf_counter()
    log = folder / "sittings.txt"
    try:
        res = extract_block(oracle, heads=12, hidden=1536, store=store)
    except Paused as exc:
        with log.open("a") as f:
            f.write(f"{oracle.queries} {time.perf_counter() - t0:.0f} paused\n")
        print(f"{exc} ({oracle.queries:,} queries, {time.perf_counter() - t0:.0f} s; resumed {store.resumed})")
        return None
    with log.open("a") as f:
        f.write(f"{oracle.queries} {time.perf_counter() - t0:.0f} finished\n")
    sittings = [line.split() for line in log.read_text().splitlines()]
    truth = block_model(hf_block(str(minilm_dir()), 2))
    return row("MiniLM layer 2 (d = 384, 12 heads, FFN 1536)", res, truth,
               f"{sum(int(s[0]) for s in sittings):,} in {len(sittings)} sittings (the last: "
               + ", ".join(f"{k} {v:,}" for k, v in res.queries_by_phase.items()) + ")",
               sum(int(s[1]) for s in sittings), "Gauss–Newton steps")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/block.md")
    ap.add_argument("--sizes", nargs="*", default=["12:1", "24:2"], help="d:heads of the layers (FFN 2d)")
    ap.add_argument("--minilm", type=Path, help="MiniLM layer 2 in sittings, its stages kept in this folder")
    ap.add_argument("--seconds", type=float, default=1080, help="a --minilm sitting's time")
    args = ap.parse_args()
    if args.minilm is not None:
        row = minilm(args.minilm, args.seconds)
        if row is None:
            raise SystemExit(3)
        args.sizes = []
    t = Table(["victim", f"check (claim {CLAIM:.0e})", "against the truth (2 fresh per length 1 … 64)",
               "stages", "queries (by stage)", "seconds", "peak RSS GiB"])
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            d, heads = map(int, size.split(":"))
            t.add(*measure(d, heads, Path(tmp)))
    if args.minilm is not None:
        t.add(*row)
    body = ("`extract_block` on post-norm blocks from their answers alone (float64; the check's error is the largest "
            "error at any position over the largest |y − x|, per length, the worst length's):\n\n" + t.markdown())
    title = "Post-norm block learner end to end (float64)"
    if args.minilm is not None:
        title = "Post-norm block learner on MiniLM layer 2 (float64, in sittings)"
        body += (f"\n\nEach sitting `--seconds {args.seconds:.0f}` under the heavy-run wrapper, its stages kept in a "
                 "folder and resumed; the seconds are the sittings' sum.")
    publish(title, body, doc=DOC, write=args.write)


if __name__ == "__main__":
    main()
