"""Post-norm (BERT) blocks: what the answers hide, measured (docs/block.md, "Post-norm blocks").

1. MiniLM layer 2's BertLayer (float64): the rms of the last norm's input ``u = h + F(h)`` row by row — what a
   post-norm block's answers lose (with its mean) and what an FFN learner fed ``(y − b2)/w2`` would see as a
   per-row factor;
2. the first norm's scale and shift with the FFN following (``models.block.rescale_post_norm``): how far the
   answers move (only through the last norm's ε);
3. fitting the whole block to its answers from a random start (a real transformers ``BertLayer``, d = 8, 2 heads,
   FFN 16, norm weights not 1; the last norm read from the answers first, ``levers.output_layernorm``): L-BFGS on
   every answered number, at the true width and at 4× the width, for a fixed time.

    python benchmarks/post_norm.py [--write] [--seconds S]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from attnprobe.learners.block.levers import output_layernorm
from attnprobe.models.block import rescale_post_norm
from attnprobe.oracles.hf_block import block_model, hf_block
from attnprobe.reports import Table
from attnprobe.targets.hf import minilm_dir
from sections import command_line, write_section

DOC = "block"


def _centre(v):
    return v - v.mean(axis=-1, keepdims=True)


def row_scales(m, X) -> tuple[np.ndarray, float, float]:
    """Per row of every position: rms of the centred ``u = h + F(h)``; and the rms of h's and F(h)'s centred parts."""
    h = m._norm(X + m.attention.every_position(X), 1)
    F = m.mlp(h)
    r = np.sqrt(np.mean(_centre(h + F) ** 2, axis=-1)).ravel()
    return r, float(np.sqrt(np.mean(_centre(h) ** 2))), float(np.sqrt(np.mean(_centre(F) ** 2)))


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def tiny_bert_layer(folder: Path, d: int = 8, heads: int = 2, seed: int = 0):
    """Layer 1 of a random ``BertModel`` (weights N(0, 0.25), attention biases too; norm weights and biases moved
    by N(0, 0.09)) as an :class:`~attnprobe.oracles.hf_block.HFBlock`."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from hf_models import tiny_bert_dir

    v = hf_block(tiny_bert_dir(folder, hidden=d, heads=heads, seed=seed), 1)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in v.layer.named_parameters():
            if "LayerNorm" in name:
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return v


class PostNormStudent(torch.nn.Module):
    """A post-norm block with free weights (attention with biases, n1, GELU FFN of width ``m``) and the last norm
    fixed to ``(w2, b2)``, float64."""

    def __init__(self, d: int, heads: int, m: int, w2, b2, eps: float, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        s, dh = 1 / math.sqrt(d), d // heads

        def p(*shape, scale=1.0):
            return torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=torch.float64) * scale)
        self.heads, self.eps = heads, eps
        self.Wq, self.Wk, self.Wv = p(heads, dh, d, scale=s), p(heads, dh, d, scale=s), p(heads, dh, d, scale=s)
        self.bq, self.bk, self.bv = p(heads, dh, scale=0.1), p(heads, dh, scale=0.1), p(heads, dh, scale=0.1)
        self.Wo, self.bo = p(d, d, scale=s), p(d, scale=0.1)
        self.n1w = torch.nn.Parameter(torch.ones(d, dtype=torch.float64))
        self.n1b = torch.nn.Parameter(torch.zeros(d, dtype=torch.float64))
        self.W1, self.b1 = p(m, d, scale=s), p(m, scale=0.1)
        self.W2, self.b2 = p(d, m, scale=1 / math.sqrt(m)), p(d, scale=0.1)
        self.w2, self.c2 = torch.as_tensor(w2), torch.as_tensor(b2)

    def forward(self, X):
        B, N, d = X.shape
        q = torch.einsum("hed,bnd->bhne", self.Wq, X) + self.bq[None, :, None]
        k = torch.einsum("hed,bnd->bhne", self.Wk, X) + self.bk[None, :, None]
        v = torch.einsum("hed,bnd->bhne", self.Wv, X) + self.bv[None, :, None]
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v
        a = a.permute(0, 2, 1, 3).reshape(B, N, d) @ self.Wo.T + self.bo
        h = torch.nn.functional.layer_norm(X + a, (d,), self.n1w, self.n1b, self.eps)
        u = h + torch.nn.functional.gelu(h @ self.W1.T + self.b1) @ self.W2.T + self.b2
        return torch.nn.functional.layer_norm(u, (d,), self.w2, self.c2, self.eps)


