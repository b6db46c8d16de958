"""RoPE heads' query and key maps from the absolute logits that zero-padded every-position rows give, fitted by
alternating least squares (docs/positional.md, "bfloat16 answers": the every-row route's logit stage).

A sequence holds ``tokens ≤ d_h`` random tokens at random positions in ``[lead, length)`` and zeros elsewhere. A
zero key has logit 0 and no value, so at a token's row ``i`` each head's output component is
``u_h,i = Σ_{s≤i} α_s G_h x_s`` over the tokens so far (``V_h = C_h G_h`` known): the weights ``α`` by least squares
in the head's ``d_h`` coordinates, the zeros' weight ``1/Z = (1 − Σα)/zeros`` from the rest, so

    ``ℓ_s = log(α_s Z) = (W_Q,h x_i)ᵀ R(p_s − p_i) (W_K,g x_s)``

is the logit itself (no row constant), at offsets up to ``length − lead`` — ``t(t+1)/2`` samples a sequence and
head, weighted ``min(1, α_s Z)²`` (a weight solved to an absolute error reads its log to that error over it).
:func:`fit_logit_maps` fits ``W_Q`` (every head, given its group's ``W_K``) and ``W_K`` (every group, its heads
pooled) in turn, each round extrapolated along its step (as for CP decompositions). Its start is rough (d = 128,
8/2, bfloat16 rows: 0.44 … 1.2 off over lengths 2 … 256); the row polish (:mod:`.row_polish`) brings it in.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.positional import rotation_matrix

#: sequences, random tokens per sequence (at most 3/4 of d_h: each row's weights are solved in the head's d_h
#: coordinates), the sequences' length and the first position a token may take (d = 128, 8/2, bfloat16: 120 × 12
#: tokens in 288 positions give ~70k samples, 8 s of answers)
SEQUENCES, TOKENS, LENGTH, LEAD = 120, 12, 288, 32
#: sequences per call to the oracle
BATCH = 16
#: alternating rounds (d = 128, 8/2: three rounds, misfit 0.71 → 0.59, 348 s under load)
ALS_ROUNDS = 3
#: the step multiples tried along each round's step (old + (1 + β)·step)
EXTRAPOLATE = (0.5, 1.0, 2.0)


def rounded(X: np.ndarray, precision: str) -> np.ndarray:
    """``X`` rounded to ``precision`` (bfloat16, float16: what the layer computes with), as float64."""
    if precision in ("bfloat16", "float16"):
        from attnprobe.models.precision import resolve_dtype

        return X.astype(resolve_dtype(precision)).astype(np.float64)
    return X


def absolute_logit_samples(oracle, Cb: np.ndarray, G: np.ndarray, c: np.ndarray, rng: np.random.Generator, *,
                           sequences: int = SEQUENCES, tokens: int | None = None, length: int = LENGTH,
                           lead: int = LEAD,
                           scale: float = 1.0) -> dict:
    """Every head's absolute logit samples (module docstring) from the rows of ``sequences`` zero-padded random
    sequences of ``tokens`` tokens (default :data:`TOKENS`, at most 3/4 of ``d_h``; entries N(0, ``scale``²), rounded
    to the answers' precision): a dict of ``tokens`` (every token, a row each) and arrays ``qid``, ``kid`` (the
    query's and the key's row of ``tokens``), ``off`` (key position − query position), ``ell``, ``w`` (least-squares
    weight) and ``head``, one entry per sample."""
    H, dh, d = G.shape
    tokens = min(TOKENS, max(1, dh - dh // 4)) if tokens is None else tokens
    if not 1 <= tokens <= dh or not 0 <= lead <= length - tokens:
        raise ConfigError(f"the logit sequences hold 1 … d_h = {dh} tokens in positions lead … length; got {tokens} "
                          f"tokens, lead {lead}, length {length}", param="tokens")
    pos = np.sort(np.stack([rng.choice(np.arange(lead, length), tokens, replace=False) for _ in range(sequences)]), 1)
    T = rounded(rng.standard_normal((sequences, tokens, d)) * scale, oracle.precision or "float64")
    X = np.zeros((sequences, length, d))
    np.put_along_axis(X, pos[:, :, None], T, axis=1)
    Y = np.concatenate([np.take_along_axis(np.asarray(oracle.answer_rows(X[a:a + BATCH]), dtype=np.float64),
                                           pos[a:a + BATCH, :, None], axis=1) for a in range(0, sequences, BATCH)])
    U = ((Y - c) @ np.linalg.pinv(Cb).T).reshape(sequences, tokens, H, dh)
    Vx = np.einsum("hed,std->shte", G, T)  # each token's value in each head's coordinates
    ids = np.arange(sequences * tokens).reshape(sequences, tokens)  # token (s, t) is row s·tokens + t of "tokens"
    out = {k: [] for k in ("qid", "kid", "off", "ell", "w", "head")}
    for t in range(tokens):
        A = Vx[:, :, :t + 1].transpose(0, 1, 3, 2)  # (S, H, d_h, t+1)
        alpha = np.linalg.solve(np.einsum("shei,shej->shij", A, A) + 1e-12 * np.eye(t + 1),
                                np.einsum("shei,she->shi", A, U[:, t])[..., None])[..., 0]
        zeros = (pos[:, t] + 1 - (t + 1)).astype(float)
        inv_z = (1 - alpha.sum(-1)) / zeros[:, None]  # (S, H)
        ratio = alpha / inv_z[..., None]
        ok = (ratio > 0) & (inv_z[..., None] > 0)
        ell = np.log(np.where(ok, ratio, 1.0))
        w = np.where(ok, np.minimum(1.0, ratio) ** 2, 0.0)
        for h in range(H):
            out["qid"].append(np.repeat(ids[:, t], t + 1))
            out["kid"].append(ids[:, :t + 1].reshape(-1))
            out["off"].append((pos[:, :t + 1] - pos[:, t:t + 1]).reshape(-1))
            out["ell"].append(ell[:, h].reshape(-1))
            out["w"].append(w[:, h].reshape(-1))
            out["head"].append(np.full(sequences * (t + 1), h))
    return {"tokens": T.reshape(-1, d), **{k: np.concatenate(v) for k, v in out.items()}}


def absolute_logit_queries(sequences: int = SEQUENCES) -> int:
    """Sequences :func:`absolute_logit_samples` asks."""
    return sequences


class _Samples:
    """One head's samples: the rotations ``R(δ)`` of its offsets, the weights, and the tokens by id."""

    def __init__(self, data: dict, h: int, theta: np.ndarray, dh: int):
        i = np.flatnonzero((data["head"] == h) & (data["w"] > 0))
        self.qid, self.kid, self.ell, self.w = data["qid"][i], data["kid"][i], data["ell"][i], data["w"][i]
        offs = data["off"][i]
        table = {o: rotation_matrix(float(o), theta, dh) for o in np.unique(offs)}
        self.R = np.stack([table[o] for o in offs]) if len(offs) else np.zeros((0, dh, dh))

    def queries(self, tokens_mapped: np.ndarray) -> np.ndarray:
        return tokens_mapped[self.qid]

    def rotated_keys(self, keys_mapped: np.ndarray) -> np.ndarray:  # R(δ) W_K x_k
        return np.einsum("nab,nb->na", self.R, keys_mapped[self.kid])

    def rotated_queries(self, queries_mapped: np.ndarray) -> np.ndarray:  # R(δ)ᵀ W_Q x_q
        return np.einsum("nab,na->nb", self.R, queries_mapped[self.qid])


