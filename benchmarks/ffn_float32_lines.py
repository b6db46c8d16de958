"""The FFN learner on float32 answers: how many search lines each run needs, its bill against `--estimate`, and
whether the result is right.

    PYTHONPATH=src python benchmarks/ffn_float32_lines.py [--seeds 10] [--first-seed 0]
        [--families bias-free biased torch] [--write]

The learner searches one line and, when the polished neurons do not explain every answer, up to two more
(``learners/ffn/more_lines.py``); each extra line costs about a third of the bill, so a run's count is within 10 %
of the one-line estimate only when one line sufficed. Before them a repair line is tried
(``learners/ffn/repair.py``: a fresh line tested against the first line's predicted kinks, searched only where
they are contradicted); a run it mends counts as one line and in the column "mended by the repair line". Before
the repair, neurons the line missed are looked for in the polish answers (``learners/ffn/missing.py``, no query):
a run they mend counts as one line and in the column "mended in the polish answers".
Per target, over seeds 0 … n−1 (``--first-seed`` k: k … k+n−1; nets as in ``benchmarks/estimate.py``:
``random_relu_net(d, m, seed=1000·d + m + s)`` learned with seed s; biased nets and float32 torch one-layer
transformers as in ``benchmarks/ffn_float32_kernels.py``): the runs that needed 1 / 2 / 3 lines, the queries
(check included), the estimate's offset and the runs within 10 % of it, the runs whose functional check passed,
the runs with every neuron within 1e-3 (matched one to one), the worst check error.
Run it with another tree's ``src`` on ``PYTHONPATH`` for a before/after comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

DOC = "ffn-float32"  # its results file: docs/benchmarks/ffn-float32.md
TITLE = "FFN learner on float32 answers: search lines per run, estimate and outcome"


def _net_run(d, m, bias, seed):
    from attnprobe.learners.ffn import extract_ffn
    from attnprobe.models import neuron_errors
    from attnprobe.oracles import Oracle
    from attnprobe.targets import random_relu_net

    if bias:  # benchmarks/ffn_float32_kernels.py's biased family
        net = random_relu_net(d, m, seed=seed, dtype="float32", bias=True)
        o = Oracle(net, d, precision="float32")
    else:  # benchmarks/estimate.py's float32 targets
        net = random_relu_net(d, m, seed=1000 * d + m + seed)
        o = Oracle(net.with_dtype("float32"), d, precision="float32")
    res = extract_ffn(o, seed=seed)
    ne = neuron_errors(net.A, net.w_o, res.model.A, res.model.w_o,
                       **({"b_true": net.b, "b_hat": res.model.b} if bias else {}))
    return o.queries, *_lines(res.details), res.check, ne["within_1e-3"] == m and ne["matched_one_to_one"]


def _lines(details) -> tuple[int, str]:
    """Whole search lines of a run, and what mended a one-line run: ``"answers"`` (neurons found in the polish
    answers, no query; or none added, the first line's set kept as polished), ``"repair"`` (the repair line) or
    ``""``."""
    more = details.get("more_lines", {})
    lines = more.get("lines", 1)
    if "found_in_answers" in more:
        return 1, "answers"
    return lines, "repair" if lines == 1 and "repair line" in more.get("kept", "") else ""


def _torch_run(d, m, seed):
    import torch

    from attnprobe.learners.transformer import extract_transformer
    from attnprobe.models import neuron_errors
    from attnprobe.oracles.torch_adapter import TorchOneLayerTransformer, oracle_from_torch, transformer_from_torch

    torch.manual_seed(seed)
    vic = TorchOneLayerTransformer(d, m, dtype=torch.float32).eval()
    truth = transformer_from_torch(vic)
    o = oracle_from_torch(vic)
    res = extract_transformer(o, seed=seed)
    ne = neuron_errors(truth.A, truth.w_o, res.model.A, res.model.w_o)
    return o.queries, *_lines(res.details["ffn"]), res.check, ne["within_1e-3"] == m and ne["matched_one_to_one"]


def targets(families):
    out = []
    if "bias-free" in families:
        out += [(f"d={d}, m={m}, bias-free net", dict(method="ffn", d=d, hidden=m, precision="float32"),
                 lambda s, d=d, m=m: _net_run(d, m, False, s)) for d, m in ((8, 8), (16, 16), (8, 32))]
    if "biased" in families:
        out += [(f"d={d}, m={m}, biased net", dict(method="ffn", d=d, hidden=m, precision="float32"),
                 lambda s, d=d, m=m: _net_run(d, m, True, s)) for d, m in ((8, 16), (8, 32), (16, 16), (16, 32))]
    if "torch" in families:
        out += [(f"torch one-layer transformer d={d}, m={m}", None, lambda s, d=d, m=m: _torch_run(d, m, s))
                for d, m in ((8, 8), (8, 16), (16, 16))]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--families", nargs="+", default=["bias-free", "biased", "torch"])
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    from attnprobe.learners.core.estimate import estimate_queries
    from attnprobe.reports import Table

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from estimate import against_real, print_and_write  # the estimate benchmark's columns and table tail

    table = Table(["target", "seeds", "runs on 1 / 2 / 3 lines", "mended in the polish answers",
                   "mended by the repair line",
                   "queries (check included)", "estimate",
                   "estimate ÷ real − 1", "within 10 %", "check passed", "every neuron < 1e-3",
                   "worst check error", "load avg"])
    for name, kw, run in targets(a.families):
        t0 = time.perf_counter()
        got = [run(s) for s in range(a.first_seed, a.first_seed + a.seeds)]
        q = np.array([g[0] for g in got])
        lines = [sum(g[1] == k for g in got) for k in (1, 2, 3)]
        if kw is not None:
            kw = dict(kw)
            est = estimate_queries(kw.pop("method"), kw.pop("d"), **kw).queries
            est_cols = (est, *against_real(est, q))
        else:
            est_cols = ("–", "–", "–")
        table.add(name, a.seeds, " / ".join(map(str, lines)), sum(g[2] == "answers" for g in got),
                  sum(g[2] == "repair" for g in got), f"{q.min()} – {q.max()}",
                  *est_cols,
                  f"{sum(bool(g[3].passed) for g in got)}/{a.seeds}", f"{sum(bool(g[4]) for g in got)}/{a.seeds}",
                  f"{max(float(g[3].error) for g in got):.1e}", f"{os.getloadavg()[0]:.1f}")
        print("| " + " | ".join(map(str, table.rows[-1])) + f" |  ({time.perf_counter() - t0:.0f} s)", flush=True)
    print_and_write(TITLE, table.markdown(), "ffn_float32_lines.py", argv, a.write, doc=DOC)


if __name__ == "__main__":
    main()
