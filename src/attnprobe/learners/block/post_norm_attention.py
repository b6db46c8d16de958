"""The attention of a post-norm (BERT) block, ``y = n2(h + F(h))`` with ``h = n1(x + A(X))``, read through the
unknown FFN and both LayerNorms (docs/block.md, "Post-norm blocks", stage ``attention``).

Given the single token's n1 input map ``x ↦ K x + c`` (:func:`.post_norm.first_norm_input`), every answered row can
be traced back to its n1 input up to that input's scale and the ones vector (all n1 keeps):

- :func:`row_point`: the n1 input ``v`` of an answered row ``y`` (centred, rms 1) by damped chord steps on the single
  tokens ``K⁻¹(v − c)`` (a single token answers ``g(x) = G(n1(K x + c))``, the same ``G`` as every row), and the
  answer's derivative along n1 inputs there, ``G' = g'(x) K⁻¹`` (``2d`` single tokens; blind to ``v`` and 1).
- :func:`pair_reading`: in the pair ``[a, b]`` the second row's n1 input is
  ``v₂ = b + Σ_h V_h(α_h a + (1 − α_h) b) + c`` with ``α_h = σ(ℓ_h)``, ``ℓ_h = bᵀB_h(a − b) + u_hᵀ(a − b)``
  (``B_h = W_Q,hᵀ W_K,h/√d_h``, ``u_h = W_K,hᵀ b_Q,h/√d_h``; the key bias cancels). Its derivatives in the key and
  the query, ``T_a = Σ_h α_h V_h + Σ_h α_h(1 − α_h) V_h(a − b) k_hᵀ`` (``k_h = B_hᵀ b + u_h``) and
  ``T_b = I + Σ_h (1 − α_h) V_h + Σ_h α_h(1 − α_h) V_h(a − b)(m_h − k_h)ᵀ`` (``m_h = B_h(a − b)``), are read by
  least squares ``G' T = ∂y₂`` (``4d`` pairs) up to ``v₂ gᵀ + 1 g'ᵀ`` and one common factor λ (``G'`` is read at a
  multiple of ``v₂``), fixed by ``T_a + T_b = K + (rank H)``: the median eigenvalue of ``K⁻¹(T_a + T_b)``.
- :func:`heads_split`: ``V⁻¹ T_a = Σ_h α_h Π_h + (rank ≤ H + 3)``, ``Π_h`` the projector onto the head's input
  space ``I_h = {x : W_V,h' x = 0, h' ≠ h}`` along the others, so each ``α_h`` is an eigenvalue of ``d_h − H − 3`` or
  more exact eigenvectors, all in ``I_h`` (a rank-r change leaves ``d_h − r`` of an eigenspace): clusters of equal
  eigenvalues (the null spaces of the centred ``T_a − α_h V``) hold them and ``H + 1`` more directions that change
  from pair to pair: matched across pairs by their shared directions, the directions every two pairs share span the
  ``I_h``; then ``V_h = V Π_h``. Its precision bounds the stage: MiniLM layer 2's ``I_h`` basis has condition
  3,040.
- :func:`head_logits`: with the ``V_h``, the rank-one parts of ``T_a`` and ``T_b`` give ``k_h`` and ``m_h − k_h``
  per head and pair; :func:`bilinear_logits` fits ``B_h = Q_q C Q_kᵀ`` (``Q_q``, ``Q_k`` the spans of the ``m_h``
  and the ``k_h`` differences, rank ``d_h``) and ``u_h = Q_k μ`` by linear least squares.
- :func:`attention_stage` chains them into a :class:`~attnprobe.models.positional.PositionalAttention` (no position
  term, not causal) answering like the block's attention up to the ones vector (which n1 ignores).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.block.post_norm import (STEP, FirstNormInput, centred_unit, single_tokens,
                                               single_token_jacobian)
from attnprobe.models.positional import PositionalAttention

#: Jacobians allowed per row (full Newton steps took 8 on MiniLM layer 2 from the uniform-weights start at
#: ``t = 0.15``, measured)
NEWTON_STEPS = 14
#: the row's answer is matched when its largest coordinate is off by less than this
NEWTON_TOL = 1e-12
#: a chord step (the Jacobian kept) must shrink the answer's residual this many times, else the Jacobian is read
#: again
CHORD_GAIN = 4.0
#: the key of a pair is ``b + t f`` (``b, f`` of rms 1): the heads' weights stay away from 0 and 1 (MiniLM layer 2:
#: 0.15 → 0.2 took the attention from 7.3e-4 to 4.3e-4; at 0.3 rows stalled)
PAIR_STEP = 0.2
#: pairs read (each gives one ``k_h`` and one ``m_h`` per head: at least ``d_h + 2`` must show one cluster per
#: head; on MiniLM layer 2 at t = 0.2, 37 of 48, 45 of 60, 54 of 72 did: the attention 4.3e-4, 1.5e-4, 1.5e-4)
PAIRS = 60
#: two eigenvalues of ``V⁻¹T_a`` belong to one head's cluster when closer than this share of their spread
CLUSTER_TOL = 1e-6


@dataclass(frozen=True)
class RowPoint:
    """``v``: the row's n1 input (centred, rms 1); ``G``: the answer's derivative along n1 inputs at ``v`` (d × d,
    blind to ``v`` and 1); ``residual``: the largest answer difference left; ``queries``: single tokens asked."""

    v: np.ndarray
    G: np.ndarray
    residual: float
    queries: int


def row_point(answer_rows, affine: FirstNormInput, y: np.ndarray, v0: np.ndarray,
              steps: int = NEWTON_STEPS) -> RowPoint:
    """The n1 input of the answered row ``y`` from the guess ``v0`` (module docstring): damped chord steps (the
    Jacobian, ``2d`` single tokens, is read again only when a step gains less than ×:data:`CHORD_GAIN`), up to
    ``steps`` Jacobians; one more at the end is ``G``. Refused (one line) when the answer is not matched."""
    Kinv = np.linalg.inv(affine.K)
    d = y.size

    def token(v):
        return Kinv @ (v - affine.c)

    def jacobian(v):
        return single_token_jacobian(answer_rows, token(v), STEP) @ Kinv
    v = centred_unit(v0)
    r = single_tokens(answer_rows, token(v)[None])[0] - y
    G, at, queries, fresh = jacobian(v), v, 1 + 2 * d, 1
    while np.abs(r).max() >= NEWTON_TOL:
        dv = np.linalg.lstsq(G, r, rcond=1e-8)[0]
        for t in 0.5 ** np.arange(11):
            vn = centred_unit(v - t * dv)
            rn = single_tokens(answer_rows, token(vn)[None])[0] - y
            queries += 1
            if np.linalg.norm(rn) < np.linalg.norm(r):
                break
        gain = np.linalg.norm(r) / max(np.linalg.norm(rn), 1e-300)
        if gain > 1:
            v, r = vn, rn
        if gain < CHORD_GAIN:
            if fresh > steps:
                raise UnidentifiableError(f"stage attention: no n1 input answers like the row (off by "
                                          f"{np.abs(r).max():.1e} after {steps} Jacobians)")
            G, at, queries, fresh = jacobian(v), v, queries + 2 * d, fresh + 1
    if at is v:
        return RowPoint(v, G, float(np.abs(r).max()), queries)
    return RowPoint(v, jacobian(v), float(np.abs(r).max()), queries + 2 * d)


@dataclass(frozen=True)
class PairReading:
    """The pair ``[a, b]``'s second row: ``v`` its n1 input (centred, rms 1), ``Ta``, ``Tb`` the n1 input's
    derivatives in the key ``a`` and the query ``b`` (d × d each, up to ``v gᵀ + 1 g'ᵀ``), ``queries``."""

    a: np.ndarray
    b: np.ndarray
    v: np.ndarray
    Ta: np.ndarray
    Tb: np.ndarray
    queries: int


def pair_reading(answer_rows, affine: FirstNormInput, a: np.ndarray, b: np.ndarray) -> PairReading:
    """:class:`PairReading` of ``[a, b]`` (module docstring): 1 pair, :func:`row_point` from the uniform-weights
    guess ``b + V(a + b)/2 + c``, then ``4d`` pairs (central differences in a and b)."""
    d = b.size
    X = np.stack([a, b])[None]
    y = np.asarray(answer_rows(X), dtype=np.float64)[0, 1]
    V = affine.K - np.eye(d)
    point = row_point(answer_rows, affine, y, b + V @ (a + b) / 2 + affine.c)
    E = np.eye(d) * STEP
    Xs = np.repeat(X, 4 * d, axis=0)
    for k in range(2):
        Xs[2 * k * d:(2 * k + 1) * d, k] += E
        Xs[(2 * k + 1) * d:(2 * k + 2) * d, k] -= E
    Y = np.asarray(answer_rows(Xs), dtype=np.float64)[:, 1]
    Ya, Yb = ((Y[2 * k * d:(2 * k + 1) * d] - Y[(2 * k + 1) * d:(2 * k + 2) * d]).T / (2 * STEP) for k in range(2))
    Za, Zb = (np.linalg.lstsq(point.G, Yk, rcond=1e-8)[0] for Yk in (Ya, Yb))
    lam = float(np.median(np.linalg.eigvals(np.linalg.solve(affine.K, Za + Zb)).real))
    return PairReading(a, b, point.v, Za / lam, Zb / lam, 1 + point.queries + 4 * d)


#: the null space of ``T_a − α_h V``: singular values below this share of the largest
NULL_TOL = 1e-5
#: two null spaces share a direction when their principal angle's sine is below this
COMMON_SINE = 1e-4


def _clusters(M: np.ndarray, V: np.ndarray, size: int):
    """Runs of equal eigenvalues of ``V⁻¹M`` with at least ``size`` members: [(value, null space of ``P(M − value·V)``,
    orthonormal)], ``P`` the centring. The null space holds the head's exact eigenvectors and up to H + 1 more
    directions (each other head's share of ``a − b`` and two pollution terms cancel there), which differ from pair to
    pair."""
    w = np.linalg.eigvals(np.linalg.solve(V, M))
    w = np.sort(w.real[np.abs(w.imag) <= CLUSTER_TOL * np.abs(w).max()])
    cuts = np.flatnonzero(np.diff(w) > CLUSTER_TOL * (w.max() - w.min())) + 1
    out = []
    for idx in np.split(np.arange(w.size), cuts):
        if idx.size >= size:
            alpha = float(np.median(w[idx]))
            D = M - alpha * V
            s, Vt = np.linalg.svd(D - D.mean(axis=0))[1:]  # centred: ``M`` is read up to 1 g'ᵀ
            out.append((alpha, Vt[s < NULL_TOL * s[0]].T))
    return out


def _common(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Directions shared by the spans of ``A`` and ``B`` (orthonormal columns), each weighted by ``1/sine²`` of its
    principal angle (capped): the accurate ones count most in the span taken of all of them (MiniLM layer 2: the
    heads' input spaces 3.8e-5 → 1.5e-5 off, d = 32: their value maps 1.4e-6 → 4.6e-8)."""
    U, cos, _ = np.linalg.svd(A.T @ B, full_matrices=False)
    sine = np.sqrt(np.clip(1 - cos**2, 0, None))
    keep = sine < COMMON_SINE
    return A @ U[:, keep] * (COMMON_SINE * 1e-3 / np.maximum(sine[keep], COMMON_SINE * 1e-4)) ** 2


@dataclass(frozen=True)
class HeadsSplit:
    """``spaces``: each head's input space ``I_h`` (d × d_h orthonormal); ``alphas`` (pairs × H): each pair's
    second-row weight on its key per head; ``Pi`` (H, d, d): the projectors onto the ``I_h`` along the others;
    ``kept``: the pairs used (the others did not show one cluster per head); ``gap``: the worst head's
    ``(d_h + 1)``-th singular value over its ``d_h``-th among the shared directions stacked (0 when they span
    exactly ``d_h``)."""

    spaces: list
    alphas: np.ndarray
    Pi: np.ndarray
    kept: list
    gap: float


def _projectors(spaces: list) -> np.ndarray:
    Bm = np.hstack(spaces)
    Binv = np.linalg.inv(Bm)
    dh = spaces[0].shape[1]
    return np.stack([Bm[:, h * dh:(h + 1) * dh] @ Binv[h * dh:(h + 1) * dh] for h in range(len(spaces))])


def heads_split(readings, V: np.ndarray, heads: int) -> HeadsSplit:
    """:class:`HeadsSplit` from pair readings (module docstring): each pair's clusters matched to the first pair's
    by the number of shared directions, then every head's ``I_h`` spanned by the directions its null spaces share
    pair to pair (the extra directions differ between pairs). Refused (one line) when a pair's eigenvalues do not
    fall into ``heads`` clusters or a head's shared directions do not span exactly ``d_h`` dimensions."""
    d = V.shape[0]
    dh = d // heads
    size = max(2, dh // 4)
    nulls, alphas, kept = [], [], []
    for i, r in enumerate(readings):
        cl = _clusters(r.Ta, V, size)
        # two heads' weights too close (their null spaces merge), or one head's cluster torn by rounding
        if len(cl) != heads or max(U.shape[1] for _, U in cl) > dh + heads + 1:
            continue
        kept.append(i)
        if nulls:
            score = np.array([[_common(N, U).shape[1] for _, U in cl] for N in nulls[0]])
            cl = [cl[j] for j in linear_sum_assignment(-score)[1]]
        nulls.append([U for _, U in cl])
        alphas.append([a for a, _ in cl])
    if len(kept) < max(3, len(readings) // 2):
        raise UnidentifiableError(f"stage attention: only {len(kept)} of {len(readings)} pairs show one cluster of "
                                  f"≥ {size} equal eigenvalues per head ({heads})")
    spaces, gap = [], 0.0
    for h in range(heads):
        shared = [_common(nulls[i][h], nulls[j][h]) for i in range(len(nulls)) for j in range(i)]
        U, s, _ = np.linalg.svd(np.hstack(shared + [np.zeros((d, 1))]), full_matrices=False)
        if s.size < dh or s[dh - 1] < 1e-6 * s[0]:
            raise UnidentifiableError(f"stage attention: head {h}'s input space shows fewer than d_h = {dh} "
                                      f"directions over {len(readings)} pairs; read more pairs")
        gap = max(gap, float(s[dh] / s[dh - 1]) if s.size > dh else 0.0)  # one head: I_h is all of R^d
        spaces.append(U[:, :dh])
    return HeadsSplit(spaces, np.array(alphas), _projectors(spaces), kept, gap)


def head_logits(reading: PairReading, split: HeadsSplit, V: np.ndarray):
    """``(mu, alpha, k, mk)``: the common factor's correction μ, the heads' weights on the key (H,),
    ``k_h = B_hᵀ b + u_h`` and ``m_h − k_h`` (H × d each) from one pair's ``T_a``, ``T_b`` given the heads' value
    maps ``V_h = V Π_h``. Centred, ``T_a`` is
    ``μ(Σ_h α_h V_h + Σ_h V_h(a − b) κ_hᵀ) + v gᵀ`` and ``T_b`` is ``μ(I + Σ_h (1 − α_h) V_h + Σ_h V_h(a − b)
    κ'_hᵀ) + v g'ᵀ`` (``μ`` ≈ 1: the common factor's correction): projected off the columns
    ``C = [V_h(a − b), v]``, both are linear in ``(μ, μα)`` — H + 1 unknowns over 2d² equations — and then
    ``κ = C⁺(…)``; ``k_h = κ_h/(α_h(1 − α_h))``, ``m_h − k_h = κ'_h/(α_h(1 − α_h))``."""
    d, H = V.shape[0], split.Pi.shape[0]
    P = np.eye(d) - 1.0 / d
    PV = P @ V @ split.Pi  # (H, d, d)
    C = np.column_stack([PV[h] @ (reading.a - reading.b) for h in range(H)] + [P @ reading.v])
    Q = np.eye(d) - C @ np.linalg.pinv(C)
    QV = Q @ PV
    Ta, Tb = P @ reading.Ta, P @ reading.Tb
    # unknowns (μ, ν_h = μα_h): Q Ta = Σ ν_h QV_h; Q Tb = μ Q(P + Σ V_h) − Σ ν_h QV_h
    design = np.concatenate([
        np.column_stack([np.zeros(d * d)] + [QV[h].ravel() for h in range(H)]),
        np.column_stack([(Q @ P + QV.sum(0)).ravel()] + [-QV[h].ravel() for h in range(H)])])
    sol = np.linalg.lstsq(design, np.concatenate([(Q @ Ta).ravel(), (Q @ Tb).ravel()]), rcond=None)[0]
    mu, alpha = sol[0], sol[1:] / sol[0]
    w = alpha * (1 - alpha)
    Cp = np.linalg.pinv(C)
    kappa = Cp @ (Ta / mu - np.einsum("h,hij->ij", alpha, PV))
    kappa_b = Cp @ (Tb / mu - P - np.einsum("h,hij->ij", 1 - alpha, PV))
    return mu, alpha, kappa[:H] / w[:, None], kappa_b[:H] / w[:, None]


def bilinear_logits(A: np.ndarray, B: np.ndarray, k: np.ndarray, mk: np.ndarray, dh: int):
    """``(B_h, u_h, misfit)`` of one head from pairs ``[a_j, b_j]`` (rows of ``A``, ``B``) and their ``k_j``,
    ``m_j − k_j`` (module docstring): ``Q_k`` spans the ``k_j`` differences, ``Q_q`` the ``m_j``; ``C`` and ``μ``
    by least squares on ``Q_kᵀk_j = Cᵀ Q_qᵀ b_j + μ`` and ``Q_qᵀ m_j = C Q_kᵀ(a_j − b_j)``."""
    m = mk + k
    Qk = np.linalg.svd((k - k.mean(0)).T, full_matrices=False)[0][:, :dh]
    Qq = np.linalg.svd(m.T, full_matrices=False)[0][:, :dh]
    n = len(A)
    pb, pd = B @ Qq, (A - B) @ Qk  # (n, dh)
    rows, rhs = [], []
    eye = np.eye(dh)
    for j in range(n):  # vec(C) column-major: C[p, q] at q·dh + p
        rows.append(np.hstack([np.kron(eye, pb[j][None]).reshape(dh, dh * dh), eye]))
        rhs.append(Qk.T @ k[j])
        rows.append(np.hstack([np.kron(pd[j][None], eye), np.zeros((dh, dh))]))
        rhs.append(Qq.T @ m[j])
    sol = np.linalg.lstsq(np.vstack(rows), np.concatenate(rhs), rcond=None)[0]
    C = sol[:dh * dh].reshape(dh, dh, order="F")
    Bh = Qq @ C @ Qk.T
    u = Qk @ sol[dh * dh:]
    fit_k = B @ Bh + u
    misfit = float(np.linalg.norm(fit_k - k) / np.linalg.norm(k))
    return Bh, u, misfit


@dataclass(frozen=True)
class AttentionStage:
    """``attention``: the block's attention up to the ones vector; ``split``; ``misfit``: the worst head's relative
    misfit of ``k_h``; ``queries``."""

    attention: PositionalAttention
    split: HeadsSplit
    misfit: float
    queries: int


def attention_model(V: np.ndarray, Pi: np.ndarray, logits, c: np.ndarray) -> PositionalAttention:
    """A :class:`PositionalAttention` (no position term, not causal, scale ``1/√d_h``) with value maps ``V Π_h``
    (each cut to rank d_h), logit forms ``B_h``, query-bias terms ``u_h`` (``logits``: [(B_h, u_h)]) and output
    bias ``c``."""
    H, d = Pi.shape[0], V.shape[0]
    dh = d // H
    scale = 1 / np.sqrt(dh)
    Wq, Wk, Wv, Wo, bq = [], [], [], [], []
    for h, (Bh, u) in enumerate(logits):
        U, s, Wt = np.linalg.svd(Bh)
        root = np.sqrt(s[:dh] / scale)
        Wq.append(root[:, None] * U[:, :dh].T)
        Wk.append(root[:, None] * Wt[:dh])
        bq.append(np.linalg.lstsq(Wk[-1].T, u / scale, rcond=None)[0])
        U, s, Wt = np.linalg.svd(V @ Pi[h])
        Wo.append(U[:, :dh] * s[:dh])
        Wv.append(Wt[:dh])
    return PositionalAttention(np.stack(Wq), np.stack(Wk), np.stack(Wv), np.hstack(Wo), bq=np.stack(bq), bo=c,
                               position="none", scale=scale, causal=False)


def value_map(K: np.ndarray) -> np.ndarray:
    """``V = K − I`` in a gauge where it is invertible: ``P V + 1 nᵀ s`` (``n`` the unit null vector of ``P V``,
    ``s = ‖P V‖₂/√d``). ``K`` is fixed up to ``1 aᵀ`` only (which n1 ignores), and the gauge
    :func:`.post_norm.first_norm_input` picks makes ``K − I`` singular."""
    d = K.shape[0]
    PV = K - np.eye(d)
    PV = PV - PV.mean(axis=0)
    _, s, Vt = np.linalg.svd(PV)
    return PV + np.outer(np.ones(d), Vt[-1]) * s[0] / np.sqrt(d)


def read_pairs(answer_rows, affine: FirstNormInput, rng, pairs: int = PAIRS, step: float = PAIR_STEP) -> list:
    """:class:`PairReading` s of ``pairs`` pairs ``[b + step·f, b]`` (``b``, ``f`` random of rms 1); a pair whose
    row :func:`row_point` does not match is left out (its queries are lost), all of them: refused."""
    d = affine.K.shape[0]
    readings, exc = [], None
    for _ in range(pairs):
        b, f = (z / np.sqrt(np.mean(z**2)) for z in rng.standard_normal((2, d)))
        try:
            readings.append(pair_reading(answer_rows, affine, b + step * f, b))
        except UnidentifiableError as err:
            exc = err
    if not readings and exc is not None:
        raise exc
    return readings


def attention_from_pairs(readings, affine: FirstNormInput, heads: int) -> AttentionStage:
    """The heads' split, their logits and the model from pair readings (no queries of its own)."""
    d = affine.K.shape[0]
    if d % heads:
        raise UnidentifiableError(f"stage attention: d = {d} does not split into {heads} equal heads")
    dh, V = d // heads, value_map(affine.K)
    split = heads_split(readings, V, heads)
    kept = [readings[i] for i in split.kept]
    if len(kept) < dh + 2:
        raise UnidentifiableError(f"stage attention: {len(kept)} of {len(readings)} pairs show one cluster per head; "
                                  f"the logits need d_h + 2 = {dh + 2}: read more pairs")
    _, _, ks, mks = zip(*(head_logits(r, split, V) for r in kept))
    ks, mks = np.stack(ks), np.stack(mks)  # (pairs, H, d)
    A, B = np.stack([r.a for r in kept]), np.stack([r.b for r in kept])
    logits, misfit = [], 0.0
    for h in range(heads):
        Bh, u, mis = bilinear_logits(A, B, ks[:, h], mks[:, h], dh)
        logits.append((Bh, u))
        misfit = max(misfit, mis)
    model = attention_model(V, split.Pi, logits, affine.c)
    return AttentionStage(model, split, misfit, sum(r.queries for r in readings))


def attention_stage(answer_rows, affine: FirstNormInput, heads: int, rng, pairs: int = PAIRS,
                    step: float = PAIR_STEP) -> AttentionStage:
    """Stage ``attention`` (module docstring): :func:`read_pairs` then :func:`attention_from_pairs`. About
    ``pairs·(1 + 4d + 2d·J + chord steps)`` queries, J the Jacobians a row took (2 … 3 on MiniLM layer 2: ~4,300
    queries a pair at t = 0.2, measured)."""
    d = affine.K.shape[0]
    if d % heads:
        raise UnidentifiableError(f"stage attention: d = {d} does not split into {heads} equal heads")
    return attention_from_pairs(read_pairs(answer_rows, affine, rng, pairs, step), affine, heads)
