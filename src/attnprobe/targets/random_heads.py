"""Seeded random single-head targets."""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.attention import AttentionHead


def random_head(d: int, *, seed: int = 0, scale: float = 1.0, rank: int | None = None, bias: bool = True,
                zero_v: int = 0, dtype: str = "float64") -> AttentionHead:
    """A random head ``W = KᵀQ`` with Gaussian ``K, Q ∈ R^{r×d}`` (``r = rank`` or d) normalised so that for
    unit-variance inputs the logits ``x_iᵀW x_N`` have standard deviation ≈ ``scale`` (1 is typical, 1e-6 tiny,
    50 saturating); ``v`` Gaussian with ``zero_v`` entries set to 0; ``u``, ``c`` Gaussian when ``bias``."""
    if d < 1:
        raise ConfigError(f"the width d must be at least 1; got {d}", param="d")
    if rank is not None and not 1 <= rank <= d:
        raise ConfigError(f"rank must be between 1 and d = {d}; got {rank}", param="rank")
    rng = np.random.default_rng(seed)
    r = d if rank is None else int(rank)
    K = rng.standard_normal((r, d))
    Q = rng.standard_normal((r, d))
    W = K.T @ Q
    W *= scale / np.linalg.norm(W)  # E[(xᵀW y)²] = ‖W‖_F² for standard normal x, y
    v = rng.standard_normal(d)
    if zero_v:
        v[rng.choice(d, size=min(zero_v, d - 1), replace=False)] = 0.0
    u = scale * rng.standard_normal(d) / np.sqrt(d) if bias else None
    c = float(rng.standard_normal()) if bias else 0.0
    return AttentionHead(W, v, u, c, dtype)
