"""The FFN learner on ReLU networks with biases and K outputs (ReLU networks as they are).

    PYTHONPATH=src python benchmarks/ffn_biased.py [--dims 16 64 784] [--widths 16 64] [--outputs 1 10]
        [--precisions float64 float32] [--seeds 1] [--write]

For every (d, m, K, answer precision): a seeded random network with hidden and output biases
(:func:`attnprobe.targets.random_relu_net` with ``bias=True``), learned by ``extract_ffn`` from an oracle that
answers in that precision. Reported: queries (and queries / (d·m)), seconds, the relative L2 error of all outputs
on 1000 fresh N(0, I) inputs (the float64 truth), neurons recovered to < 1e-3 up to permutation and scale, and
whether the learner's own functional check passed. ``--write`` replaces the section in
docs/benchmarks/ffn.md (float64) or ffn-float32.md.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from attnprobe.learners.ffn import extract_ffn
from attnprobe.models import neuron_errors
from attnprobe.oracles import Oracle
from attnprobe.targets import random_relu_net

from attnprobe.reports import Table, relative_error as rel
from sections import write_section

DOC = "ffn"  # its results file: docs/benchmarks/ffn.md (float64 answers; float32: ffn-float32.md)
TITLE = "FFN learner: ReLU networks with biases and K outputs"


def one(d, m, K, precision, seed):
    net = random_relu_net(d, m, seed=1000 * d + m + seed, bias=True, outputs=None if K == 1 else K)
    oracle = Oracle(net.with_dtype(precision), d, precision=precision)
    t0 = time.perf_counter()
    res = extract_ffn(oracle, seed=seed)
    secs = time.perf_counter() - t0
    X = np.random.default_rng(seed + 7).standard_normal((1000, d))
    err = rel(res.model.forward(X), net.forward(X))
    ne = neuron_errors(net.A, net.w_o, res.model.A, res.model.w_o, b_true=net.b, b_hat=res.model.b)
    return [d, m, K, precision, seed, res.queries, round(res.queries / (d * m), 2), round(secs, 2), err,
            f"{ne['within_1e-3']}/{m}", "yes" if res.check.passed else "NO"]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", type=int, nargs="+", default=[16, 64, 784])
    ap.add_argument("--widths", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--outputs", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--precisions", nargs="+", default=["float64", "float32"])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for p in a.precisions:
        for d in a.dims:
            for m in a.widths:
                for K in a.outputs:
                    for s in range(a.seeds):
                        rows.append(one(d, m, K, p, s))
                        print(rows[-1], flush=True)
    head = ["d", "m", "K", "answers", "seed", "queries", "queries/(d·m)", "seconds", "rel. L2 error (1000 fresh)",
            "neurons < 1e-3", "check passed"]
    out = Table(head, rows).markdown()
    print(out)
    if a.write:
        write_section(f"{TITLE} ({', '.join(a.precisions)} answers)", out,
                      "PYTHONPATH=src python benchmarks/ffn_biased.py " + " ".join(argv or sys.argv[1:]),
                      doc=DOC if a.precisions == ["float64"] else DOC + "-float32")


if __name__ == "__main__":
    main()
