"""Post-norm (BERT) blocks: the attention stage (``learners/block/post_norm_attention.py``; docs/block.md,
"Post-norm blocks", stage ``attention``) against the truth — a random transformers ``BertLayer`` (d = 32, 2 heads of
16, norm weights not 1, attention biases random) and MiniLM layer 2 (d = 384, 12 heads of 32), float64. The stages
before it (output norm, first-norm centre, first-norm input) run first and are counted apart.

Reported: the pairs kept (one eigenvalue cluster per head), each head's value map ``P V_h`` and logit form
``B_h = W_Q,hᵀW_K,h/√d_h`` and query-bias term ``u_h`` (relative, heads matched by their value maps; worst head), and
the learned attention against the true one at every position of 16 random sequences of rms 1 per length, centred
(n1 ignores the ones vector), relative to the largest answer.

    python benchmarks/post_norm_attention.py [--write] [--pairs N] [--only toy|minilm] [--cache FILE --chunk N]

With ``--cache FILE`` MiniLM's pairs are read ``--chunk`` at a time into FILE (each run under 3 minutes on a shared
machine), pair j from the seed ``(0, j)``; the run that completes them measures and writes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.block.post_norm import FirstNormInput, first_norm_centre, first_norm_input
from attnprobe.learners.block.post_norm_attention import (PAIRS, PAIR_STEP, PairReading, attention_from_pairs,
                                                          read_pairs)
from attnprobe.oracles.hf_block import block_model, hf_block
from attnprobe.reports import Table
from attnprobe.targets.hf import minilm_dir
from post_norm import tiny_bert_layer
from post_norm_stages import Counted
from sections import publish

DOC = "block"
LENGTHS = (1, 2, 5, 17, 64)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


FIELDS = ("a", "b", "v", "Ta", "Tb", "queries")


def read(victim, step: float, pairs: int, cache: Path | None = None, chunk: int = 0, seed: int = 0):
    """(affine, readings, queries before, seconds before, seconds of the pairs), or None while the cache is being
    filled (``chunk`` pairs more per run)."""
    d = block_model(victim).d
    rows = Counted(victim)
    old = dict(np.load(cache)) if cache is not None and cache.exists() else {}
    t0 = time.perf_counter()
    if "K" in old:
        affine = FirstNormInput(old["K"], old["c"], 0.0, 0)
        before, s_before = int(old["before"]), float(old["s_before"])
    else:
        rng = np.random.default_rng(seed)
        affine = first_norm_input(rows, first_norm_centre(rows, d, rng), rng)
        before, s_before = rows.queries, time.perf_counter() - t0
    readings = [PairReading(*(old[k][j] for k in FIELDS)) for j in range(len(old.get("a", ())))]
    tried = int(old.get("tried", len(readings)))
    t1, s_old = time.perf_counter(), float(old.get("s_pairs", 0.0))

    def save():
        np.savez(cache, K=affine.K, c=affine.c, before=before, s_before=s_before, tried=tried,
                 s_pairs=s_old + time.perf_counter() - t1,
                 **{k: np.stack([np.asarray(getattr(r, k)) for r in readings]) for k in FIELDS})
    while len(readings) < pairs and (cache is None or chunk <= 0 or len(readings) < len(old.get("a", ())) + chunk):
        try:
            readings += read_pairs(rows, affine, np.random.default_rng([seed, tried]), 1, step)
        except UnidentifiableError as exc:  # the row was not matched: the pair is left out
            print(f"pair {tried}: {exc}")
        tried += 1
        if cache is not None and len(readings) % 4 == 0:
            save()
    s_pairs = s_old + time.perf_counter() - t1
    if cache is not None:
        save()
        if len(readings) < pairs:
            print(f"{len(readings)} of {pairs} pairs read into {cache}")
            return None
    return affine, readings, before, s_before, s_pairs


def measure(name: str, victim, step: float, pairs: int, cache: Path | None = None, chunk: int = 0) -> list | None:
    m = block_model(victim)
    att, d = m.attention, m.d
    got = read(victim, step, pairs, cache, chunk)
    if got is None:
        return None
    affine, readings, before, s_before, s_pairs = got
    t1 = time.perf_counter()
    stage = attention_from_pairs(readings, affine, att.H)
    seconds = s_pairs + time.perf_counter() - t1
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
            f"{s_before:.1f} + {seconds:.1f}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/block.md")
    ap.add_argument("--pairs", type=int, default=PAIRS, help="pairs read on MiniLM")
    ap.add_argument("--only", choices=("toy", "minilm"), help="one victim only")
    ap.add_argument("--cache", type=Path, help="read MiniLM's pairs into this .npz file, --chunk at a time")
    ap.add_argument("--chunk", type=int, default=0, help="pairs to read per run with --cache")
    ap.add_argument("--step", type=float, default=PAIR_STEP, help="the key step t on MiniLM")
    args = ap.parse_args()
    t = Table(["victim", "key step t", "pairs kept", "P V_h (worst head)", "B_h (worst)", "u_h (worst)",
               f"attention at N = {', '.join(map(str, LENGTHS))} (centred, of the largest)",
               "queries (stages before + attention)", "seconds (stages before + attention)"])
    if args.only != "toy":
        row = measure("MiniLM layer 2 (d = 384, 12 heads, FFN 1536)", hf_block(str(minilm_dir()), 2), args.step,
                      args.pairs, args.cache, args.chunk)
        if row is None:
            return
    if args.only != "minilm":
        with tempfile.TemporaryDirectory() as tmp:
            t.add(*measure("BertLayer d = 32, 2 heads, FFN 64", tiny_bert_layer(Path(tmp) / "b32", d=32, heads=2),
                           0.1, 40))
    if args.only != "toy":
        t.add(*row)
    body = ("The post-norm block's attention read through its FFN and both LayerNorms (float64; the toy's weights "
            "are N(0, 0.25), its logits ~10× MiniLM's, hence its smaller key step; MiniLM's pairs were read into "
            "the cache by earlier runs of the same command, 12 at a time, each under 3 minutes, and its seconds add "
            "theirs):\n\n" + t.markdown())
    publish("Post-norm stage attention: the heads' split and logits through the norms (float64)", body,
            doc=DOC, write=args.write)


if __name__ == "__main__":
    main()
