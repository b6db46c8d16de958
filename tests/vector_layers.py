"""A random vector-output multi-head layer (App. C) of the kind the every-position tests learn: ``W_h = 3·K_hᵀQ_h/√d_h``
at logits of order one, ``V_h`` of rank ``d_h``, query biases and an output bias; and the progression-fit problem
the vector learner's kernels solve."""

import numpy as np

from attnprobe.models.multihead import MultiHeadAttention


def true_layer(d: int = 32, H: int = 4, seed: int = 1) -> MultiHeadAttention:
    rng = np.random.default_rng(seed)
    dh = d // H
    Q, Kk = rng.standard_normal((H, dh, d)) / np.sqrt(d), rng.standard_normal((H, dh, d)) / np.sqrt(d)
    V = np.einsum("khr,hrd->hkd", rng.standard_normal((d, H, dh)) / np.sqrt(d),
                  rng.standard_normal((H, dh, d)) / np.sqrt(d))
    W = 3 * np.einsum("hrd,hre->hde", Kk, Q) / np.sqrt(dh)
    return MultiHeadAttention(W, V, rng.standard_normal((H, d)) * 0.3, rng.standard_normal(d))


def progression_problem(rng: np.random.Generator, K: int, H: int, q: int, N: int, n: int):
    """Rows of progressions ``[b; b + δ; …; b + (N−1)δ]`` at n random points t ∈ R^q: the design ``T`` (n·N rows
    ``[t; k]``), the true ``θ`` (H, q + 2), the value weights ``w`` (K, H) and the exact answers
    ``Σ_h μ_N(θ_hᵀ[t; k; 1]) w_h`` (K, n·N). Draws t, θ, w from ``rng`` in that order."""
    from attnprobe.learners.multihead.vector_heads import mean_index

    t = rng.standard_normal((n, q))
    T = np.concatenate([np.repeat(t, N, axis=0), np.tile(np.arange(N), n)[:, None]], axis=1)
    theta = rng.standard_normal((H, q + 2)) * 0.7
    w = rng.standard_normal((K, H))
    return T, theta, w, w @ mean_index(theta @ np.concatenate([T, np.ones((len(T), 1))], axis=1).T, N)[0]
