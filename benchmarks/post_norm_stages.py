"""Post-norm (BERT) blocks: the stages built (``learners/block/post_norm.py``; docs/block.md, "Post-norm blocks")
measured against the truth — a random transformers ``BertLayer`` (d = 16 and 32, norm weights not 1, attention
biases random) and MiniLM layer 2 (d = 384, 12 heads), float64:

1. ``output norm``: n2's weight and bias from the answers' rows;
2. ``first-norm centre``: the token whose n1 input is 0 up to the ones vector, in units of the ball's radius √ε,
   after the Jacobian rounds and after one Newton step along rays; the free direction ``K⁻¹1``;
3. ``first-norm input``: ``K = I + Σ_h V_h`` and ``c`` (centred: the ones gauge removed) from two-token sequences;
4. the ball reached: tokens ``K̂⁻¹(v − ĉ)`` for n1 inputs ``v`` of rms √ε/2 … 2√ε, against the n1 output they
   should give, ``v/√(mean v² + ε)`` (the true ε), read from the true model.

    python benchmarks/post_norm_stages.py [--write]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from attnprobe.learners.block.post_norm import (first_norm_centre, first_norm_input, logit_value_matrix,
                                                output_norm, pair_curvature)
from attnprobe.oracles.hf_block import block_model, hf_block
from attnprobe.reports import Table
from attnprobe.targets.hf import minilm_dir
from post_norm import tiny_bert_layer
from sections import publish

DOC = "block"


class Counted:
    """Every-position answers of a victim module, counting sequences."""

    def __init__(self, victim):
        self.victim, self.queries = victim, 0

    def __call__(self, X):
        self.queries += len(X)
        with torch.no_grad():
            return self.victim(torch.as_tensor(np.asarray(X, dtype=np.float64))).numpy()


def _centred(v):
    return v - v.mean(axis=-1, keepdims=True)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def measure(name: str, victim, seed: int = 0) -> list:
    m = block_model(victim)
    d, att = m.d, m.attention
    c = att.every_position(np.zeros((1, 1, d)))[0, 0]
    K = np.eye(d) + (att.every_position(np.eye(d)[:, None, :])[:, 0] - c).T
    root = np.sqrt(m.eps)

    def centre_error(x):
        return float(np.sqrt(np.mean(_centred(K @ x + c) ** 2)) / root)
    rows, rng = Counted(victim), np.random.default_rng(seed)
    t0 = time.perf_counter()
    w2, b2 = output_norm(rows, d, rng)
    q_norm = rows.queries
    coarse = first_norm_centre(rows, d, np.random.default_rng(seed + 1), newton=(1.0, 0))
    q_coarse = rows.queries - q_norm
    centre = first_norm_centre(rows, d, np.random.default_rng(seed + 1))
    q_centre = rows.queries - q_norm - q_coarse
    affine = first_norm_input(rows, centre, rng)
    seconds = time.perf_counter() - t0  # the centre twice: without and with the Newton step
    q_input = affine.queries
    Kn = K @ centre.ones_preimage
    errs = []
    for scale in (0.5, 1.0, 2.0):
        v = _centred(rng.standard_normal((8, d))) * scale * root
        x = affine.token(v)
        h = m._norm(x[:, None] + att.every_position(x[:, None]), 1)[:, 0]
        want = v / np.sqrt(np.mean(v**2, axis=1, keepdims=True) + m.eps)
        errs.append(float(np.abs((h - m.norm1_b) / m.norm1_w - want).max()))
    P = np.eye(d) - 1 / d
    curv = []
    bq = att.bq if att.bq is not None else np.zeros(att.Wq.shape[:2])
    for _ in range(2):
        b, e = rng.standard_normal(d), rng.standard_normal(d)
        e /= np.linalg.norm(e)
        beta = [(att.Wq[h] @ b + bq[h]) @ (att.Wk[h] @ e) * att.scale for h in range(att.Wq.shape[0])]
        want = sum(bh * V @ e for bh, V in zip(beta, att.value_maps()))
        B = np.stack([K @ b + c, np.ones(d)], axis=1)
        off = lambda x: x - B @ np.linalg.lstsq(B, x, rcond=None)[0]  # noqa: E731
        curv.append(_rel(off(pair_curvature(rows, affine, b, e)), off(want)))
    mix = "not run (d² + d unknowns)"
    if d <= 64:
        t1, before = time.perf_counter(), rows.queries
        e = rng.standard_normal(d)
        e /= np.linalg.norm(e)
        A, _ = logit_value_matrix(rows, affine, e, rng)
        ell = [att.scale * att.Wq[h].T @ (att.Wk[h] @ e) for h in range(att.Wq.shape[0])]
        want = P @ sum(np.outer(V @ e, lh) for V, lh in zip(att.value_maps(), ell))
        mix = f"{_rel(A, want):.1e} ({rows.queries - before:,} queries, {time.perf_counter() - t1:.1f} s)"
    return [name, f"{_rel(w2, m.norm2_w):.1e}, {_rel(b2, m.norm2_b):.1e}",
            f"{centre_error(coarse.centre):.1e} → {centre_error(centre.centre):.1e}",
            f"{np.linalg.norm(_centred(Kn)) / np.linalg.norm(Kn):.1e}",
            f"{_rel(P @ affine.K, P @ K):.1e}, {_rel(P @ affine.c, P @ c):.1e}",
            " / ".join(f"{e:.0e}" for e in errs), f"{max(curv):.1e}", mix,
            f"{q_norm:,} + {q_coarse:,} + {q_centre - q_coarse:,} + {q_input:,}", f"{seconds:.2f}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/block.md")
    args = ap.parse_args()
    t = Table(["victim", "output norm: w2, b2 (relative)", "centre / √ε: Jacobian rounds → one ray Newton step",
               "K⁻¹1's n1 input off the ones line", "P K, P c (relative)",
               "ball reached: n1 output error at rms √ε/2, √ε, 2√ε",
               "pair curvature Σ_h β_h V_h e mod (K b + c, 1), worst of 2 (relative)",
               "logit_value_matrix P Σ_h (V_h e)(W_Q,hᵀW_K,h e)ᵀ/√d_h, one e (relative)",
               "single tokens and pairs asked (norm + rounds + Newton + input)",
               "seconds (the stages, the centre twice)"])
    with tempfile.TemporaryDirectory() as tmp:
        for d, heads in ((16, 2), (32, 4)):
            t.add(*measure(f"BertLayer d = {d}, {heads} heads, FFN {2 * d}",
                           tiny_bert_layer(Path(tmp) / f"b{d}", d=d, heads=heads)))
    t.add(*measure("MiniLM layer 2 (d = 384, 12 heads, FFN 1536)", hf_block(str(minilm_dir()), 2)))
    body = ("The post-norm stages against the truth (float64; ε = 1e-12, so √ε = 1e-6; P the centring, which "
            "removes the ones gauge; the centre's error is the rms of its centred n1 input; the queries of the "
            "centre count its Jacobian rounds and then the Newton step's extra ones):\n\n" + t.markdown())
    publish("Post-norm stages: output norm, first-norm centre and input map (float64)", body,
            doc=DOC, write=args.write)


if __name__ == "__main__":
    main()
