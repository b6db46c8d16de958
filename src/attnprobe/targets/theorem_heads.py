"""Heads meeting the assumptions of Thm 6.1 / Thm B.1: bias-free, ‖W‖_F fixed, ‖v‖ = 1 with a margin."""

from __future__ import annotations

import numpy as np

from attnprobe.models.attention import AttentionHead
from attnprobe.targets.random_heads import random_head


def theorem_head(d: int, seed: int, w_norm: float = 2.0, zero_v: int = 0) -> AttentionHead:
    """A bias-free head with ``‖W‖_F = w_norm``, ``‖v‖ = 1`` and ``|v_i| ∈ [1, 2]/‖·‖`` (or 0 for ``zero_v``
    entries), so the margin ``μ = min_{v_i ≠ 0} |v_i|`` of Thm 6.1 is bounded below."""
    rng = np.random.default_rng(10_000 + seed)
    h = random_head(d, seed=seed, bias=False)
    W = h.W / np.linalg.norm(h.W) * w_norm
    v = rng.choice([-1.0, 1.0], d) * rng.uniform(1.0, 2.0, d)
    if zero_v:
        v[rng.choice(d, zero_v, replace=False)] = 0.0
    return AttentionHead(W, v / np.linalg.norm(v))


def margin(head: AttentionHead) -> float:
    """The margin ``μ = min |v_i|`` over the non-zero entries of v (Thm 6.1)."""
    return float(np.abs(head.v[head.v != 0]).min())
