"""Post-norm (BERT) blocks: the FFN stage given the neurons, the assembled block and its joint polish
(``learners/block/post_norm_ffn.py``, ``post_norm_polish.py``; docs/block.md, "Post-norm blocks") against the truth —
a random transformers ``BertLayer`` (d = 32, 2 heads of 16, FFN 64, norm weights not 1) and MiniLM layer 2 (d = 384,
12 heads, FFN 1536), float64.

The stages before (output norm, first-norm centre and input, attention) run first; the FFN stage is then given the
block's true first layer on ``z`` (``W1 diag(w1)``, ``W1 b1 + b1_F``: the neurons, which no stage reads yet), or that
first layer perturbed by a relative ``--delta``, and reads the rest (every row's scale, n1's weight, the second
layer, the joint bias) from single tokens as one null vector. Reported: the null vector's eigenvalue and the next
(relative), the whole layer against the truth at every position of 4 fresh N(0, 1) sequences per length (the block
check's norm: the largest error over the largest ``|y − x|``), before and after the polish (``--rounds`` Gauss–Newton
steps of ``--iterations`` LSMR iterations on ``--sequences`` sequences), queries, seconds, peak memory.

    python benchmarks/post_norm_ffn.py [--write] [--only toy|minilm] [--cache FILE] [--rounds R] [--sequences S]
        [--iterations I] [--delta D ...]

MiniLM's attention comes from the pairs cached by ``benchmarks/post_norm_attention.py --cache FILE`` (its queries
and seconds are added).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from attnprobe.learners.block.post_norm import output_norm
from attnprobe.learners.block.post_norm_attention import attention_from_pairs
from attnprobe.learners.block.post_norm_ffn import ffn_points, second_layer
from attnprobe.learners.block.post_norm_neurons import (neuron_curves, neuron_span, rank_one_elements,
                                                        sphere_jacobians)
from attnprobe.learners.block.post_norm_polish import assemble, polish_block, polish_data
from attnprobe.oracles.hf_block import block_model, hf_block
from attnprobe.reports import Table
from attnprobe.targets.hf import minilm_dir
from post_norm import tiny_bert_layer
from post_norm_attention import read
from post_norm_stages import Counted
from sections import publish

DOC = "block"
LENGTHS = (1, 2, 5, 17, 64)


def whole_layer(truth, block) -> list[float]:
    """Per length of :data:`LENGTHS`: the largest error at any position of 4 fresh sequences over the largest
    ``|y − x|`` (the block check's norm)."""
    out = []
    for N in LENGTHS:
        X = np.random.default_rng(1000 + N).standard_normal((4, N, truth.d))
        y = truth.every_position(X)
        out.append(float(np.abs(block.every_position(X) - y).max() / np.abs(y - X).max()))
    return out


def _fmt(errs):
    return " / ".join(f"{e:.1e}" for e in errs)


def read_neurons(rows, affine, n2, m: int, rng):
    """Stage neurons from answers (4m points): ``(A, a, sweeps, span residual, curve misfit)``."""
    Z, Q, O = sphere_jacobians(rows, affine, n2, rng, 4 * m)
    B, Y, res = neuron_span(Z, Q, O, m)
    A, a, misfit = neuron_curves(B, Y, rank_one_elements(B, m, rng), Z)
    return A, a, len(res), res[-1], misfit


def measure(name, victim, *, step, pairs, delta, rounds, iterations, sequences, cache=None):
    truth = block_model(victim)
    d = truth.d
    t0 = time.perf_counter()
    affine, readings, before, s_before, s_pairs = read(victim, step, pairs, cache, 0)
    rows = Counted(victim)
    rng = np.random.default_rng(1)
    stage = attention_from_pairs(readings, affine, truth.attention.H)
    n2 = output_norm(rows, d, rng)
    A = truth.ffn.W1 * truth.norm1_w
    a = truth.ffn.W1 @ truth.norm1_b + truth.ffn.b1
    given = "true" if not delta else f"true × (1 + {delta:g}·N(0, 1))"
    if delta is None:
        A, a, sweeps, span, curves = read_neurons(rows, affine, n2, A.shape[0], rng)
        given = f"read ({sweeps} sweeps, span {span:.1e}, curves {curves:.1e})"
    elif delta:
        g = np.random.default_rng(7)
        A = A * (1 + delta * g.standard_normal(A.shape))
        a = a + delta * np.abs(a).mean() * g.standard_normal(a.shape)
    Z, Q = ffn_points(rows, affine, n2, rng, 2 * (A.shape[0] + d + 1))
    second = second_layer(Z, Q, A, a)
    block = assemble(stage.attention, second.w1, second.ffn, n2)
    assembled = whole_layer(truth, block)
    stage_q = rows.queries
    seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    polished, history = block, []
    if rounds:
        data = polish_data(rows, d, rng, sequences)
        polished, report = polish_block(block, data, rounds=rounds, iterations=iterations)
        history = report.history
    s_polish = time.perf_counter() - t1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return [name, given, f"{second.null:.1e} / {second.gap:.1e}",
            _fmt(assembled), (" → ".join(f"{h:.1e}" for h in history) or "—"), _fmt(whole_layer(truth, polished)),
            f"{before:,} + {stage.queries:,} + {stage_q:,} + {rows.queries - stage_q:,}",
            f"{s_before + s_pairs + seconds:.0f} + {s_polish:.0f}", f"{peak:.1f}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/block.md")
    ap.add_argument("--only", choices=("toy", "minilm"), default="toy", help="the victim (each has its own section)")
    ap.add_argument("--cache", type=Path, help="MiniLM's pairs, read by benchmarks/post_norm_attention.py --cache")
    ap.add_argument("--pairs", type=int, default=60, help="MiniLM's pairs in the cache")
    ap.add_argument("--rounds", type=int, default=4, help="Gauss–Newton steps of the polish (0: none)")
    ap.add_argument("--iterations", type=int, default=200, help="LSMR iterations per step")
    ap.add_argument("--sequences", type=int, default=100, help="sequences of the polish")
    ap.add_argument("--delta", type=float, nargs="*", default=[0.0], help="relative perturbations of the neurons")
    ap.add_argument("--read-neurons", action="store_true", help="a row with the neurons read by stage neurons")
    args = ap.parse_args()
    t = Table(["victim", "first layer given", "null / next eigenvalue", "assembled at N = 1, 2, 5, 17, 64",
               "polish misfit", "polished at N = 1, 2, 5, 17, 64",
               "queries (stages + attention + FFN + polish)", "seconds (stages + polish)", "peak RSS GiB"])
    kw = dict(rounds=args.rounds, iterations=args.iterations, sequences=args.sequences)
    victim = "MiniLM layer 2" if args.only == "minilm" else "BertLayer d = 32"
    if args.only == "toy":
        with tempfile.TemporaryDirectory() as tmp:
            for delta in args.delta + ([None] if args.read_neurons else []):
                t.add(*measure("BertLayer d = 32, 2 heads, FFN 64", tiny_bert_layer(Path(tmp) / "b32", d=32, heads=2),
                               step=0.1, pairs=24, delta=delta, **kw))
    else:
        for delta in args.delta:
            t.add(*measure("MiniLM layer 2", hf_block(str(minilm_dir()), 2), step=0.2, pairs=args.pairs, delta=delta,
                           cache=args.cache, **kw))
    body = ("The post-norm block past its neurons (float64): the FFN stage given the first layer, the block "
            "assembled from the stages and its joint polish, against the truth:\n\n" + t.markdown())
    publish(f"Post-norm stage ffn given the neurons, and the joint polish (float64): {victim}", body, doc=DOC,
            write=args.write)


if __name__ == "__main__":
    main()
