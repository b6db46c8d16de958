"""A learner written from scratch and registered in one call: Thm 4.1 with probes ``a = scale·q`` (q: the rows
of a random orthogonal matrix, so ``aᵀv ≠ 0`` almost surely). Registering it is all it takes for
``attnprobe extract --method rotated --scale S``, the refusal of ``--scale`` for every other learner,
``attnprobe extract --method rotated --estimate``, ``attnprobe audit --method rotated`` and the learner contract
tests."""

import numpy as np

from attnprobe.learners.core import Option, QueryCount, Run, register
from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.head.sigmoid import measure_logits
from attnprobe.models import AttentionHead


def extract_rotated(oracle, *, seed=0, progress=None, scale=1.0):
    d = oracle.d
    run = Run(oracle, "rotated", seed=seed, progress=progress)
    run.plan(d * d + 2 * d + 1, f"the rotated-probe learner at d = {d}")
    with run.phase("values"):  # f([x]) = xᵀv + c for x = 0, e_1, …, e_d
        y = oracle(np.vstack([np.zeros((1, d)), np.eye(d)])[:, None, :])
    c, v = float(y[0]), y[1:] - y[0]
    A = scale * random_orthogonal(d, run.rng)
    with run.phase("logits"):  # [(a + b); b] -> logit aᵀ(W b + u) for b = 0, e_1, …, e_d (eq. 1)
        L = np.column_stack([measure_logits(oracle, A, b, v, c).values for b in np.vstack([np.zeros(d), np.eye(d)])])
    u, W = np.linalg.solve(A, L[:, 0]), np.linalg.solve(A, L[:, 1:] - L[:, :1])
    return run.finish(AttentionHead(W, v, u, c), unknowns=d * d + 2 * d + 1)


def estimate_rotated(s):  # s: the Setting asked about (d, the answers, the options); nothing is adaptive
    return QueryCount.exactly(s.d * s.d + 2 * s.d + 1 + s.check_queries, "d²+2d+1 unknowns and the check")


def register_rotated():
    return register("rotated", extract_rotated, recovers="head", help="Thm 4.1 with rotated probes (an example)",
                    options=[Option("scale", float, "norm of the rotated probes", default=1.0, low=0, open_low=True)],
                    estimate=estimate_rotated)


ENTRY = register_rotated()