def direct_fit(v, truth, width: int, seconds: float, rng, sequences: int = 200) -> tuple[float, float, int]:
    """Fit :class:`PostNormStudent` of FFN width ``width`` to every answered number of ``sequences`` random
    sequences at each length 1, 2, 4, 8 (L-BFGS, strong Wolfe, for ``seconds``); returns the training residual
    (relative), the function error on fresh sequences of length 8 and the L-BFGS rounds run."""
    d = truth.d
    with torch.no_grad():
        Xs = [torch.as_tensor(rng.standard_normal((sequences, N, d))) for N in (1, 2, 4, 8)]
        Ys = [v(X) for X in Xs]
    w2, b2 = output_layernorm(torch.cat([Y.reshape(-1, d) for Y in Ys]).numpy())
    student = PostNormStudent(d, truth.attention.Wq.shape[0], width, w2, b2, truth.eps, seed=1)
    opt = torch.optim.LBFGS(student.parameters(), max_iter=100, history_size=50, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-15, tolerance_change=1e-25)
    total = sum(float((Y ** 2).sum()) for Y in Ys)

    def closure():
        opt.zero_grad()
        loss = sum(((student(X) - Y) ** 2).sum() for X, Y in zip(Xs, Ys)) / total
        loss.backward()
        return loss

    start, rounds, loss = time.perf_counter(), 0, float("nan")
    while time.perf_counter() - start < seconds:
        loss = float(opt.step(closure).detach())
        rounds += 1
    Xf = rng.standard_normal((32, 8, d))
    with torch.no_grad():
        got = student(torch.as_tensor(Xf)).numpy()
    want = truth(Xf)
    return math.sqrt(loss), float(np.linalg.norm(got - want) / np.linalg.norm(_centre(want))), rounds


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks/block.md")
    ap.add_argument("--seconds", type=float, default=90.0, help="time of each direct fit")
    args = ap.parse_args()
    mini = block_model(hf_block(str(minilm_dir()), 2))
    X = np.random.default_rng(0).standard_normal((64, 8, mini.d))
    r, rh, rf = row_scales(mini, X)
    t1 = Table(["rows", "rms of u: min / median / max", "std / mean", "rms of h, of F(h) (centred)"])
    t1.add(*[r.size, f"{r.min():.2f} / {np.median(r):.2f} / {r.max():.2f}", f"{r.std() / r.mean():.2f}",
             f"{rh:.2f}, {rf:.2f}"])
    t2 = Table(["first norm's output scale c, shift s", "largest answer change (relative)"])
    Xs = X[:16]
    for c, s in ((1.0, 0.5), (-1.0, 0.0), (0.5, 0.0), (2.0, 0.0), (10.0, 0.0), (1e-3, 0.0)):
        t2.add(*[f"c = {c:g}, s = {s:g}", f"{_rel(rescale_post_norm(mini, c, s)(Xs), mini(Xs)):.1e}"])
    t3 = Table(["student FFN width", "L-BFGS rounds (≤ 100 steps each)", "training residual (relative)",
                "fresh function error, N = 8", "seconds"])
    with tempfile.TemporaryDirectory() as tmp:
        v = tiny_bert_layer(Path(tmp) / "bert")
        truth = block_model(v)
        for width in (truth.m, 4 * truth.m):
            t0 = time.perf_counter()
            res, err, rounds = direct_fit(v, truth, width, args.seconds, np.random.default_rng(1))
            t3.add(*[f"{width} ({width // truth.m}× the true {truth.m})", rounds, f"{res:.1e}", f"{err:.1e}",
                     f"{time.perf_counter() - t0:.0f}"])
    body = ("MiniLM layer 2 (float64), 64 random sequences of length 8, every row: the last norm's input "
            "`u = h + F(h)`, whose mean and rms the answers lose:\n\n" + t1.markdown()
            + "\n\nThe first norm's output scaled by c and shifted by s, the FFN following "
              "(`models.block.rescale_post_norm`; MiniLM layer 2, 16 sequences of length 8, ε = 1e-12):\n\n"
            + t2.markdown()
            + f"\n\nThe whole block fitted to its answers from a random start (a transformers `BertLayer`, d = 8, 2 "
              f"heads, FFN 16, norm weights not 1; the last norm read from the answers; 200 sequences at each "
              f"length 1, 2, 4, 8; {args.seconds:g} s of L-BFGS each):\n\n" + t3.markdown())
    print(body)
    if args.write:
        write_section("Post-norm blocks: what the answers hide (MiniLM BertLayer; float64)", body, command_line(),
                      doc=DOC)


if __name__ == "__main__":
    main()
