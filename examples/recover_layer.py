"""Recover every head of a real attention layer in Python: the victim is the live Hugging Face module
(BertSelfAttention + its output dense layer, last position), queried as a black box through one output row.

    python examples/recover_layer.py                          # MiniLM-L6 layer 0, output row 0 (~300k queries)
    python examples/recover_layer.py --model-dir DIR --layer 2 --row 17

The truth is read from the folder only to score the result; the learner never sees it.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from attnprobe.learners.multihead import extract_multihead
from attnprobe.models import save_model
from attnprobe.models.multihead import match_heads
from attnprobe.oracles.hf_attention import oracle_from_hf
from attnprobe.progress import Progress
from attnprobe.targets.hf import hf_checkpoint, hf_layer_row, minilm_dir


def run(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", help="a Hugging Face model folder (default: the installed MiniLM-L6)")
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--row", type=int, default=0)
    p.add_argument("--out", help="where to write the recovered layer (default: a new temporary folder)")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="attnprobe-layer-")) / "recovered_layer.npz"
    folder = args.model_dir or minilm_dir()
    ckpt = hf_checkpoint(folder)

    oracle = oracle_from_hf(folder, args.layer, row=args.row)  # float64; dtype="float32" for the shipped precision
    progress = Progress("recover_layer")  # a bar on a terminal (nothing when stderr is a file or a pipe)
    try:
        res = extract_multihead(oracle, heads=ckpt.heads_per_layer, rank=ckpt.head_dim, seed=0, progress=progress)
    finally:
        progress.close()
    save_model(res.model, out)

    match = match_heads(hf_layer_row(folder, args.layer, args.row), res.model)
    print(f"layer {args.layer} row {args.row}: {res.model.H} heads of d = {res.model.d} from {oracle.queries} "
          f"queries (largest probe norm {oracle.max_input_norm_used:.3g}); check "
          f"{'passed' if res.passed else 'FAILED'} at {res.check.error:.2e}")
    for h, err in enumerate(match.head_error):
        print(f"  head {h:2d} (found as {match.perm[h]:2d}): worst relative error of W, u, v {err:.2e}")
    print(f"wrote {out}")
    return 0 if res.passed else 3


if __name__ == "__main__":
    sys.exit(run())
