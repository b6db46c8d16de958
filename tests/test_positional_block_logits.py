"""block_logits.py: the logit maps block by block of the input's coordinates, their gauges aligned on shared ones."""

import numpy as np
import pytest

from attnprobe.errors import ConfigError
from attnprobe.learners.positional.block_logits import (align_block, apply_gauges, block_coordinates,
                                                        block_logit_maps)
from attnprobe.models.positional import rotation_matrix
from attnprobe.targets import random_rope_attention


def _scores(Wq, Wk, theta, delta):
    H, dh, _ = Wq.shape
    per = H // Wk.shape[0]
    return np.einsum("hai,ab,hbj->hij", Wq, rotation_matrix(delta, theta, dh), Wk[np.arange(H) // per])


def test_blocks_cover_every_coordinate_and_share_the_anchor():
    blocks = block_coordinates(70, 24, 8, np.random.default_rng(0))
    assert all(len(b) == 24 for b in blocks)
    assert all(np.array_equal(b[:8], blocks[0][:8]) for b in blocks)
    assert set(np.concatenate(blocks)) == set(range(70))
    with pytest.raises(ConfigError):
        block_coordinates(70, 8, 8, np.random.default_rng(0))


@pytest.mark.parametrize("seed", [0, 1])
def test_blocks_in_random_gauges_are_assembled_into_the_layers_scores(seed):
    """Each block's maps in its own gauge — a random scaled rotation per pair, a random mixing of the slow pairs (a
    near-gauge: the first block keeps the layer's own) — come back in the first block's: the assembled maps give the
    layer's scores between every two coordinates."""
    d, H, G = 48, 4, 2
    m = random_rope_attention(d, H, G, seed=seed, base=1e4)
    theta = np.asarray(m.inv_freq)
    dh, per = d // H, H // G
    slow = np.array([dh // 2 - 2, dh // 2 - 1])
    coords = np.concatenate([slow, slow + dh // 2])
    Wq, Wk = m.Wq * m.scale, m.Wk
    rng = np.random.default_rng(seed)
    out_q, out_k, ref = np.zeros_like(Wq), np.zeros_like(Wk), None
    for S in block_coordinates(d, 20, 8, rng):
        q, k = Wq[:, :, S].copy(), Wk[:, :, S].copy()
        for g in range(G if ref is not None else 0):
            hs = slice(g * per, (g + 1) * per)
            q[hs], k[g] = apply_gauges(q[hs], k[g], rng.standard_normal((dh // 2, 2)))
            A = np.eye(len(coords)) + 0.5 * rng.standard_normal((len(coords), len(coords)))
            q[hs][:, coords] = np.einsum("ab,hbs->has", A, q[hs][:, coords])
            k[g][coords] = np.linalg.solve(A.T, k[g][coords])
        if ref is None:
            ref = (q[:, :, :8], k[:, :, :8])
        else:
            q, k = align_block(q, k, *ref, 8, slow)
        out_q[:, :, S], out_k[:, :, S] = q, k
    for delta in (0.0, -7.0, -200.0):
        true = _scores(Wq, Wk, theta, delta)
        assert np.abs(_scores(out_q, out_k, theta, delta) - true).max() < 1e-9 * np.abs(true).max()


def test_block_logit_maps_refuse_more_tokens_than_a_block_keeps_apart():
    m = random_rope_attention(16, 2, 1, seed=0)
    with pytest.raises(ConfigError, match="tokens"):
        block_logit_maps(None, None, np.zeros((2, 8, 16)), None, np.asarray(m.inv_freq), 1,
                         np.random.default_rng(0), block=8, anchor=4, tokens=12)

