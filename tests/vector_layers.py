"""A random vector-output multi-head layer (App. C) of the kind the every-position tests learn: ``W_h = 3·K_hᵀQ_h/√d_h``
at logits of order one, ``V_h`` of rank ``d_h``, query biases and an output bias."""

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
