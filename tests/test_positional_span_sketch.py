"""span_sweep.group_bases through sketches of the span matrices (the path past SKETCH_ABOVE numbers a matrix)."""

import numpy as np
import pytest


@pytest.mark.parametrize("seed", [0, 1])
def test_group_bases_read_through_sketches_find_the_groups(seed, monkeypatch):
    """span_sweep.group_bases on sketched span matrices (the 8B-size path, forced here) still finds each key/value
    group's heads: the found combinations put no weight on another group's heads."""
    from attnprobe.learners.positional import span_sweep

    H, G, dh, K = 4, 2, 8, 64
    per, r = H // G, G * dh
    rng = np.random.default_rng(seed)
    Wv, Wo = rng.standard_normal((G, dh, r)), rng.standard_normal((H, K, dh))
    F = np.stack([Wo[h] @ Wv[h // per] for h in range(H)]).reshape(H, -1)
    w, U = np.linalg.eigh(F @ F.T)
    A = U.T / np.sqrt(w)[:, None]  # the span's orthonormal basis S = A V, as value_span gives it
    monkeypatch.setattr(span_sweep, "SKETCH_ABOVE", 0)
    monkeypatch.setattr(span_sweep, "SKETCH_WIDTH", 2)  # 16 rows of 64, the 16 columns
    found = span_sweep.group_bases((A @ F).reshape(H, K, r), dh, G, np.random.default_rng(seed))
    for sub in found:
        weight = np.abs(sub @ A).reshape(per, G, per).sum(axis=(0, 2))
        assert weight.max() > (1 - 1e-8) * weight.sum()
