"""Every head's value map from few tokens, for heads sharing keys and values (docs/positional.md, "The start at
LLaMA-3-8B's size"): the span of the value maps from every-position rows of kernel tokens, split by a few key probes.

With GQA, ``M = Σ_h V_h`` has a kernel (every ``V_h = W_O,h W_V,g`` vanishes on it) and a row space ``Q`` of rank
``r = G·d_h``. A sequence ``[ε q, e_1, …, e_n]`` with ``e_j`` in the kernel (value 0; keys and queries free) answers,
at row ``i``, ``Σ_h α_h,i,0 ε V_h q``; its odd part in ``ε`` is, to first order, ``L_i q`` with
``L_i = Σ_h a_hi V_h`` (``a_hi`` the first key's weight when it is zero, set by the kernel tokens alone). Over the
rows, the ``L_i Qᵀ`` span exactly ``{V_h Qᵀ}`` (dimension H; :func:`value_span`: ``2·nodes·r`` sequences of
``n + 1`` tokens). The span does not tell the heads of one group apart (they share ``W_V,g``: any mix of them has
rank ``d_h``); the key probe does (:func:`~.heads.head_directions` with :func:`~.coarse.key_derivative`): at a query
``z`` it gives each head's direction ``V_h z = Σ_k T_kh S_k Q z``, a column of ``T`` (:func:`split_span`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linear_sum_assignment

from attnprobe.learners.positional import coarse
from attnprobe.learners.positional.heads import head_directions

#: kernel tokens per sequence (rows read; at least H + 16), Chebyshev steps of ε per sign, the longest ε (of √d),
#: the kernel tokens' entries' size, key probes that split the span (their median)
ROWS, EPS_NODES, EPS, KEY_SCALE, SPLIT_PROBES = 48, 4, 0.3, 1.0, 8
#: sequences asked at once while reading the span
BATCH_BYTES = 2**28


def value_span(oracle, Q: np.ndarray, kernel: np.ndarray, heads: int, rng: np.random.Generator, *,
               rows: int = ROWS, nodes: int = EPS_NODES, eps: float = EPS, key_scale: float = KEY_SCALE):
    """An orthonormal basis ``S (H, K, r)`` of ``span{V_h Qᵀ}`` (``Q (r, d)`` orthonormal rows spanning ``M``'s
    row space, ``kernel`` its complement) from every-position rows (module docstring), and the singular values of
    the rows' matrix (a gap after the H-th says the span is read). Asks ``2·nodes·r`` sequences of ``rows + 1``
    tokens, in batches of at most :data:`BATCH_BYTES`."""
    r, d = Q.shape
    E = rng.standard_normal((rows, len(kernel))) @ kernel * key_scale
    u = coarse.chebyshev_nodes(nodes)
    step = eps * math.sqrt(d)
    per = max(1, BATCH_BYTES // (8 * 2 * nodes * (rows + 1) * d))
    L = None
    for at in range(0, r, per):
        q = Q[at:at + per]
        X = np.zeros((2, nodes, len(q), rows + 1, d))
        for s, sign in enumerate((1.0, -1.0)):
            X[s, :, :, 0] = sign * step * u[:, None, None] * q
        X[..., 1:, :] = E
        Y = np.asarray(oracle.answer_rows(X.reshape(-1, rows + 1, d)), dtype=np.float64)
        Y = Y.reshape(2, nodes, len(q), rows + 1, -1)[:, :, :, 1:]
        K = Y.shape[-1]
        if L is None:
            L = np.empty((rows, K, r))
        slope = coarse.odd_slope(((Y[0] - Y[1]) / 2).reshape(nodes, len(q), rows * K), u,
                                 min(2 * nodes - 1, coarse.DEGREE))  # (rows·K, len(q))
        L[:, :, at:at + len(q)] = slope.reshape(rows, K, len(q)) / step
    F = L.reshape(rows, -1)
    w, V = np.linalg.eigh(F @ F.T)  # the rows' Gram: F's right singular vectors without the (rows, K·r) SVD
    order = np.argsort(w)[::-1]
    sv = np.sqrt(np.maximum(w[order], 0.0))
    S = (V[:, order[:heads]].T @ F) / sv[:heads, None]
    return S.reshape(heads, -1, r), sv


def split_span(oracle, S: np.ndarray, Q: np.ndarray, M: np.ndarray, rng: np.random.Generator, *, kernel,
               probes: int = SPLIT_PROBES):
    """Each head's ``V_h`` (H, K, d) in the span ``S`` (:func:`value_span`): the key probe's directions at
    ``probes`` random queries, each a column of ``T`` up to sign and scale, ordered and signed as their median
    (three rounds), the median kept; the scales from ``Σ_h V_h = M``. Also each probe's largest distance from the
    median (a probe whose heads did not separate well is far: the median ignores it)."""
    H = S.shape[0]
    d = Q.shape[1]
    E, probe = coarse.probe_directions(d, rng, H + 4, kernel)
    raw = []
    for _ in range(probes):
        z = rng.standard_normal(d)
        W, _, _ = head_directions(oracle, z, E, eta=coarse.COARSE_STEP * math.sqrt(d), rank=H, noise=0.0, rng=rng,
                                  **probe)
        T = np.linalg.lstsq(np.einsum("hkr,r->kh", S, Q @ z), W, rcond=None)[0]
        raw.append(T / np.linalg.norm(T, axis=0))
    T = raw[0]
    for _ in range(3):
        aligned = [_align(Tj, T) for Tj in raw]
        T = np.median(aligned, axis=0)
        T /= np.linalg.norm(T, axis=0)
    parts = np.einsum("kh,kar->har", T, S)
    scale = np.linalg.lstsq(parts.reshape(H, -1).T, (M @ Q.T).reshape(-1), rcond=None)[0]
    return (parts * scale[:, None, None]) @ Q, np.array([np.abs(a - T).max() for a in aligned])


def span_queries(d: int, heads: int, kv_heads: int, *, rows: int = ROWS, nodes: int = EPS_NODES,
                 probes: int = SPLIT_PROBES) -> dict:
    """``{stage: (queries, tokens)}`` of :func:`value_span` and :func:`split_span` (the key probe: 128 queries of
    2 … 18 tokens per direction, ``H + 4`` directions a probe)."""
    r = kv_heads * (d // heads)
    per_direction = 2 * coarse.NODES * len(coarse.KEY_SETTINGS)
    tokens_per_direction = 2 * coarse.NODES * sum(2 + zeros for _, zeros in coarse.KEY_SETTINGS)
    return {"span": (2 * nodes * r, 2 * nodes * r * (rows + 1)),
            "split": (probes * (heads + 4) * per_direction, probes * (heads + 4) * tokens_per_direction)}


def _align(T: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``T``'s columns ordered and signed as ``ref``'s (the best matching by |cos|)."""
    r, c = linear_sum_assignment(-np.abs(ref.T @ T))
    T = T[:, c[np.argsort(r)]]
    return T * np.sign(np.sum(T * ref, axis=0))
