"""How well does the values stage know its own error? Runs the saturated circle (``saturated_values``) of the
generic multi-head learner on random layers and on all six MiniLM-L6 layers, float64 and float32 answers, and
prints per run the worst true relative error of the v_h against the stage's own bound (``ValueStage.v_err``).

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_value_error.py [--write]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners.head.exact import learn_value
from attnprobe.learners.multihead.saturation import saturated_values
from attnprobe.oracles.base import Oracle
from attnprobe.reports import Table
from sections import command_line, write_section
from attnprobe.targets.minilm import minilm_layer
from attnprobe.targets.multihead import random_multihead

sys.path.insert(0, os.path.dirname(__file__))
from multihead_generic import FactorForm  # noqa: E402

DOC = "multihead"  # its results file: docs/benchmarks/multihead.md
TITLE = "Multi-head: the values stage's own error bound against the true value-vector errors"


def row(name, truth, oracle):
    rng = np.random.default_rng(0)
    v_sum, c, _ = learn_value(oracle, True)
    y = rng.standard_normal(truth.d) / np.sqrt(truth.d)
    try:
        st = saturated_values(oracle, y, v_sum, c + y @ v_sum, rng)
    except AttnprobeError as exc:
        return [name, oracle.precision, "—", "—", "—", "—", f"{type(exc).__name__}"]
    dist = np.linalg.norm(st.v[:, None] - truth.v[None], axis=2)
    true = dist.min(axis=1)
    ratio = st.v_err / np.maximum(true, 1e-300)
    return [name, oracle.precision, f"{len(st.v)}/{truth.H}", f"{np.max(true / np.linalg.norm(st.v, axis=1)):.1e}",
            f"{st.details['value_error']:.1e}", f"{ratio.min():.1f} … {ratio.max():.1f}", st.queries]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    table = Table(["layer", "answers", "heads found", "worst v_h error (true)", "bound (value_error)",
                   "bound / true error per head", "queries"])
    for dtype in ("float64", "float32"):
        for d, H in [(16, 2), (32, 4), (64, 4)]:
            t = random_multihead(d, H, seed=0)
            table.add(*row(f"random d={d} H={H}", t, Oracle(t.with_dtype(dtype), d, precision=dtype)))
            print(table.markdown().splitlines()[-1], flush=True)
        for layer in range(6):
            t = minilm_layer(layer, 0)
            fast = FactorForm(t, 32, np.float32 if dtype == "float32" else np.float64)
            table.add(*row(f"MiniLM L{layer}", t, Oracle(fast, t.d, precision=dtype)))
            print(table.markdown().splitlines()[-1], flush=True)
    body = table.markdown()
    print(body)
    if args.write:
        write_section(TITLE, body, command_line(), doc=DOC)


if __name__ == "__main__":
    main()