def token_normal_equations(X: np.ndarray, ids: np.ndarray, vecs: np.ndarray, w: np.ndarray, ell: np.ndarray,
                      chunk: int = 256):
    """``A = Σ_n w_n (x x ᵀ) ⊗ (v vᵀ)``, ``b = Σ_n w_n ℓ_n x ⊗ v`` over samples ``n`` with token ``x = X[ids_n]`` and
    vector ``v = vecs_n``, grouped by token (each token's ``Σ w v vᵀ`` first: a token recurs in many samples) and
    laid out as ``(a, i)`` ↦ ``a·d_h + i``."""
    from scipy.sparse import csr_matrix

    n, dh = vecs.shape
    U, d = X.shape
    P = csr_matrix((w, (ids, np.arange(n))), shape=(U, n))
    S = P @ (vecs[:, :, None] * vecs[:, None, :]).reshape(n, dh * dh)  # (U, d_h²)
    Bv = P @ (ell[:, None] * vecs)  # (U, d_h)
    A = np.zeros((d, d * dh * dh))
    for at in range(0, U, chunk):
        Xc = X[at:at + chunk]
        A += Xc.T @ (Xc[:, :, None] * S[at:at + chunk, None, :]).reshape(len(Xc), -1)
    A = A.reshape(d, d, dh, dh).transpose(0, 2, 1, 3).reshape(d * dh, d * dh)
    return A, (X.T @ Bv).reshape(-1)


