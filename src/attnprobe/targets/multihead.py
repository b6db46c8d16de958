"""Seeded random multi-head targets: generic heads, heads in mutually orthogonal subspaces (Assumption C.1)
and the non-identifiable heads of Prop. 7.1 (shared attention, values split among heads)."""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.multihead import MultiHeadAttention


def _head_dim(d: int, H: int, d_h: int | None) -> int:
    if H < 1 or d < 1:
        raise ConfigError(f"need d >= 1 and H >= 1 heads; got d={d}, H={H}", param="d")
    d_h = d // H if d_h is None else int(d_h)
    if d_h < 1:
        raise ConfigError(f"the head dimension must be at least 1 (d={d}, H={H}); give d_h", param="d_h")
    return d_h


def _random_bilinear(rng: np.random.Generator, H: int, d_h: int, dim: int, scale: float) -> np.ndarray:
    """``H`` matrices ``K_hᵀQ_h`` (``K, Q`` Gaussian ``d_h × dim``) with ``‖·‖_F = scale`` (logit std on N(0, I))."""
    K = rng.standard_normal((H, d_h, dim))
    Q = rng.standard_normal((H, d_h, dim))
    W = np.einsum("hkd,hke->hde", K, Q)
    return W * (scale / np.linalg.norm(W, axis=(1, 2), keepdims=True))


def orthogonal_subspaces(d: int, H: int, d_h: int, rng: np.random.Generator) -> np.ndarray:
    """Orthonormal bases ``E (H, d, d_h)`` of ``H`` mutually orthogonal random subspaces of R^d (H·d_h ≤ d)."""
    if H * d_h > d:
        raise ConfigError(f"{H} orthogonal subspaces of dimension {d_h} do not fit in R^{d}; need H·d_h <= d",
                          param="H")
    Z = rng.standard_normal((d, H * d_h))
    E, R = np.linalg.qr(Z)
    E = E * np.sign(np.diag(R))
    return np.ascontiguousarray(E.reshape(d, H, d_h).transpose(1, 0, 2))


def random_multihead(d: int, H: int, d_h: int | None = None, *, seed: int = 0, bias: bool = True,
                     orthogonal: bool = False, scale: float = 1.0, dtype: str = "float64") -> MultiHeadAttention:
    """A random ``H``-head layer with head dimension ``d_h`` (default ``d // H``): ``W_h = K_hᵀQ_h`` of rank
    ``d_h`` scaled so logits on N(0, I) rows have standard deviation ≈ ``scale``, Gaussian ``v_h``, and with
    ``bias`` Gaussian ``u_h`` (std ``scale/√d``) and ``c``.

    ``orthogonal=True`` puts every head's ``W_h, v_h, u_h`` inside its own subspace ``U_h`` of a random
    orthogonal family (Assumption C.1 / Prop. C.2); :func:`random_orthogonal_multihead` also returns the bases.
    """
    if orthogonal:
        return random_orthogonal_multihead(d, H, d_h, seed=seed, bias=bias, scale=scale, dtype=dtype)[0]
    d_h = _head_dim(d, H, d_h)
    rng = np.random.default_rng(seed)
    W = _random_bilinear(rng, H, d_h, d, scale)
    v = rng.standard_normal((H, d))
    u = scale * rng.standard_normal((H, d)) / np.sqrt(d) if bias else None
    c = float(rng.standard_normal()) if bias else 0.0
    return MultiHeadAttention(W, v, u, c, dtype)


def random_orthogonal_multihead(d: int, H: int, d_h: int | None = None, *, seed: int = 0, bias: bool = True,
                                scale: float = 1.0, dtype: str = "float64"
                                ) -> tuple[MultiHeadAttention, np.ndarray]:
    """Heads in mutually orthogonal subspaces (Assumption C.1): ``W_h = E_h W̃_h E_hᵀ``, ``v_h = E_h ṽ_h``,
    ``u_h = E_h ũ_h`` with ``W̃_h`` a full-rank ``d_h × d_h`` product ``K̃ᵀQ̃`` (‖W_h‖_F = ``scale``) and Gaussian
    ``ṽ_h``, ``ũ_h``. Returns the model and the orthonormal bases ``E (H, d, d_h)``."""
    d_h = _head_dim(d, H, d_h)
    rng = np.random.default_rng(seed)
    E = orthogonal_subspaces(d, H, d_h, rng)
    Wt = _random_bilinear(rng, H, d_h, d_h, scale)
    vt = rng.standard_normal((H, d_h))
    W = np.einsum("hdk,hkl,hel->hde", E, Wt, E)
    v = np.einsum("hdk,hk->hd", E, vt)
    u = None
    if bias:
        u = np.einsum("hdk,hk->hd", E, scale * rng.standard_normal((H, d_h)) / np.sqrt(d_h))
    c = float(rng.standard_normal()) if bias else 0.0
    return MultiHeadAttention(W, v, u, c, dtype), E


def shared_attention_multihead(d: int, H: int, *, tied: int | None = None, seed: int = 0, bias: bool = True,
                               scale: float = 1.0, dtype: str = "float64") -> MultiHeadAttention:
    """Prop. 7.1's non-identifiable layer: the first ``tied`` heads (default all ``H``) share one ``W = A`` and
    ``u``, and their values are ``v_h = λ_h b`` with random positive ``λ_h`` summing to 1, so only ``b`` is
    determined; the remaining heads are generic (full rank). Any split of ``b`` among the tied heads computes
    the same function (see :func:`attnprobe.models.identifiability.witness`)."""
    tied = H if tied is None else int(tied)
    if not 1 <= tied <= H:
        raise ConfigError(f"tied must be between 1 and H={H}; got {tied}", param="tied")
    rng = np.random.default_rng(seed)
    base = random_multihead(d, H, d, seed=int(rng.integers(2**31)), bias=bias, scale=scale, dtype=dtype)
    lam = rng.uniform(0.5, 1.5, tied)
    lam /= lam.sum()
    b = rng.standard_normal(d)
    W, v, u = base.W.copy(), base.v.copy(), base.u.copy()
    W[:tied] = base.W[0]
    u[:tied] = base.u[0]
    v[:tied] = lam[:, None] * b
    return MultiHeadAttention(W, v, u, base.c, dtype)
