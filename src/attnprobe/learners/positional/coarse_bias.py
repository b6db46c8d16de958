"""The coarse RoPE route's stages with q/k biases (Qwen2; docs/positional.md, "Coarse answers with q/k biases").

Under RoPE the score ``(W_Q z + b_Q)ᵀ R(δ) (W_K x + b_K)`` keeps both biases: ``zᵀ W_Qᵀ R(δ) b_K`` and
``b_Qᵀ R(δ) W_K x`` change with the key's offset, and ``b_Qᵀ R(δ) b_K`` is a bias per offset. Two stages of
:mod:`.coarse` change (the values stage does not: one token weighs 1, and ``W_O b_V + b_O`` is its constant ``c``):

- **heads**: zero keys no longer weigh alike, so the zero-key pair probe picks up every head's whole value map;
  the key probe moves one key inside the kernel of ``M = Σ_h V_h`` instead (:func:`~.coarse.key_derivative`, as the
  float64 learner's :func:`~.heads.key_jacobian`): rank H with or without biases. The kernel exists when heads share
  keys and values (GQA, ``G·d_h < d``); it is read from the averaged ``M`` at its singular values' gap
  (:func:`coarse_kernel`).
- **logits**: each head's log-weight against the zero keys is ``s_j − L(z)``, where ``L(z)`` (the zero keys' mean
  weight, their logits ``q̃ᵀ R(δ) b_K`` differing by offset) depends on the query only: differences between two
  keys of one sequence cancel it, and are affine in the query and in each key. :func:`biased_logit_maps` reads the
  row spaces and the reduced matrices from those differences with an augmented coordinate (``[z; 1]``), the rotation's
  commutant from the bilinear blocks as the bias-free route does, the biases from the augmented rows and columns,
  and refines ``[W_Q, b_Q]``, ``[W_K, b_K]`` by alternating least squares (:func:`refine_biased_maps`).

What the answers identify: ``b_Q`` and ``b_K`` up to the same scaled rotation per frequency pair as ``W_Q``,
``W_K`` (a key bias on coordinates no offset rotates cancels in the softmax); ``b_V`` only through ``c``.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.positional.logit_samples import (ALS_ROUNDS, LOGIT_OFFSETS, SAMPLES_PER_ENTRY, kept_offsets,
                                                         log_weights, reliability)
from attnprobe.models.positional import rotation_matrix

#: smallest ratio between the last kept and the first dropped singular value of the averaged ``M`` (float32
#: answers read ``M`` to ~1e-5 of its size: a kernel's singular values sit there)
KERNEL_GAP = 1e2
#: rows of the normal equations formed at once
CHUNK = 4096


def coarse_kernel(M: np.ndarray, heads: int) -> np.ndarray:
    """Rows spanning the kernel of the averaged ``M = Σ_h V_h`` (K, d): the right singular vectors past its largest
    gap; refused when there is no gap of :data:`KERNEL_GAP` leaving at least ``heads + 4`` dimensions (the key probe
    moves a key in it: heads sharing keys and values, ``G·d_h < d``)."""
    _, s, Vt = np.linalg.svd(M)
    d = M.shape[1]
    s = np.concatenate([s, np.zeros(d - len(s))])
    tiny = s[0] * 1e-300
    ratio = (s[:-1] + tiny) / (s[1:] + tiny)
    cuts = [r for r in range(1, d - heads - 3) if ratio[r - 1] >= KERNEL_GAP]
    if not cuts:
        raise UnidentifiableError(f"RoPE with q/k biases from coarse answers: the value maps' sum M has no kernel of "
                                  f"≥ H + 4 = {heads + 4} dimensions past a gap of {KERNEL_GAP:g} (singular values "
                                  f"{s[0]:.1e} … {s[-1]:.1e}): the key probe needs heads sharing keys and values "
                                  "(G·d_h < d); not recovered from these answers")
    r = max(cuts, key=lambda i: ratio[i - 1])
    return Vt[r:]


def _augmented(X: np.ndarray) -> np.ndarray:
    return np.concatenate([X, np.ones(X.shape[:-1] + (1,))], axis=-1)


def _affine_slope(F: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The slope of the weighted least-squares affine fit ``y ≈ F s + t`` over the finite samples."""
    ok = np.isfinite(y)
    A = _augmented(F[ok]) * w[ok, None]
    return np.linalg.lstsq(A, y[ok] * w[ok], rcond=None)[0][:-1]


