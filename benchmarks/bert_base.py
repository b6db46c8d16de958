"""A BERT-base-sized attention layer (d = 768, 12 heads of 64) from a ``transformers`` ``BertConfig`` with seeded
random weights (no download; ``BertModel(config)`` after ``torch.manual_seed``, BERT's own initializer: N(0, 0.02)
weights, zero biases), as a numpy model: queries, seconds (model / learner) and peak memory per route.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bert_base.py [--routes head vector layer] [--run-layer]
        [--no-bias] [--random-bias] [--hidden 768 --heads 12] [--write]

Routes: ``head`` one head of output row 0 with the low-rank learner (rank 64 given, scalar answers); ``vector`` the
whole layer with the vector-answer multi-head learner (K = 768 outputs per query); ``layer`` the whole layer on
output row 0 with the scalar generic multi-head learner (rank 64 given) — only its query estimate is printed
unless ``--run-layer`` (about 1.1 million queries of a 768-wide 12-head layer: about half an hour on a loaded
2-core machine). ``--hidden 384 --heads 6`` is a rehearsal at half the width (about 0.29 million queries).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import tracemalloc


from attnprobe.learners.core.estimate import estimate_queries
from attnprobe.models.compare import relative_error
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.oracles.base import Oracle
from attnprobe.reports import Table
from sections import command_line, write_section
from attnprobe.targets.hf import vector_layer_arrays

DOC = "multihead"  # its results file: docs/benchmarks/multihead.md
TITLE = "BERT-base-sized layer (d = 768, 12 heads of 64, seeded random BertConfig weights)"
sys.path.insert(0, os.path.dirname(__file__))
from learner_overhead import Timed  # noqa: E402


def bert_base_arrays(seed: int = 0, hidden: int = 768, heads: int = 12, random_bias: bool = False) -> dict:
    """Layer 0 of ``BertModel(BertConfig())`` after ``torch.manual_seed(seed)``, in the vector layout (``hidden``
    and ``heads`` smaller than BERT-base's 768 and 12 for a quicker run that estimates the big one's time).
    BERT's initializer sets every bias to zero; ``random_bias`` draws them like the weights, N(0, 0.02), as a
    trained layer has them."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(num_hidden_layers=1, hidden_size=hidden, num_attention_heads=heads,
                     intermediate_size=4 * hidden)  # one layer is all we query
    att = BertModel(cfg).encoder.layer[0].attention
    if random_bias:
        for lin in (att.self.query, att.self.key, att.self.value, att.output.dense):
            torch.nn.init.normal_(lin.bias, std=cfg.initializer_range)
    H, d = cfg.num_attention_heads, cfg.hidden_size
    dh = d // H

    def heads(lin):
        return lin.weight.detach().double().numpy().reshape(H, dh, d), lin.bias.detach().double().numpy()

    (Q, bQ), (K, _), (V, bV) = heads(att.self.query), heads(att.self.key), heads(att.self.value)
    WO, bO = att.output.dense.weight.detach().double().numpy(), att.output.dense.bias.detach().double().numpy()
    return vector_layer_arrays(Q, K, V, WO, bO, bQ, bV)


class Progress:
    """``fn`` that prints the sequences answered so far and the elapsed seconds to stderr once a minute (a long run
    killed at a deadline still says how far it got)."""

    def __init__(self, fn, every: float = 60.0):
        self.fn, self.every, self.answered = fn, every, 0
        self.t0 = self.last = time.perf_counter()

    def __call__(self, X):
        y = self.fn(X)
        self.answered += len(X)
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            print(f"  progress: {self.answered} sequences answered after {now - self.t0:.0f} s "
                  f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        return y


def _measure(model, learn, err):
    timed = Timed(model)
    oracle = Oracle(Progress(timed), model.d)
    load0 = os.getloadavg()[0]
    tracemalloc.start()
    t0 = time.perf_counter()
    res = learn(oracle)
    wall = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"  functional check: passed={res.check.passed} error={res.check.error:.2e} tolerance="
          f"{res.check.tolerance:.1e}", file=sys.stderr, flush=True)
    return [oracle.queries, f"{err(res):.2e}", round(wall, 1), round(timed.seconds, 1),
            f"{(wall - timed.seconds) / timed.seconds:.2f}", round(peak / 2**20), round(
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), round((load0 + os.getloadavg()[0]) / 2, 1)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--routes", nargs="+", default=["head", "vector", "layer"], choices=["head", "vector", "layer"])
    ap.add_argument("--run-layer", action="store_true")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--hidden", type=int, default=768, help="width d (768: BERT-base; smaller to time a rehearsal)")
    ap.add_argument("--heads", type=int, default=12, help="heads (d / 64 keeps BERT's head size)")
    ap.add_argument("--random-bias", action="store_true", help="biases drawn N(0, 0.02) instead of BERT's zeros")
    ap.add_argument("--no-bias", action="store_true", help="layer route: tell the learner the layer has no query "
                    "bias (BERT's initial biases are zero; the bias-fitting cross stage fails on exactly zero ones)")
    args = ap.parse_args()
    arrays = bert_base_arrays(hidden=args.hidden, heads=args.heads, random_bias=args.random_bias)
    vec = MultiHeadAttention.from_arrays(arrays)
    row0 = MultiHeadAttention(arrays["W"], arrays["v"][:, 0, :], arrays["u"], float(arrays["c"][0]))
    cols = ["route", "learner", "queries", "error", "wall s", "model s", "learner ÷ model", "traced peak MiB",
            "max RSS MiB", "load avg"]
    table = Table(cols)
    print("| " + " | ".join(cols) + " |", flush=True)
    for route in args.routes:
        if route == "head":
            from attnprobe.learners.head.lowrank import extract_lowrank
            from attnprobe.models.attention import AttentionHead

            h = AttentionHead(row0.W[0], row0.v[0], row0.u[0], row0.c)
            r = ["one head, output row 0 (scalar)", "lowrank, rank 64 given",
                 *_measure(h, lambda o: extract_lowrank(o, rank=64), lambda res: relative_error(res.model.W, h.W))]
        elif route == "vector":
            from attnprobe.learners.multihead.vector import extract_vector

            r = ["whole layer, K = 768 outputs", "multi-head (vector answers)",
                 *_measure(vec, lambda o: extract_vector(o, seed=0), lambda res: match_heads(vec, res.model).worst)]
        elif args.run_layer:
            from attnprobe.learners.multihead.generic import extract_generic

            r = ["whole layer, output row 0 (scalar)",
                 "multi-head generic, rank 64 given" + (", no query bias (--no-bias)" if args.no_bias else ""),
                 *_measure(row0, lambda o: extract_generic(o, rank=64, seed=0, bias=not args.no_bias),
                           lambda res: match_heads(row0, res.model).worst)]
        else:
            est = estimate_queries("multihead", args.hidden, heads=args.heads, rank=64)
            r = ["whole layer, output row 0 (scalar)", "multi-head generic, rank 64 given",
                 f"≈ {est.queries} (estimate; not run)", "—", "—", "—", "—", "—", "—", "—"]
        table.add(*r)
        print("| " + " | ".join(map(str, r)) + " |", flush=True)
    if args.write:
        write_section(TITLE, table.markdown(), command_line(), doc=DOC)


if __name__ == "__main__":
    main()
