"""Negative result: do more saturated circles give better value vectors on float32 answers of a real layer?

Runs the values stage (``saturated_values``) of the generic multi-head learner on several random circles around
different last tokens of one MiniLM-L6 layer answered in float32, and keeps for every head the estimate with the
smallest self-measured error bound. Prints per circle and the per-head best (true errors against the layer).

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_float32_circles.py [--layer 0] [--circles 5]
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
from attnprobe.targets.minilm import minilm_layer

sys.path.insert(0, os.path.dirname(__file__))
from multihead_generic import FactorForm  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--circles", type=int, default=5)
    args = ap.parse_args(argv)
    truth = minilm_layer(args.layer, 0)
    oracle = Oracle(FactorForm(truth, 32, np.float32), truth.d, precision="float32")
    v_sum, c, _ = learn_value(oracle, True)
    best_est, best_true = np.full(truth.H, np.inf), np.full(truth.H, np.inf)
    for k in range(args.circles):
        rng = np.random.default_rng(100 + k)
        y = rng.standard_normal(truth.d) / np.sqrt(truth.d)
        try:
            st = saturated_values(oracle, y, v_sum, c + y @ v_sum, rng)
        except AttnprobeError as exc:
            print(f"circle {k}: {type(exc).__name__}: {str(exc)[-150:]}")
            continue
        if len(st.v) != truth.H:
            print(f"circle {k}: found {len(st.v)} heads of {truth.H}")
            continue
        dist = np.linalg.norm(st.v[:, None] - truth.v[None], axis=2)
        match = np.argmin(dist, axis=1)
        true = dist[np.arange(truth.H), match] / np.linalg.norm(truth.v[match], axis=1)
        est = st.v_err / np.linalg.norm(st.v, axis=1)
        print(f"circle {k}: {st.queries} queries, worst v_h error {true.max():.1e} (bound {est.max():.1e})")
        better = est < best_est[match]
        best_est[match[better]], best_true[match[better]] = est[better], true[better]
    print(f"best circle per head: worst v_h error {best_true.max():.1e} (bound {best_est.max():.1e}); per head "
          f"{np.array2string(best_true, precision=1)}")


if __name__ == "__main__":
    main()
