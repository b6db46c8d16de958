"""Post-norm (BERT) blocks: the attention stage (``learners/block/post_norm_attention.py``; docs/block.md,
"Post-norm blocks", stage ``attention``) against the truth — a random transformers ``BertLayer`` (d = 32, 2 heads of
16, norm weights not 1, attention biases random) and MiniLM layer 2 (d = 384, 12 heads of 32), float64. The stages
before it (output norm, first-norm centre, first-norm input) run first and are counted apart.

Reported: the pairs kept (one eigenvalue cluster per head), each head's value map ``P V_h`` and logit form
``B_h = W_Q,hᵀW_K,h/√d_h`` and query-bias term ``u_h`` (relative, heads matched by their value maps; worst head), and
the learned attention against the true one at every position of 16 random sequences of rms 1 per length, centred
(n1 ignores the ones vector), relative to the largest answer.

    python benchmarks/post_norm_attention.py [--write] [--pairs N] [--only toy|minilm]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from attnprobe.learners.block.post_norm import first_norm_centre, first_norm_input
from attnprobe.learners.block.post_norm_attention import PAIRS, PAIR_STEP, attention_stage
from attnprobe.oracles.hf_block import block_model, hf_block
from attnprobe.reports import Table
from attnprobe.targets.hf import minilm_dir
from post_norm import tiny_bert_layer
from sections import command_line, write_section

DOC = "block"
LENGTHS = (1, 2, 5, 17, 64)


class Counted:
    """Every-position answers of a victim module, counting sequences."""

    def __init__(self, victim):
        self.victim, self.queries = victim, 0

    def __call__(self, X):
        self.queries += len(X)
        with torch.no_grad():
            return self.victim(torch.as_tensor(np.asarray(X, dtype=np.float64))).numpy()


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def measure(name: str, victim, step: float, pairs: int, seed: int = 0) -> list:
    m = block_model(victim)
    att, d = m.attention, m.d
    rows, rng = Counted(victim), np.random.default_rng(seed)
    t0 = time.perf_counter()
    affine = first_norm_input(rows, first_norm_centre(rows, d, rng), rng)
    before, t1 = rows.queries, time.perf_counter()
    stage = attention_stage(rows, affine, att.H, rng, pairs=pairs, step=step)
    seconds = time.perf_counter() - t1
    got, P = stage.attention, np.eye(d) - 1 / d
    Vt, Vl = att.value_maps(), got.value_maps()
    val, logit, bias = 0.0, 0.0, 0.0
    for h in range(att.H):
        g = min(range(att.H), key=lambda g: np.linalg.norm(P @ (Vl[g] - Vt[h])))
        val = max(val, _rel(P @ Vl[g], P @ Vt[h]))
        logit = max(logit, _rel(got.scale * got.Wq[g].T @ got.Wk[g], att.scale * att.Wq[h].T @ att.Wk[h]))
        bias = max(bias, _rel(got.scale * got.Wk[g].T @ got.bq[g], att.scale * att.Wk[h].T @ att.bq[h]))
    errs = []
    for N in LENGTHS:
        X = np.random.default_rng(N).standard_normal((16, N, d))
        want = att.every_position(X) @ P
        errs.append(float(np.abs(got.every_position(X) @ P - want).max() / np.abs(want).max()))
    return [name, f"{step:g}", f"{len(stage.split.kept)} of {pairs}", f"{val:.1e}", f"{logit:.1e}", f"{bias:.1e}",
            " / ".join(f"{e:.1e}" for e in errs), f"{before:,} + {stage.queries:,}",
            f"{t1 - t0:.1f} + {seconds:.1f}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/block.md")
    ap.add_argument("--pairs", type=int, default=PAIRS, help="pairs read on MiniLM")
    ap.add_argument("--only", choices=("toy", "minilm"), help="one victim only")
    args = ap.parse_args()
    t = Table(["victim", "key step t", "pairs kept", "P V_h (worst head)", "B_h (worst)", "u_h (worst)",
               f"attention at N = {', '.join(map(str, LENGTHS))} (centred, of the largest)",
               "queries (stages before + attention)", "seconds (stages before + attention)"])
    if args.only != "minilm":
        with tempfile.TemporaryDirectory() as tmp:
            t.add(*measure("BertLayer d = 32, 2 heads, FFN 64", tiny_bert_layer(Path(tmp) / "b32", d=32, heads=2),
                           0.1, 40))
    if args.only != "toy":
        t.add(*measure("MiniLM layer 2 (d = 384, 12 heads, FFN 1536)", hf_block(str(minilm_dir()), 2), PAIR_STEP,
                       args.pairs))
    body = ("The post-norm block's attention read through its FFN and both LayerNorms (float64; the toy's weights "
            "are N(0, 0.25), its logits ~10× MiniLM's, hence its smaller key step):\n\n" + t.markdown())
    print(body)
    if args.write:
        write_section("Post-norm stage attention: the heads' split and logits through the norms (float64)", body,
                      command_line(), doc=DOC)


if __name__ == "__main__":
    main()
