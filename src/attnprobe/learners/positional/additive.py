"""Attention with an additive position bias (T5's relative buckets, BLOOM's ALiBi) from output rows
(docs/positional.md, "Additive position biases").

The score of query ``z`` (position i) and key ``x`` (position j, offset ``δ = j − i``) is

    ``zᵀ B_h x + u_hᵀ x + b_h(δ)`` (+ terms in ``z`` alone, which the softmax drops),

``B_h = s·W_Q,hᵀ W_K,h`` (rank d_h), ``u_h = s·W_K,hᵀ b_Q,h`` and no rotation: the content part does not depend on
the offset, the bias does not depend on the content.

1. **values** — ``[±ρx] ↦ ±M x + c``, ``M = Σ_h V_h`` (2d queries).
2. **heads** — with the query token zero, every content logit vanishes at zero keys, so the weights are the bias's
   alone: the Jacobian of the answer in the key at position p is ``J_p = Σ_h α_h(p) V_h`` with
   ``α_h(p) = softmax_p(b_h(p − i))``. ``J_p M⁺ = C diag(α(p)) C⁺`` on M's column space (``C`` stacks the heads'
   output spaces ``C_h``): eigenvalues ``α_h(p)`` of multiplicity d_h, eigenspaces ``C_h`` (a random combination
   of three settings separates the heads). Offset-free layers give ``J_p ∝ M``: the offset dependence is detected
   here (``offset_signal``) and reported. Central differences (Richardson), exact for T5 (no query bias: the answer
   is linear in the keys when the query is zero).
3. **logits** — in head h's coordinates an answer is ``Σ_j α_hj G_h x_j`` (``V_h = C_h G_h``); with fewer nonzero
   tokens than ``d_h`` the weights come out of a least-squares solve. Flipping the signs of the query and of the
   keys separates the log-ratios ``log α_hj/α_hi`` into ``zᵀ B_h x_j`` (a query basis against random keys, random
   queries against a key basis: a rank-d_h sketch of ``B_h``), ``u_hᵀ x_j`` and ``b_h(δ_j) − b_h(0) − zᵀ B_h z``
   (two query scales remove the last term exactly).
4. **position bias** — ``b_h(δ) − b_h(0)`` at every offset up to the longest sequence (negative offsets from the
   last row; positive ones from the first row when the oracle answers every position of a bidirectional layer).
   Linear in δ: ALiBi, one slope per head. Else T5's buckets: the bucket layout (number of buckets, max distance)
   is the coarsest that makes the measured biases constant on every bucket, and each bucket's value is their mean.

Identifiable and returned: ``B_h`` (as factors ``W_Q,h, W_K,h`` at the head width, any gauge: ``(W_Q, W_K) →
(S⁻ᵀW_Q, S W_K)`` changes nothing), ``u_h`` (as ``b_Q,h``), ``V_h = W_O,h W_V,h`` (returned as ``W_O,h = C_h`` and
``W_V,h = G_h``), ``c`` (as ``b_O``), and the bias up to one constant per head (the softmax drops it; the bias at
offset 0 is set to 0): for ALiBi the slope, for T5 one scalar per head and bucket, for the buckets some offset up
to the longest sequence reaches (positive-offset buckets only from every-position answers of a bidirectional layer;
otherwise they are never seen by the answers, returned as 0 and reported).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg

from attnprobe.errors import RecoveryError, UnidentifiableError
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.models.positional import PositionalAttention, t5_buckets

METHOD = "positional"
#: lengths of the functional check
CHECK_LENGTHS = (1, 2, 8, 64, 256)
#: zero-query settings of the heads stage: (sequence length N, the first w positions move together). Windows far
#: from the query weigh O(1) for flat biases and ~0 for steep ones (ALiBi's slopes 2^-1 … 2^-8 spread to 0 … 0.38 at
#: N = 256), so the heads' eigenvalues are apart where one key alone would weigh ~1/N and be lost in the rounding
SETTINGS = ((2, 1), (16, 8), (256, 128))
#: Richardson levels and the key step (relative to a token of norm √d) of the zero-query Jacobians
LEVELS, STEP = 2, 0.2
#: the longest offset whose bias is measured (the check reads sequences of 256)
MAX_OFFSET = 255
#: sketch width beyond the head dimension
OVERSAMPLE = 8
#: target size of the largest content logit in the logits stage (larger ones leave keys of weight e^−15 beside the
#: query: on T5 layers, d = 128, 1e-8 error in B_h at 8.5× this scale against 1e-12 at this one)
TARGET_LOGIT = 0.5
#: the largest spread of the bias (in logits) over the keys of one logits query: farther keys weigh e^−SPAN less
#: than the nearest, and float32 softmax rounding divided by that weight must stay small
BIAS_SPAN = 4.0
#: offsets per sequence when the near biases are measured (far keys of a steep ALiBi head weigh e^−7 at 14)
NEAR_GROUP = 4
#: relative change of the zero-query weights with the key position below which the bias is absent
SIGNAL_FLOOR = 1e-9
#: the residual of a straight line through the measured biases (relative to their spread) below which it is ALiBi
LINEAR_FIT = 1e-6
#: candidate T5 bucket layouts: (buckets per direction ×2 when bidirectional, max distance)
BUCKET_COUNTS, MAX_DISTANCES = (8, 16, 32, 64, 128), (16, 32, 64, 128, 256, 512)
#: numbers per batch of long sequences sent at once (memory: 8 bytes each)
BATCH_TOKENS = 1 << 23


def additive_queries(d: int, H: int, head_dim: int, *, max_offset: int = MAX_OFFSET, both: bool = False,
                     keys: int | None = None) -> int:
    """Queries the learner asks (the check apart): values 2d; the heads stage ``2·LEVELS·d`` per setting; the
    sketches ``4(d⌈r/T⌉ + r⌈d/T⌉)`` (``r = d_h + OVERSAMPLE``, ``T`` keys per query); the bias 8 per group of
    ``T`` offsets (both directions: twice)."""
    r = head_dim + OVERSAMPLE
    T = keys or max(1, head_dim - 2)
    heads = 2 * LEVELS * d * len(SETTINGS)
    sketches = 4 * (d * math.ceil(r / T) + r * math.ceil(d / T))
    bias = 8 * math.ceil(max_offset / T) * (2 if both else 1) + 8
    return 2 * d + heads + sketches + bias + 8


class Rows:
    """The oracle's answer at row ``row`` of each sequence (the last row by default)."""

    def __init__(self, oracle):
        self.oracle = oracle

    def __call__(self, X: np.ndarray, row: int = -1) -> np.ndarray:
        if row in (-1, X.shape[1] - 1):
            return self.oracle(X)
        return self.oracle.answer_rows(X)[:, row]