def _pair_weights(ell: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The weight of a difference of two log-weights: the less reliable one's (:func:`~.coarse.reliability`)."""
    with np.errstate(invalid="ignore"):
        return np.minimum(reliability(np.nan_to_num(ell, nan=-np.inf)), reliability(np.nan_to_num(ref, nan=-np.inf)))


def _solve(rows, unknowns: int) -> np.ndarray:
    """Weighted least squares from chunks ``(F, y, w)`` of rows (normal equations, a tiny ridge for the gauges)."""
    A = np.zeros((unknowns, unknowns))
    b = np.zeros(unknowns)
    for F, y, w in rows:
        ok = np.isfinite(y) & (w > 0)
        Fw = F[ok] * w[ok, None]
        A += Fw.T @ Fw
        b += Fw.T @ (y[ok] * w[ok])
    A[np.diag_indices_from(A)] += 1e-10 * max(np.trace(A), 1e-300) / unknowns
    return np.linalg.solve(A, b)


def difference_solve(zq: np.ndarray, kx: np.ndarray, ell: np.ndarray) -> np.ndarray:
    """``M'(δ_j)`` (m, a·a) minimising ``Σ w² (zqᵀ M'(δ_j) kx_j − zqᵀ M'(δ_0) kx_0 − (ℓ_j − ℓ_0))²`` over every
    sequence and key ``j ≥ 1`` (weights :func:`_pair_weights`): the normal equations by blocks, each difference
    touching the blocks of offsets ``j`` and ``0`` only (the dense rows are ``m/2`` times longer, ``(m/2)²`` times
    the work: minutes a head at d = 128)."""
    B, m, a = kx.shape
    P = a * a
    A = np.zeros((m, P, m, P))
    b = np.zeros((m, P))
    for i in range(0, B, CHUNK):
        f = np.einsum("np,njq->njpq", zq[i:i + CHUNK], kx[i:i + CHUNK]).reshape(-1, m, P)
        e = ell[i:i + CHUNK]
        for j in range(1, m):
            y, w = e[:, j] - e[:, 0], _pair_weights(e[:, j], e[:, 0])
            ok = np.isfinite(y) & (w > 0)
            fj, f0, yw = f[ok, j] * w[ok, None], f[ok, 0] * w[ok, None], y[ok] * w[ok]
            cross = fj.T @ f0
            A[j, :, j] += fj.T @ fj
            A[0, :, 0] += f0.T @ f0
            A[j, :, 0] -= cross
            A[0, :, j] -= cross.T
            b[j] += fj.T @ yw
            b[0] -= f0.T @ yw
    A = A.reshape(m * P, m * P)
    A[np.diag_indices_from(A)] += 1e-10 * max(np.trace(A), 1e-300) / (m * P)
    return np.linalg.solve(A, b.reshape(-1))


def biased_logit_maps(oracle, rng, Cb, G, c, theta, rho: float, *, offsets=LOGIT_OFFSETS, extra: int = 16,
                      rounds: int = ALS_ROUNDS, samples: int = SAMPLES_PER_ENTRY):
    """Every head's ``W_Q``, ``W_K`` (d_h, d) and ``b_Q``, ``b_K`` (d_h,) from differences of log-weights
    (:func:`~.coarse.log_weights`) between the keys of one sequence, keys at ``offsets`` (the first the reference):

    (a) a fixed key set against ``d + extra`` random queries: ``ℓ_j − ℓ_0 = q̃ᵀ(R(δ_j) k̃_j − R(δ_0) k̃_0)`` is affine
        in ``z``, its slope in ``W_Q``'s row space ``U``; a fixed query against random keys: ``ℓ_j`` is affine in
        ``x_j`` (the zero keys' term ``L(z)`` is the sequence's constant), its slope ``W_Kᵀ R(δ_j)ᵀ q̃`` in
        ``W_K``'s row space ``V``;
    (b) ``M'(δ) = [A_Q, b_Q]ᵀ R(δ) [A_K, b_K]`` ((d_h + 1)², in the coordinates ``[Uᵀz; 1]``, ``[Vᵀx; 1]``) by least
        squares on the differences of every sequence and ``samples·(d_h + 1)²`` more random ones;
    (c) the bilinear blocks as :func:`~.coarse.logit_maps` (the rotation's commutant gives ``A_K``, then ``A_Q``);
        ``b_K`` from the last columns ``A_Qᵀ R(δ) b_K + n`` (``n`` common to every offset: the differences do not see
        it), ``b_Q`` from the last rows ``b_Qᵀ R(δ) A_K``;
    (d) :func:`refine_biased_maps` on every difference.

    Returns (Wq, Wk) (H, d_h, d), (bq, bk) (H, d_h) and the sequences asked."""
    d = oracle.d
    H, dh = G.shape[:2]
    offsets = kept_offsets(offsets, dh, least=2)
    offs = np.array(offsets)
    m, span = len(offs), int(-offs.min())
    n = d + extra
    seqs, Us, Vs = [], [], []
    for _ in range(math.ceil((dh + extra) / (m - 1))):  # (a) fixed keys, random queries: U
        toks = np.repeat(rng.standard_normal((1, m + 1, d)) * rho, n, axis=0)
        toks[:, -1] = rng.standard_normal((n, d)) * rho
        ell = log_weights(oracle, Cb, G, c, toks, np.tile(offs, (n, 1)), span)
        Us.append(np.stack([[_affine_slope(toks[:, -1], ell[:, h, j] - ell[:, h, 0],
                                           _pair_weights(ell[:, h, j], ell[:, h, 0])) for j in range(1, m)]
                            for h in range(H)]))
        seqs.append((toks, ell))
    for _ in range(math.ceil((dh + extra) / m)):  # fixed query, random keys: V
        toks = rng.standard_normal((n, m + 1, d)) * rho
        toks[:, -1] = rng.standard_normal(d) * rho
        ell = log_weights(oracle, Cb, G, c, toks, np.tile(offs, (n, 1)), span)
        Vs.append(np.stack([[_affine_slope(toks[:, j], ell[:, h, j], _pair_weights(ell[:, h, j], ell[:, h, j]))
                             for j in range(m)] for h in range(H)]))
        seqs.append((toks, ell))
    free = samples * (dh + 1) ** 2  # (b) random queries and keys
    toks = rng.standard_normal((free, m + 1, d)) * rho
    seqs.append((toks, log_weights(oracle, Cb, G, c, toks, np.tile(offs, (free, 1)), span)))
    Us, Vs = np.concatenate(Us, axis=1), np.concatenate(Vs, axis=1)
    toks = np.concatenate([t for t, _ in seqs])
    ell = np.concatenate([e for _, e in seqs])
    R = [rotation_matrix(float(o), theta, dh) for o in offs]
    Wq, Wk, bq, bk = [], [], [], []
    a = dh + 1
    for h in range(H):
        U = np.linalg.svd(Us[h].T, full_matrices=False)[0][:, :dh]
        V = np.linalg.svd(Vs[h].T, full_matrices=False)[0][:, :dh]
        Mp = difference_solve(_augmented(toks[:, -1] @ U), _augmented(toks[:, :m] @ V), ell[:, h]).reshape(m, a, a)
        Ms = [Mp[j, :dh, :dh] for j in range(m)]
        ref = np.linalg.inv(Ms[0])
        eye = np.eye(dh)
        eqs = [np.kron((ref @ Ms[j]).T, eye) - np.kron(eye, R[j] @ R[0].T) for j in range(1, m)]
        null = np.linalg.svd(np.concatenate(eqs), full_matrices=False)[2][-dh:]  # vec (column-major) of A_K
        Ak = (rng.standard_normal(dh) @ null).reshape(dh, dh, order="F")
        lhs = np.concatenate([R[j] @ Ak for j in range(m)], axis=1)
        AqT = np.linalg.lstsq(lhs.T, np.concatenate(Ms, axis=1).T, rcond=None)[0].T
        # the differences see the last columns up to one vector common to every offset (q̃ᵀ n cancels): b_K with it
        k_bias = np.linalg.lstsq(np.concatenate([np.hstack([AqT @ R[j], -eye]) for j in range(m)]),
                                 np.concatenate([Mp[j, :dh, dh] for j in range(m)]), rcond=None)[0][:dh]
        q_bias = np.linalg.lstsq(np.concatenate([(R[j] @ Ak).T for j in range(m)]),
                                 np.concatenate([Mp[j, dh, :dh] for j in range(m)]), rcond=None)[0]
        q, k = refine_biased_maps(np.column_stack([AqT.T @ U.T, q_bias]), np.column_stack([Ak @ V.T, k_bias]),
                                  toks, offs, ell[:, h], theta, rounds)
        Wq.append(q[:, :-1])
        bq.append(q[:, -1])
        Wk.append(k[:, :-1])
        bk.append(k[:, -1])
    return np.array(Wq), np.array(Wk), np.array(bq), np.array(bk), len(toks)


def refine_biased_maps(Qa, Ka, toks, offs, ell, theta, rounds: int = ALS_ROUNDS):
    """Alternating least squares on ``ℓ_j − ℓ_0 ≈ q̃ᵀ(R(δ_j) k̃_j − R(δ_0) k̃_0)`` with ``q̃ = Qa [z; 1]``,
    ``k̃ = Ka [x; 1]`` (``Qa``, ``Ka``: (d_h, d + 1), the biases last), every key ``j`` of ``toks[:, :-1]`` at
    ``offs`` and the query itself at offset 0, against the first key, over every finite difference (weighted by the
    less reliable log-weight). Returns ``(Qa, Ka)``."""
    dh = Qa.shape[0]
    B, T1, _ = toks.shape
    x = _augmented(toks)  # (B, T1, d + 1): the keys, then the query at offset 0
    z = x[:, -1]
    R = np.stack([rotation_matrix(float(o), theta, dh) for o in np.append(offs, 0)])  # (T1, d_h, d_h)
    y = ell[:, 1:] - ell[:, :1]  # (B, T1 − 1)
    w = _pair_weights(ell[:, 1:], ell[:, :1])
    unknowns = Qa.size
    for _ in range(rounds):
        k = np.einsum("ad,bjd->bja", Ka, x)
        rk = np.einsum("jac,bjc->bja", R, k)
        diff = rk[:, 1:] - rk[:, :1]  # (B, T1 − 1, d_h)

        def q_rows(diff=diff):
            for i in range(0, B, CHUNK):
                F = diff[i:i + CHUNK, :, :, None] * z[i:i + CHUNK, None, None, :]
                yield F.reshape(-1, unknowns), y[i:i + CHUNK].reshape(-1), w[i:i + CHUNK].reshape(-1)
        Qa = _solve(q_rows(), unknowns).reshape(Qa.shape)
        q = z @ Qa.T  # (B, d_h)
        rq = np.einsum("jca,bc->bja", R, q)  # R(δ_j)ᵀ q̃

        def k_rows(rq=rq):
            for i in range(0, B, CHUNK):
                first = rq[i:i + CHUNK, :1, :, None] * x[i:i + CHUNK, :1, None, :]
                F = rq[i:i + CHUNK, 1:, :, None] * x[i:i + CHUNK, 1:, None, :] - first
                yield F.reshape(-1, unknowns), y[i:i + CHUNK].reshape(-1), w[i:i + CHUNK].reshape(-1)
        Ka = _solve(k_rows(), unknowns).reshape(Ka.shape)
    return Qa, Ka


def biased_logit_map_queries(d: int, dh: int, *, extra: int = 16, samples: int = SAMPLES_PER_ENTRY) -> int:
    """Sequences :func:`biased_logit_maps` asks with these settings."""
    m = len(kept_offsets(LOGIT_OFFSETS, dh, least=2))
    return (math.ceil((dh + extra) / (m - 1)) + math.ceil((dh + extra) / m)) * (d + extra) + samples * (dh + 1) ** 2
