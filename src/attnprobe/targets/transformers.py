"""Seeded random ReLU networks (bias-free as in Sec. 4.1, or with biases and K outputs) and one-layer
transformers (Sec. 4.1 targets)."""

from __future__ import annotations

import numpy as np

from attnprobe.models.ffn import ReLUNet
from attnprobe.models.transformer import MultiHeadTransformer, OneLayerTransformer


def random_relu_net(d: int, m: int, *, seed: int = 0, dtype: str = "float64", bias: bool = False,
                    outputs: int | None = None) -> ReLUNet:
    """``x ↦ w_oᵀReLU(Aᵀx)`` with Gaussian ``A`` (entries N(0, 1/d)) and Gaussian ``w_o``.

    ``bias=True`` adds Gaussian hidden biases ``b`` (N(0, 1), the scale of ``aᵀx`` on N(0, I) inputs) and output
    bias ``c``; ``outputs=K`` gives ``w_o`` of shape (m, K) and K answers per query (a classifier's logits).
    The bias-free single-output net of a seed is the same as before these options existed.
    """
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((d, m)) / np.sqrt(d)
    w_o = rng.standard_normal(m) if outputs is None else rng.standard_normal((m, outputs))
    b = c = None
    if bias:
        b = rng.standard_normal(m)
        c = rng.standard_normal(() if outputs is None else (outputs,))
    return ReLUNet(A, w_o, dtype, b, c)


def random_transformer(d: int, m: int, *, seed: int = 0, scale: float = 1.0, rank: int | None = None,
                       dtype: str = "float64") -> OneLayerTransformer:
    """A random one-layer transformer: ``W = KᵀQ`` normalised so the logits of unit-variance inputs have standard
    deviation ≈ ``scale`` (as :func:`random_head`), and the FFN of :func:`random_relu_net`."""
    rng = np.random.default_rng(seed)
    r = d if rank is None else int(rank)
    W = rng.standard_normal((r, d)).T @ rng.standard_normal((r, d))
    W *= scale / np.linalg.norm(W)
    net = random_relu_net(d, m, seed=int(rng.integers(2**31)))
    return OneLayerTransformer(W, net.A, net.w_o, dtype)


def random_multihead_transformer(d: int, heads: int, m: int, *, outputs: int = 1, bias: bool = True,
                                 residual: bool = False, head_dim: int | None = None, seed: int = 0,
                                 scale: float = 1.0, dtype: str = "float64") -> MultiHeadTransformer:
    """A random multi-head one-layer transformer: the heads' ``W_h, u_h`` as :func:`random_multihead` (head
    dimension ``max(2, d // heads)`` by default), ``V_h = O_h P_h`` of rank ``head_dim`` (Gaussian factors,
    scaled so ``Σ_h V_h x`` has about the scale of x) and the FFN of :func:`random_relu_net` with ``outputs``
    outputs (biases when ``bias``)."""
    from attnprobe.errors import ConfigError
    from attnprobe.targets.multihead import random_multihead

    if int(outputs) < 1:
        raise ConfigError(f"outputs must be at least 1; got {outputs}", param="outputs")
    d_h = max(2, d // heads) if head_dim is None else int(head_dim)
    mh = random_multihead(d, heads, d_h, seed=seed, bias=bias, scale=scale)
    d_h = max(2, d // heads) if head_dim is None else int(head_dim)
    rng = np.random.default_rng([seed, 19])
    V = np.einsum("hik,hkj->hij", rng.standard_normal((heads, d, d_h)), rng.standard_normal((heads, d_h, d)))
    V /= np.sqrt(heads * d_h * d)
    net = random_relu_net(d, m, seed=int(rng.integers(2**31)), bias=bias, outputs=outputs)
    b = net.b if bias else np.zeros(m)
    c = net.c if bias else np.zeros(outputs)
    return MultiHeadTransformer(mh.W, mh.u, V, net.A, b, net.w_o, c, residual, dtype)
