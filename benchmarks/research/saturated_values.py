"""Research: value vectors of every head from the saturated half circle (route (a)).

PYTHONPATH=src python benchmarks/research/saturated_values.py
Prints, per target: heads found, worst relative error of v_h (matched), queries, radius.
"""
from __future__ import annotations

import sys
import time

import numpy as np
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from mh_common import minilm_mh, random_mh  # noqa: E402

from attnprobe.learners.multihead.saturation import saturated_values  # noqa: E402
from attnprobe.oracles.base import Oracle  # noqa: E402


def v_error(v_true, v_got):
    if len(v_got) != len(v_true):
        return float("nan")
    D = np.linalg.norm(v_true[:, None] - v_got[None], axis=2) / np.linalg.norm(v_true, axis=1)[:, None]
    r, c = linear_sum_assignment(D)
    return float(D[r, c].max())


def run(name, m, seed, y_scale=1.0):
    o = Oracle(m, m.d)
    rng = np.random.default_rng(seed)
    d = m.d
    X = np.concatenate([np.zeros((1, 1, d)), np.eye(d)[:, None]])
    a = o(X)
    c, v_sum = a[0], a[1:] - a[0]
    y = y_scale * rng.standard_normal(d) / np.sqrt(d)
    base = c + y @ v_sum
    t = time.perf_counter()
    st = saturated_values(o, y, v_sum, base, rng)
    print(f"{name:28s} H={m.H:2d} found={len(st.v):2d} v_err={v_error(m.v, st.v):.2e} "
          f"signres={st.details['sign_residual']:.1e} "
          f"queries={o.queries} radius={st.radius:.1e} cones={st.details['cones']} t={time.perf_counter()-t:.1f}s")


if __name__ == "__main__":
    for d, H in [(8, 2), (8, 4), (16, 3), (16, 4), (32, 4), (64, 4)]:
        for seed in range(3):
            run(f"random d={d} seed={seed}", random_mh(d, H, seed), seed)
    for row in (0, 7):
        run(f"MiniLM L0 row {row}", minilm_mh(0, row), 0, y_scale=np.sqrt(384))
