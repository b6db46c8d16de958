"""Targets meeting Thm 6.1 / B.1 assumptions, shared by the issue-4 tests."""

import numpy as np

from attnprobe.models import AttentionHead
from attnprobe.targets import random_head


def theorem_head(d, seed, w_norm=2.0, zero_v=0):
    rng = np.random.default_rng(10_000 + seed)
    h = random_head(d, seed=seed, bias=False)
    W = h.W / np.linalg.norm(h.W) * w_norm
    v = rng.choice([-1.0, 1.0], d) * rng.uniform(1.0, 2.0, d)
    if zero_v:
        v[rng.choice(d, zero_v, replace=False)] = 0.0
    return AttentionHead(W, v / np.linalg.norm(v))


def margin(h):
    return float(np.abs(h.v[h.v != 0]).min())