def fit_logit_maps(data: dict, heads: int, groups: int, theta: np.ndarray, rng: np.random.Generator, *,
                   rounds: int = ALS_ROUNDS, query_bias: bool = False, log=None):
    """``W_Q (H, d_h, d)`` and ``W_K (G, d_h, d)`` minimising ``Σ w (ℓ − (W_Q,h x_q)ᵀ R(δ) (W_K,g x_k))²`` over every
    sample of :func:`absolute_logit_samples` by alternating least squares from a random ``W_K`` (module docstring;
    each solve's normal equations grouped by token, :func:`token_normal_equations`); ``query_bias``: the queries
    augmented by a 1 (``W_Q (H, d_h, d + 1)``, its last column the query bias: the layer behind a zero token,
    :mod:`.bias_rows`); ``log(line)``: the relative weighted misfit after each round. Returns the maps and that
    misfit."""
    X = data["tokens"]
    d = X.shape[1]
    Xq = np.concatenate([X, np.ones((len(X), 1))], axis=1) if query_bias else X
    dh = 2 * len(theta)
    per = heads // groups
    samples = [_Samples(data, h, theta, dh) for h in range(heads)]
    total = sum(float((s.w * s.ell ** 2).sum()) for s in samples) or 1.0

    def misfit(Wq, Wk):
        res = 0.0
        for h, s in enumerate(samples):
            pred = np.einsum("na,na->n", s.queries(Xq @ Wq[h].T), s.rotated_keys(X @ Wk[h // per].T))
            res += float((s.w * (pred - s.ell) ** 2).sum())
        return math.sqrt(res / total)

    def solve(parts):
        A = sum(p[0] for p in parts)
        b = sum(p[1] for p in parts)
        return np.linalg.solve(A + 1e-9 * np.eye(len(b)), b).reshape(-1, dh).T

    def solve_q(Wk):
        return np.stack([solve([token_normal_equations(Xq, s.qid, s.rotated_keys(X @ Wk[h // per].T), s.w, s.ell)])
                         for h, s in enumerate(samples)])

    def solve_k(Wq):
        return np.stack([solve([token_normal_equations(X, samples[h].kid, samples[h].rotated_queries(Xq @ Wq[h].T),
                                                  samples[h].w, samples[h].ell)
                                for h in range(g * per, (g + 1) * per)]) for g in range(groups)])

    Wk = rng.standard_normal((groups, dh, d)) / math.sqrt(d)
    Wq = solve_q(Wk)
    f = misfit(Wq, Wk)
    for r in range(rounds):
        Wk1 = solve_k(Wq)
        Wq1 = solve_q(Wk1)
        best = (misfit(Wq1, Wk1), Wq1, Wk1)
        for beta in EXTRAPOLATE:
            Wqe, Wke = Wq1 + beta * (Wq1 - Wq), Wk1 + beta * (Wk1 - Wk)
            fe = misfit(Wqe, Wke)
            if fe < best[0]:
                best = (fe, Wqe, Wke)
        f, Wq, Wk = best
        if log is not None:
            log(f"logit maps: alternating round {r + 1}/{rounds}, misfit {f:.2e}")
    return Wq, Wk, f