def extract_additive(oracle, *, heads=None, seed=0, check=True, progress=None, position: str | None = None,
                     max_offset: int = MAX_OFFSET, bidirectional: bool | None = None):
    """Recover an attention layer with an additive position bias (module docstring). ``position``: ``"t5"`` or
    ``"alibi"`` when known (a Hugging Face family), else read from the measured biases; ``bidirectional``: whether
    keys after the query are seen (default: read from an every-position oracle, else False for ALiBi, True for
    T5 — positive offsets then go unseen)."""
    d = oracle.d
    run = Run(oracle, METHOD, seed=seed, check=check, check_lengths=CHECK_LENGTHS, progress=progress)
    guess = heads or 8
    run.plan(additive_queries(d, guess, max(2, d // guess), max_offset=max_offset),
             f"the additive-bias positional learner at d={d}", at_least=True)
    rng = run.rng
    noise = max(oracle.eps, 1e-16)
    rows = Rows(oracle)
    rho = math.sqrt(d)
    with run.phase("values"):
        P = rho * random_orthogonal(d, rng)
        y = oracle(np.concatenate([P, -P])[:, None, :])
        M = ((y[:d] - y[d:]) / 2).T @ P / rho**2
        c = (y[:d] + y[d:]).mean(axis=0) / 2
    K = M.shape[0]
    if K < 2:
        raise UnidentifiableError("the positional learner reads whole output rows (K ≥ 2 outputs per sequence)")
    with run.phase("heads"):
        Cb, G, signal, alphas = zero_query_heads(oracle, M, rng, heads, noise)
    H, dh = G.shape[:2]
    reader = HeadReader(rows, np.linalg.pinv(Cb).reshape(H, dh, K), G, c)
    with run.phase("bias near"):
        T0 = max(1, min(dh - 2, 14))
        rho_l = _token_scale(reader, rng, min(NEAR_GROUP, T0))
        near = _bias(reader, rng, np.arange(-1, -T0 - 1, -1), rho_l, T=NEAR_GROUP)  # (H, T0), NaN: unseen
    span = np.maximum.accumulate(np.max(np.where(np.isnan(near), np.inf, np.abs(near)), axis=0))
    T = int(max(1, min(T0, np.sum(span <= BIAS_SPAN))))  # keys per logits query: the bias spread ≤ BIAS_SPAN
    with run.phase("logits"):
        B, u = _sketches(reader, rng, dh + OVERSAMPLE, T, rho_l)
    kind = position
    slopes, linear = _slopes(near)
    if kind is None:
        kind = "alibi" if linear <= max(LINEAR_FIT, 1e3 * noise) else "t5"
    if kind == "alibi" and not linear <= max(1e-4, 1e4 * noise):
        raise RecoveryError(f"the position bias is not linear in the offset (misfit {linear:.1e} of its spread over "
                            f"offsets −1 … −{T0}): not ALiBi")
    info = {"bias_linear_misfit": linear, "keys_per_logits_query": T}
    rel_bias = None
    bidi = bidirectional
    if bidi is None:
        bidi = oracle.every_position is True and oracle.positions == "positional" if kind == "t5" else False
    if kind == "t5":
        with run.phase("bias"):
            offs = np.arange(-1, -max_offset - 1, -1)
            neg = _bias(reader, rng, offs, rho_l, T=T0)
            pos = None
            if bidi and oracle.every_position is not False:
                pos = _bias(reader, rng, -offs, rho_l, T=T0)
        rel_bias, layout = _buckets(offs, neg, pos, bidi)
        info.update(layout)
    Wq, Wk, bq = [], [], []
    for h in range(H):
        U, S, Vt = np.linalg.svd(B[h])
        Q, Kh = (U[:, :dh] * np.sqrt(S[:dh])).T, np.sqrt(S[:dh])[:, None] * Vt[:dh]
        Wq.append(Q)
        Wk.append(Kh)
        bq.append(np.linalg.lstsq(Kh.T, u[h], rcond=None)[0])
    common = dict(bq=np.array(bq), bo=c, scale=1.0, causal=not bidi)
    if kind == "alibi":
        model = PositionalAttention(np.array(Wq), np.array(Wk), G, Cb, **common, position="alibi", slopes=slopes)
    else:
        model = PositionalAttention(np.array(Wq), np.array(Wk), G, Cb, **common, position="t5", rel_bias=rel_bias,
                                    max_distance=info["max_distance"], bidirectional=info["bidirectional"])
    details = {"heads": H, "head_dim": dh, "position": kind, "offset_signal": signal,
               "zero_query_weights": alphas.tolist(), "token_scale": rho_l, "causal": not bidi, **info}
    if kind == "alibi":
        details["slopes"] = slopes.tolist()
        what = (f"ALiBi: the bias is linear in the offset (misfit {linear:.1e}); slopes {np.min(slopes):.3g} … "
                f"{np.max(slopes):.3g}")
    else:
        what = (f"relative position buckets: {info['buckets']} buckets, max distance {info['max_distance']}, "
                f"{'bidirectional' if info['bidirectional'] else 'one direction'}; "
                f"{info['buckets_seen']} of {info['buckets']} buckets seen by the answers")
    notes = [f"offset dependence detected: with the query token zero, the weights on a key changed with its position "
             f"by {signal:.1e}; {what}"]
    if kind == "t5" and info["buckets_seen"] < info["buckets"]:
        notes.append(f"{info['buckets'] - info['buckets_seen']} buckets are reached by no offset the answers hold "
                     "(positive offsets are seen only in every-position answers of a bidirectional layer; T5's "
                     "positive-side bucket of distance 0 by none): returned as 0")
    unknowns = PositionalAttention.unknowns(d, H, H, dh, K, bias=True, position=kind,
                                            buckets=rel_bias.shape[1] if rel_bias is not None else 0)
    return run.finish(model, unknowns=unknowns, details=details, notes=notes)


def _jacobian(oracle, N: int, p: int, E: np.ndarray, eta: float, levels: int = LEVELS) -> np.ndarray:
    """``J e`` for the rows ``e`` of ``E``: the change of the last-row answer when the keys at the first ``p``
    positions of an all-zero length-``N`` sequence move to ``±ηe``; central differences at η and η/2 combined
    (Richardson). ``J = Σ_h (Σ_{j<p} α_h(j)) V_h``."""
    r, d = E.shape
    table = []
    for i in range(levels):
        step = eta / 2**i
        X = np.zeros((2, r, N, d))
        X[0, :, :p], X[1, :, :p] = step * E[:, None], -step * E[:, None]
        y = oracle(X.reshape(2 * r, N, d)).reshape(2, r, -1)
        table.append((y[0] - y[1]) / (2 * step))
    for k in range(1, levels):
        f = 4.0**k
        table = [(f * table[i + 1] - table[i]) / (f - 1) for i in range(len(table) - 1)]
    return table[0].T  # (K, r)


def zero_query_heads(oracle, M, rng, heads, noise, *, step: float = STEP, levels: int = LEVELS):
    """Stage 2: the heads' output spaces from the zero-query Jacobians (module docstring; also RoPE with q/k biases
    and a value map per head, whose zero-query weights are ``b_Qᵀ R(δ) b_K``'s; there a query bias makes the
    answer nonlinear in the keys, so a shorter ``step`` and more Richardson ``levels``). Returns the stacked
    ``Cb (K, H·d_h)``, ``G (H, d_h, d)`` with ``V_h = C_h G_h``, the offset signal and each head's zero-query
    weights in every setting."""
    d = oracle.d
    U, s, _ = np.linalg.svd(M, full_matrices=False)
    r = int(np.sum(s > s[0] * 1e-10))  # length-1 answers hold no softmax rounding: M is exact to float64
    U = U[:, :r]
    E = random_orthogonal(d, rng)
    eta = step * math.sqrt(d)
    Mi = np.linalg.pinv(U.T @ M)
    Ts = [U.T @ _jacobian(oracle, N, p, E, eta, levels) @ E @ Mi for N, p in SETTINGS]  # (r, r) each: C diag(α) C⁺
    # the offset signal: how far the weights at the zero query are from uniform over the positions
    signal = max(float(np.linalg.norm(T - np.eye(r) * w / N) / np.linalg.norm(np.eye(r) * w / N))
                 for T, (N, w) in zip(Ts, SETTINGS))  # (a window of w keys: w/N)
    if signal <= max(SIGNAL_FLOOR, 1e3 * math.sqrt(noise)):
        raise UnidentifiableError(f"with the query token zero, the weights on a key do not depend on its position "
                                  f"(change {signal:.1e}): no additive position bias; a rotary layer (RoPE) or an "
                                  "offset-free one (use the multihead learner)")
    best = None
    for _ in range(6):
        a = rng.standard_normal(len(Ts))
        T = sum(x * Ti for x, Ti in zip(a, Ts))
        vals = np.linalg.eigvals(T)  # real, each of multiplicity d_h: noise splits a cluster, may pair it complex
        if np.max(np.abs(vals.imag)) > 1e-2 * np.max(np.abs(vals)):
            continue
        v = np.sort(vals.real)
        gaps = np.diff(v)
        if heads is None:  # the number of clusters: where the gaps jump the most
            g = np.sort(gaps)[::-1]
            ratios = g[:-1] / np.maximum(g[1:], max(1e-13, 1e3 * noise) * max(float(np.ptp(v)), 1e-300))
            nh = int(np.argmax(ratios[: r - 1])) + 2 if len(g) > 1 else 1
        else:
            nh = int(heads)
        if nh < 1 or r % nh:
            continue
        cut = np.sort(np.argsort(gaps)[::-1][: nh - 1])
        sizes = np.diff(np.concatenate([[0], cut + 1, [r]]))
        if len(set(sizes)) != 1:
            continue
        within = max((float(np.ptp(v[i:j])) for i, j in zip(np.concatenate([[0], cut + 1]),
                                                           np.concatenate([cut + 1, [r]]))), default=0.0)
        between = float(np.min(gaps[cut])) if nh > 1 else 1.0
        score = between / max(within, 1e-300)
        if best is None or score > best[0]:
            best = (score, v, cut, T, nh)
    if best is None:
        raise RecoveryError("the heads did not separate at the zero query: the eigenvalues of the weights' pencil "
                            "do not fall into equal clusters (two heads with the same position bias, or a layer that "
                            "is not a sum of heads with an additive position bias)")
    _, v, cut, T, nh = best
    dh = r // nh
    bounds = np.concatenate([[-np.inf], (v[cut] + v[cut + 1]) / 2, [np.inf]])
    C, alphas = [], []
    for k in range(nh):  # the invariant subspace of each cluster: an ordered Schur form puts it first (stable
        lo, hi = bounds[k], bounds[k + 1]  # where the eigenvectors of a near-multiple eigenvalue are not)
        _, Z, n = scipy.linalg.schur(T, output="real", sort=lambda re, im, lo=lo, hi=hi: lo < re < hi)
        if n != dh:
            raise RecoveryError(f"a head's cluster of the weights' pencil has {n} eigenvalues, not d_h = {dh}")
        Qk = Z[:, :dh]
        C.append(U @ Qk)
        alphas.append([float(np.trace(Qk.T @ Ti @ Qk) / dh) for Ti in Ts])
    Cb = np.concatenate(C, axis=1)
    G = (np.linalg.pinv(Cb) @ M).reshape(nh, dh, d)
    return Cb, G, signal, np.array(alphas)


class HeadReader:
    """Each head's log-weights from answers: ``rows`` (the oracle's row), the heads' coordinates ``Pc (H, d_h, K)``,
    token images ``G (H, d_h, d)`` and ``c``."""

    def __init__(self, rows, Pc, G, c):
        self.rows, self.Pc, self.G, self.c = rows, Pc, G, c

    def log_ratios(self, Z, keys, key_pos, N, row):
        """``log α_hj/α_h,row`` (B, H, T) for query tokens ``Z (B, d)`` at ``row`` and keys ``keys (B, T, d)`` at
        positions ``key_pos`` of length-``N`` sequences (zeros elsewhere); NaN where a weight is lost in the
        rounding."""
        Pc, G = self.Pc, self.G
        d = Z.shape[1]
        chunk = max(1, BATCH_TOKENS // (N * d))
        out = []
        for i in range(0, len(Z), chunk):
            X = np.zeros((len(Z[i:i + chunk]), N, d))
            X[:, key_pos] = keys[i:i + chunk]
            X[:, row] = Z[i:i + chunk]
            out.append(self.rows(X, row) - self.c)
        toks = np.concatenate([keys, Z[:, None]], axis=1)
        Y = np.concatenate(out)
        la = np.empty((len(Y), G.shape[0], toks.shape[1]))
        for i in range(0, len(Y), 4096):  # in head h's coordinates Pc_h y = Σ_j α_hj G_h x_j: least squares
            A = np.einsum("hjd,bnd->bhjn", G, toks[i:i + 4096])
            coords = np.einsum("hjk,bk->bhj", Pc, Y[i:i + 4096])
            alpha = np.einsum("bhnj,bhj->bhn", np.linalg.pinv(A), coords)
            with np.errstate(invalid="ignore", divide="ignore"):
                la[i:i + 4096] = np.where(alpha > 0, np.log(np.abs(alpha)), np.nan)  # lost in the rounding: NaN
        return la[..., :-1] - la[..., -1:]


def _bias(reader, rng, offsets, rho, T=None):
    """Stage 4: ``b_h(δ) − b_h(0)`` (H, len(offsets)) at the offsets (all negative: the query is the last row; all
    positive: the query is row 0). Keys ``±x`` at ``T`` offsets per sequence, the query ``±tz`` at two scales:
    averaging the four signs leaves ``b_h(δ) − b_h(0) − t² zᵀB_h z``, and the two scales remove the last term."""
    H, dh, d = reader.G.shape
    T = T or max(1, dh - 2)
    offsets = np.asarray(offsets)
    out = np.zeros((H, len(offsets)))
    groups = [np.arange(i, min(i + T, len(offsets))) for i in range(0, len(offsets), T)]
    scales = (1.0, 0.5)
    for idx in groups:
        o = offsets[idx]
        N = int(np.max(np.abs(o))) + 1
        row = N - 1 if o[0] < 0 else 0
        pos = row + o
        x = rng.standard_normal((len(o), d)) / math.sqrt(d) * rho
        z = rng.standard_normal(d) / math.sqrt(d) * rho
        Z, Kx = [], []
        for t in scales:
            for sz in (1.0, -1.0):
                for sx in (1.0, -1.0):
                    Z.append(sz * t * z)
                    Kx.append(sx * x)
        ell = reader.log_ratios(np.array(Z), np.array(Kx), pos, N, row)  # (8, H, T)
        m = ell.reshape(len(scales), 4, H, len(o)).mean(axis=1)  # b − t² zBz
        t2 = np.array(scales) ** 2
        out[:, idx] = (t2[1] * m[0] - t2[0] * m[1]) / (t2[1] - t2[0])
    return out


def _token_scale(reader, rng, T):
    """The token norm ρ at which the largest content logit of 8 random queries is about :data:`TARGET_LOGIT`."""
    d = reader.G.shape[2]
    N, pos = T + 1, np.arange(T)
    z = rng.standard_normal((8, d)) / math.sqrt(d)
    keys = rng.standard_normal((8, T, d)) / math.sqrt(d)
    rho = 1.0
    for _ in range(4):  # logits far apart leave keys lost in the rounding (NaN): shrink the tokens and ask again
        diff = reader.log_ratios(rho * z, rho * keys, pos, N, N - 1) - \
            reader.log_ratios(-rho * z, rho * keys, pos, N, N - 1)
        if not np.any(np.isnan(diff)):
            break
        rho /= 8
    big = float(np.nanmax(np.abs(diff))) / 2 / rho**2  # the largest |zᵀB x − u·z| at unit tokens, roughly
    return float(np.clip(math.sqrt(TARGET_LOGIT / max(big, 1e-12)), 1e-3, 1e3))


def _sketches(reader, rng, r, T, rho):
    """Stage 3: ``B_h`` from a query basis against ``r`` random keys and ``r`` random queries against a key basis
    (rank-d_h reconstruction), and ``u_h`` from the key basis; ``T`` keys per query at offsets −1 … −T."""
    H, dh, d = reader.G.shape
    N = T + 1
    pos = np.arange(T)
    Qb = random_orthogonal(d, rng)
    Om = rng.standard_normal((r, d)) / math.sqrt(d)
    Zs = rng.standard_normal((r, d)) / math.sqrt(d)

    def pairs(queries, keyset):
        """``qᵀB_h k`` and ``u_hᵀ k`` (H, n, m) for every query of ``queries (n, d)`` and key of ``keyset (m, d)``
        (m a multiple of T; T keys per sequence, one query token)."""
        n, m = len(queries), len(keyset)
        g = m // T
        Z = rho * np.repeat(queries, g, axis=0)
        Kk = rho * np.tile(keyset.reshape(g, T, d), (n, 1, 1))
        l_pp = reader.log_ratios(Z, Kk, pos, N, N - 1)
        l_pm = reader.log_ratios(Z, -Kk, pos, N, N - 1)
        l_mp = reader.log_ratios(-Z, Kk, pos, N, N - 1)
        l_mm = reader.log_ratios(-Z, -Kk, pos, N, N - 1)
        shape = lambda a: a.reshape(n, g, H, T).transpose(2, 0, 1, 3).reshape(H, n, m)  # noqa: E731
        return (shape(((l_pp - l_pm) - (l_mp - l_mm)) / (4 * rho**2)),
                shape(((l_pp - l_pm) + (l_mp - l_mm)) / (4 * rho)))

    def padded(keys):  # distinct extra keys up to a multiple of T (equal keys in one sequence cannot be told apart)
        extra = (-len(keys)) % T
        return np.concatenate([keys, rng.standard_normal((extra, d)) / math.sqrt(d)])

    Xa, _ = pairs(Qb, padded(Om))  # (H, d, ·): q_iᵀ B ω_a
    Yb, Lb = pairs(Zs, padded(Qb))  # (H, r, ·): ζ_bᵀ B q_k, u·q_k
    Xa, Yb, Ub = Xa[:, :, :r], Yb[:, :, :d], Lb[:, :, :d].mean(axis=1)
    if np.isnan(Xa).any() or np.isnan(Yb).any() or np.isnan(Ub).any():
        raise RecoveryError(f"some keys' weights were lost in the answers' rounding in the logits stage (tokens of "
                            f"norm {rho:.2g}, {T} keys per sequence): the heads' logits and position biases span more "
                            "than these answers resolve")
    B = np.zeros((H, d, d))
    u = np.zeros((H, d))
    for h in range(H):
        BO = Qb.T @ Xa[h]  # B Ωᵀ (d, r)
        ZB = Yb[h] @ Qb  # Z B (r, d)
        Uc = np.linalg.svd(BO, full_matrices=False)[0][:, :dh]  # B's column space
        Vr = np.linalg.svd(ZB.T, full_matrices=False)[0][:, :dh]  # B's row space
        S = (Uc.T @ BO @ np.linalg.pinv(Vr.T @ Om.T) + np.linalg.pinv(Zs @ Uc) @ ZB @ Vr) / 2
        B[h] = Uc @ S @ Vr.T
        u[h] = Qb.T @ Ub[h]
    return B, u


def _slopes(near: np.ndarray) -> tuple[np.ndarray, float]:
    """The ALiBi slopes ``m_h`` fitted to the measured biases ``near (H, T)`` at offsets −1 … −T (NaN: a key lost
    in the rounding, left out) and how far the biases are from ``m_h·δ`` (relative to their spread)."""
    delta = -np.arange(1, near.shape[1] + 1, dtype=float)
    m = np.zeros(near.shape[0])
    worst = 0.0
    for h, row in enumerate(near):
        ok = ~np.isnan(row)
        if ok.sum() < 2:
            return m, np.inf
        m[h] = row[ok] @ delta[ok] / np.sum(delta[ok] ** 2)
        worst = max(worst, float(np.max(np.abs(row[ok] - m[h] * delta[ok]))))
    return m, worst / max(float(np.nanmax(np.abs(near))), 1e-300)


def _buckets(offs_neg, neg, pos, bidirectional):
    """T5's bucket layout fitted to the measured biases (the coarsest layout constant on every bucket) and the
    per-head bucket values ``(H, buckets)`` (bucket of offset 0 at 0; buckets no offset reached at 0)."""
    H = neg.shape[0]
    offs = np.concatenate([[0], offs_neg] + ([] if pos is None else [-offs_neg]))
    vals = np.concatenate([np.zeros((H, 1)), neg] + ([] if pos is None else [pos]), axis=1)
    spread_all = max(float(np.ptp(vals)), 1e-300)
    best = None
    for n in BUCKET_COUNTS:
        total = 2 * n if bidirectional else n
        for md in MAX_DISTANCES:
            if md <= n // 2:
                continue
            b = t5_buckets(offs, total, md, bidirectional)
            worst = 0.0
            table = np.zeros((H, total))
            for k in np.unique(b):
                sel = b == k
                worst = max(worst, float(np.max(np.ptp(vals[:, sel], axis=1))))
                table[:, k] = vals[:, sel].mean(axis=1)
            if worst <= 1e-6 * spread_all and (best is None or total < best[0]):
                best = (total, md, table, len(np.unique(b)))
    if best is None:
        raise RecoveryError("the measured position biases fit no T5 bucket layout (buckets "
                            f"{', '.join(map(str, BUCKET_COUNTS))} per direction, max distance "
                            f"{', '.join(map(str, MAX_DISTANCES))}): not a relative-bucket bias")
    total, md, table, seen = best
    table = table - table[:, [int(t5_buckets(np.array([0]), total, md, bidirectional)[0])]]
    return table, {"buckets": total, "max_distance": md, "bidirectional": bool(bidirectional),
                   "buckets_seen": seen}
