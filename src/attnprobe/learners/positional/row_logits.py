"""RoPE heads' query and key maps from every-position rows of random sequences (docs/positional.md, "The start at
LLaMA-3-8B's size"), given every head's value map.

With ``V_h = C_h G_h`` known (``C_h`` the head's output space, ``Cb = [C_1 … C_H]`` square at LLaMA-3's shape),
row ``i`` of a causal layer splits into the heads' coordinates ``z_h,i = (Cb⁻¹ (y_i − c))_h = Σ_{j≤i} a_h(i, j)
G_h x_j``: for ``N ≤ d_h`` tokens the ``G_h x_j`` are independent and every weight of every row is solved, all rows
of a sequence at once (:func:`attention_from_rows`: ``G_h X = Q R``, ``R`` upper triangular, so row ``i``'s weights
are ``R⁻¹`` of the first ``i + 1`` entries of ``Qᵀ z_h,i``). Their logs are the scores up to a row constant,

    ``log a_h(i, j) = q̃_iᵀ k̃_j + b_h,i``,  ``q̃_i = R(i) W_Q,h x_i``,  ``k̃_j = R(j) W_K,g x_j``,

``N²/2`` samples a sequence and head (the route's logit sequences: 9). :func:`gauss_newton_logit_maps` fits them
by Levenberg–Marquardt on ``W_Q`` (every head) and ``W_K`` (every group, its heads pooled) together, the row
constants eliminated by weighted centring over each row's keys, each step by conjugate gradients preconditioned by
``D ⊗ XᵀX`` (``D`` the rotation-averaged second moment of the other side's vectors). It converges in a few rounds
from a start near the maps and crawls from a random one at ``d_h = 128`` (docs: measured). The tokens are
block-sparse (:class:`BlockTokens`): each has ``support`` nonzero coordinates in one block, so
``X W`` costs ``support/d`` of a dense product and ``XᵀX`` is block diagonal.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.learners.core.conjugate_gradients import conjugate_gradients

#: tokens per sequence below the heads' width (the weights' solve loses conditioning as N → d_h)
MARGIN = 8
#: nonzero coordinates of a token (one block of the input; the whole input when d is smaller)
SUPPORT = 64
#: Levenberg–Marquardt rounds, conjugate-gradient steps a round while the misfit is above NEAR (inexact steps
#: keep a random start's first rounds short and tame) and below it, the first damping
ROUNDS, CG_STEPS, CG_NEAR, NEAR, DAMPING = 40, 10, 40, 0.05, 1e-3
#: the least damping while the misfit is above NEAR (1e-6 below it). LLaMA's head shape d = 128, 1/1, base 5e5,
#: exact rows, random start: misfit 2.0e-2 after 20 rounds with 1e-2, 4.1e-2 with 1e-6 (the barely turning pairs'
#: near-gauge directions take huge steps undamped)
DAMPING_FLOOR = 1e-2


class BlockTokens:
    """``n`` tokens, token ``t`` nonzero on block ``block[t]`` (coordinates ``block·s … block·s + s − 1``) with values
    ``vals[t]``: products with a ``(r, d)`` map cost ``n·s·r``, and ``XᵀX`` is block diagonal (``(d/s)`` blocks
    ``s × s``, inverted once)."""

    def __init__(self, block: np.ndarray, vals: np.ndarray, d: int):
        self.block, self.vals, self.d = np.asarray(block), np.asarray(vals, dtype=np.float64), d
        self.s = self.vals.shape[1]
        self.members = [np.flatnonzero(self.block == b) for b in range(d // self.s)]
        self._gram_inv = None

    @property
    def gram_inv(self) -> list:
        """Each block's ``(Σ v vᵀ)⁻¹`` (computed once; refused with fewer tokens than coordinates in a block)."""
        if self._gram_inv is None:
            least = min(len(idx) for idx in self.members)
            if least < self.s:
                raise ConfigError(f"the maps are fitted from at least {self.s} tokens per block of the input; got "
                                  f"{least}: ask more sequences", param="sequences")
            self._gram_inv = [np.linalg.inv(self.vals[idx].T @ self.vals[idx]) for idx in self.members]
        return self._gram_inv

    @classmethod
    def random(cls, sequences: int, length: int, d: int, rng: np.random.Generator, support: int = SUPPORT,
               scale: float = 1.0):
        """``sequences × length`` tokens, values ``N(0, scale²·d/s)`` (norm about ``scale·√d``), each sequence's
        blocks balanced (at most ``⌈length·s/d⌉`` tokens of a sequence share a block: their heads' values stay
        independent); dense tokens (``s = d``) when a block would hold more than half its width of a sequence."""
        s = min(support, d)
        if d % s or -(-length * s // d) > s // 2:
            s = d
        blocks = d // s
        block = np.concatenate([rng.permutation(np.arange(length) + rng.integers(blocks)) % blocks
                                for _ in range(sequences)])
        return cls(block, rng.standard_normal((sequences * length, s)) * scale * math.sqrt(d / s), d)

    def project(self, W: np.ndarray, rows: slice | None = None) -> np.ndarray:
        """``X Wᵀ`` (n, r) for ``W (r, d)`` (the tokens ``rows`` only when given)."""
        block, vals = (self.block, self.vals) if rows is None else (self.block[rows], self.vals[rows])
        out = np.empty((len(block), W.shape[0]))
        for b in range(self.d // self.s):
            idx = np.flatnonzero(block == b) if rows is not None else self.members[b]
            out[idx] = vals[idx] @ W[:, b * self.s:(b + 1) * self.s].T
        return out

    def dense(self, rows: slice | None = None) -> np.ndarray:
        """The tokens as rows of ``d`` numbers (``rows`` only when given)."""
        block, vals = (self.block, self.vals) if rows is None else (self.block[rows], self.vals[rows])
        X = np.zeros((len(block), self.d))
        np.put_along_axis(X, block[:, None] * self.s + np.arange(self.s), vals, axis=1)
        return X

    def adjoint(self, P: np.ndarray) -> np.ndarray:
        """``Pᵀ X`` (r, d) for ``P (n, r)``."""
        out = np.empty((P.shape[1], self.d))
        for b, idx in enumerate(self.members):
            out[:, b * self.s:(b + 1) * self.s] = P[idx].T @ self.vals[idx]
        return out

    def gram_apply(self, W: np.ndarray) -> np.ndarray:
        """``W XᵀX`` for ``W (..., d)`` (any leading axes)."""
        out = np.empty_like(W)
        for b, idx in enumerate(self.members):
            sl = slice(b * self.s, (b + 1) * self.s)
            out[..., sl] = W[..., sl] @ (self.vals[idx].T @ self.vals[idx])
        return out

    def gram_solve(self, G: np.ndarray) -> np.ndarray:
        """``G (XᵀX)⁻¹`` for ``G (r, d)``."""
        out = np.empty_like(G)
        for b, inv in enumerate(self.gram_inv):
            sl = slice(b * self.s, (b + 1) * self.s)
            out[:, sl] = G[:, sl] @ inv
        return out


def attention_from_rows(Y: np.ndarray, X: np.ndarray, Cb: np.ndarray, G: np.ndarray, c) -> np.ndarray:
    """Every head's causal weights ``a (B, H, N, N)`` (row ``i``, key ``j ≤ i``; zero above the diagonal) from the
    rows ``Y (B, N, K)`` of the tokens ``X (B, N, d)`` (or their heads' values ``G_h x_j`` as ``(B, N, H, d_h)``):
    ``Σ_{j≤i} a_h(i, j) G_h x_j = z_h,i`` solved in each head's coordinates, every row of a sequence by one QR
    (module docstring). Needs ``N ≤ d_h``."""
    H, dh = G.shape[:2]
    B, N = Y.shape[:2]
    if N > dh:
        raise ConfigError(f"the rows' weights are solved in a head's {dh} coordinates: sequences of at most {dh} "
                          f"tokens; got {N}", param="length")
    vals = X if X.ndim == 4 else np.einsum("bnd,hkd->bnhk", X, G)
    Z = np.linalg.solve(Cb, (Y - c).reshape(-1, Y.shape[-1]).T).T.reshape(B, N, H, dh)
    A = vals.transpose(0, 2, 3, 1)  # (B, H, d_h, N): column j is G_h x_j
    Qm, R = np.linalg.qr(A)
    rhs = np.triu(np.swapaxes(Qm, -1, -2) @ Z.transpose(0, 2, 3, 1))  # [k, i], k ≤ i
    return np.swapaxes(np.linalg.solve(R, rhs), -1, -2)


def log_weight_samples(a: np.ndarray):
    """``ℓ = log a`` and each sample's least-squares weight ``min(1, (i + 1)·a)`` (a weight solved to an absolute
    error reads its log to that error over ``a``; at least a uniform row's share counts fully); zero weight for
    keys after the row, non-positive weights and the first row (one key: no information once centred)."""
    N = a.shape[-1]
    i = np.arange(N)
    ok = (i[None, :] <= i[:, None]) & (i[:, None] > 0) & (a > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ell = np.where(ok, np.log(np.where(ok, a, 1.0)), 0.0)
    w = np.where(ok, np.minimum(1.0, a * (i[:, None] + 1)), 0.0)
    return ell, w


class _Scores:
    """The centred scores of every head and row: ``P(q̃_iᵀ k̃_j)`` with ``P`` the weighted centring over each row's
    keys (``w``-orthogonal, so the normal operator is ``Jᵀ (w ⊙ P(·))``)."""

    def __init__(self, w: np.ndarray, theta: np.ndarray, groups: int, positions=None):
        self.w, self.groups = w, groups
        self.wsum = w.sum(-1, keepdims=True)
        self.wsum[self.wsum == 0] = np.inf
        N = w.shape[-1]
        dh = 2 * len(theta)
        self.theta = theta
        self.positions = np.arange(N) if positions is None else np.asarray(positions)
        angles = self.positions[:, None] * theta[None, :]
        self.cos, self.sin, self.h = np.cos(angles), np.sin(angles), dh // 2

    def rot(self, x: np.ndarray, sign: float = 1.0) -> np.ndarray:
        """``R(±i)`` on the last axis of ``x (..., N, d_h)`` (rotate-half pairs), row ``i`` at position ``i``."""
        a, b = x[..., :self.h], x[..., self.h:]
        s = sign * self.sin
        return np.concatenate([a * self.cos - b * s, b * self.cos + a * s], axis=-1)

    def center(self, S: np.ndarray) -> np.ndarray:
        """``w ⊙ P(S)``."""
        return self.w * (S - (self.w * S).sum(-1, keepdims=True) / self.wsum)

    def per_head(self, k: np.ndarray) -> np.ndarray:
        return np.repeat(k, self.w.shape[1] // self.groups, axis=1)

    def per_group(self, g: np.ndarray) -> np.ndarray:
        B, H, N, dh = g.shape
        return g.reshape(B, self.groups, H // self.groups, N, dh).sum(2)


def _heads(tokens: BlockTokens, W: np.ndarray, B: int, N: int) -> np.ndarray:
    """``W (m, d_h, d)`` applied to every token: (B, m, N, d_h)."""
    m, dh, d = W.shape
    return tokens.project(W.reshape(m * dh, d)).reshape(B, N, m, dh).transpose(0, 2, 1, 3)


def _to_maps(tokens: BlockTokens, g: np.ndarray) -> np.ndarray:
    """The adjoint of :func:`_heads`: (B, m, N, d_h) → (m, d_h, d)."""
    B, m, N, dh = g.shape
    return tokens.adjoint(g.transpose(0, 2, 1, 3).reshape(B * N, m * dh)).reshape(m, dh, tokens.d)


def _moment(v: np.ndarray, weight: np.ndarray, sc: "_Scores", offsets: tuple, sign: float) -> np.ndarray:
    """``D = Σ_δ p(δ) R(−sign·δ) C R(−sign·δ)ᵀ`` per head (``C`` the ``weight``-weighted second moment of the
    unrotated vectors ``v (B, m, N, d_h)``, ``offsets = (δ, p (m, k))`` the samples' weight per token at each offset
    ``i − j = δ``, :func:`_offset_weights`): the other
    side's design ``R(j − i) k_j`` (or ``R(i − j) q_i``, ``sign = −1``) averaged over the rows, the first factor of
    the Kronecker preconditioner ``D ⊗ XᵀX`` (a full ``d_h × d_h``: the low frequencies barely turn). With
    ``R = [[c, −s], [s, c]]`` per pair the sum over δ is four ``h × h`` weighted products of cosines and sines."""
    B, m, N, dh = v.shape
    h = dh // 2
    vw = (v * weight[..., None]).transpose(1, 0, 2, 3).reshape(m, -1, dh)
    C = np.swapaxes(vw, 1, 2) @ v.transpose(1, 0, 2, 3).reshape(m, -1, dh)
    C /= np.maximum(weight.sum((0, 2)), 1e-300)[:, None, None]
    offs, per_offset = offsets
    phi = -sign * offs[:, None] * sc.theta[None, :]
    cos, sin = np.cos(phi), np.sin(phi)
    CC, CS = np.einsum("mn,np,nq->mpq", per_offset, cos, cos), np.einsum("mn,np,nq->mpq", per_offset, cos, sin)
    SS = np.einsum("mn,np,nq->mpq", per_offset, sin, sin)
    SC = np.swapaxes(CS, 1, 2)
    A, Bm, Bt, Dm = C[:, :h, :h], C[:, :h, h:], C[:, h:, :h], C[:, h:, h:]
    top = np.concatenate([CC * A - SC * Bt - CS * Bm + SS * Dm, CS * A - SS * Bt + CC * Bm - SC * Dm], axis=2)
    bottom = np.concatenate([SC * A + CC * Bt - SS * Bm - CS * Dm, SS * A + CS * Bt + SC * Bm + CC * Dm], axis=2)
    return np.concatenate([top, bottom], axis=1)


def _offset_weights(w: np.ndarray, positions: np.ndarray):
    """The offsets ``i − j ≥ 0`` between the tokens' positions and the samples' weight per token at each: offsets
    (k,) and weights (H, k)."""
    n = w.shape[0] * w.shape[2]
    delta = positions[:, None] - positions[None, :]
    offsets = np.unique(delta[delta >= 0])
    per_head = w.sum(0)  # (H, N, N)
    return offsets, np.stack([per_head[:, delta == o].sum(-1) for o in offsets], axis=1) / n


def _balance(Wq: np.ndarray, Wk: np.ndarray):
    """The gauge's scales that balance it: each group's rotated pair scaled so that its queries (the group's heads
    pooled, per head) and its keys have one norm (``q → c q``, ``k → k / c`` leaves every score unchanged): the
    factors per head ``(H, d_h)`` and per group ``(G, d_h)``."""
    G, dh, _ = Wk.shape
    H = Wq.shape[0]
    h = dh // 2
    nq = np.sqrt((Wq.reshape(G, H // G, 2, h, -1) ** 2).sum((1, 2, 4)) / (H // G))
    nk = np.sqrt((Wk.reshape(G, 2, h, -1) ** 2).sum((1, 3)))
    c = np.sqrt(nk / np.maximum(nq, 1e-300))  # (G, h)
    c = np.concatenate([c, c], axis=1)
    return np.repeat(c, H // G, axis=0), c


def _inverse(D: np.ndarray) -> np.ndarray:
    dh = D.shape[-1]
    return np.linalg.inv(D + 1e-12 * np.trace(D, axis1=1, axis2=2)[:, None, None] / dh * np.eye(dh))


def _precondition(tokens: "BlockTokens", Dinv: np.ndarray, G: np.ndarray) -> np.ndarray:
    """``(D ⊗ XᵀX)⁻¹ G``: ``D⁻¹ G (XᵀX)⁻¹`` per head or group."""
    return tokens.gram_solve((Dinv @ G).reshape(-1, tokens.d)).reshape(G.shape)


def gauss_newton_logit_maps(tokens: BlockTokens, ell: np.ndarray, w: np.ndarray, theta: np.ndarray, groups: int,
                            start, *, rounds: int = ROUNDS, cg_steps: int = CG_STEPS, cg_near: int = CG_NEAR,
                            damping: float = DAMPING, damping_floor: float = DAMPING_FLOOR, balance: bool = True,
                            positions=None, log=None):
    """``W_Q (H, d_h, d)`` and ``W_K (G, d_h, d)`` minimising ``Σ w (P(ℓ) − P(q̃_iᵀ k̃_j))²`` over every head, row
    and key (``ell, w (B, H, N, N)`` from :func:`log_weight_samples`, ``tokens`` the ``B·N`` tokens in order, ``P``
    the weighted centring over a row's keys) by Levenberg–Marquardt on both maps from ``start``: each step
    ``(JᵀWJ + λ·D) δ = JᵀW r`` by ``cg_steps`` conjugate-gradient steps (``cg_near`` below a misfit of
    :data:`NEAR`) preconditioned by the blocks ``D_Q ⊗ XᵀX``, ``D_K ⊗ XᵀX`` (:func:`_moment`; the gauge's null
    directions are harmless: the system is consistent), ``λ`` down 3× on success to ``damping_floor``, up 4× on
    failure; ``balance``: each pair's gauge scale balanced after a step. The scale is in ``W_Q`` (score
    ``q̃ᵀk̃``). ``log(round, misfit)``: the relative weighted misfit after each round."""
    B, H, N, _ = ell.shape
    sc = _Scores(w, theta, groups, positions)
    target = sc.center(ell)
    norm = float(np.sqrt(np.sum(target * ell))) or 1.0
    Wq, Wk = start
    nq = Wq.size
    offs = _offset_weights(w, sc.positions)
    lam = damping

    def split(v):
        return v[:nq].reshape(Wq.shape), v[nq:].reshape(Wk.shape)

    def state(Wq, Wk):
        qt, kt = sc.rot(_heads(tokens, Wq, B, N)), sc.per_head(sc.rot(_heads(tokens, Wk, B, N)))
        r = target - sc.center(qt @ np.swapaxes(kt, -1, -2))
        return qt, kt, r, float(np.sqrt(np.sum(r**2 / np.maximum(w, 1e-300) * (w > 0)))) / norm

    qt, kt, r, misfit = state(Wq, Wk)
    for rnd in range(rounds):
        Dq = _moment(sc.per_head(_heads(tokens, Wk, B, N)), w.sum(2), sc, offs, 1.0)
        Dk = sc.per_group(_moment(_heads(tokens, Wq, B, N), w.sum(3), sc, offs, -1.0)[None])[0]
        Dq_inv, Dk_inv = _inverse(Dq), _inverse(Dk)

        def jt(T, qt=qt, kt=kt):
            gq = _to_maps(tokens, sc.rot(T @ kt, -1.0))
            gk = _to_maps(tokens, sc.rot(sc.per_group(np.swapaxes(T, -1, -2) @ qt), -1.0))
            return np.concatenate([gq.ravel(), gk.ravel()])

        def op(v, qt=qt, kt=kt, lam=lam):
            dq, dk = split(v)
            dqt, dkt = sc.rot(_heads(tokens, dq, B, N)), sc.per_head(sc.rot(_heads(tokens, dk, B, N)))
            S = dqt @ np.swapaxes(kt, -1, -2) + qt @ np.swapaxes(dkt, -1, -2)
            gq, gk = split(jt(sc.center(S)))
            return np.concatenate([(gq + lam * tokens.gram_apply(Dq @ dq)).ravel(),
                                   (gk + lam * tokens.gram_apply(Dk @ dk)).ravel()])

        def pre(v, lam=lam):
            gq, gk = split(v)
            return np.concatenate([_precondition(tokens, Dq_inv, gq).ravel(),
                                   _precondition(tokens, Dk_inv, gk).ravel()]) / (1 + lam)

        step = conjugate_gradients(op, jt(r), cg_steps if misfit > NEAR else cg_near, precondition=pre, rtol=0.0)
        dq, dk = split(step)
        trial = state(Wq + dq, Wk + dk)
        if trial[3] < misfit:
            Wq, Wk = Wq + dq, Wk + dk
            qt, kt, r, misfit = trial
            if balance:
                cq, ck = _balance(Wq, Wk)
                Wq, Wk = Wq * cq[:, :, None], Wk / ck[:, :, None]
                qt, kt = qt * cq[None, :, None], kt / cq[None, :, None]
            lam = max(lam / 3, damping_floor if misfit > NEAR else 1e-6)
        else:
            lam *= 4
        if log is not None:
            log(rnd, misfit)
    return Wq, Wk


def row_logit_maps(oracle, Cb: np.ndarray, G: np.ndarray, c, theta: np.ndarray, groups: int,
                   rng: np.random.Generator, *, sequences: int, length: int | None = None, support: int = SUPPORT,
                   scale: float = 1.0, rounds: int = ROUNDS, cg_steps: int = CG_STEPS, batch: int = 8, log=None):
    """Every head's ``W_Q (H, d_h, d)`` (the score's scale in it) and every group's ``W_K (G, d_h, d)`` from the
    every-position rows of ``sequences`` random block-sparse sequences of ``length`` tokens (default
    ``d_h − MARGIN``; entries of size ``scale``), given the value maps ``V_h = C_h G_h`` (``Cb`` square) and the
    output bias ``c``: :func:`attention_from_rows`, :func:`log_weight_samples`, then
    :func:`gauss_newton_logit_maps` from random maps. Asks ``sequences`` sequences, ``batch`` at a time."""
    H, dh, d = G.shape
    if Cb.shape[0] != Cb.shape[1]:
        raise ConfigError(f"the rows split into the heads' coordinates only when their output spaces fill the row "
                          f"(K = H·d_h); got K = {Cb.shape[0]}, H·d_h = {Cb.shape[1]}", param="heads")
    N = length or dh - MARGIN
    tokens = BlockTokens.random(sequences, N, d, rng, support, scale)
    ell = np.empty((sequences, H, N, N))
    w = np.empty_like(ell)
    for at in range(0, sequences, batch):
        sl = slice(at * N, min(sequences, at + batch) * N)
        X = tokens.dense(sl).reshape(-1, N, d)
        Y = np.asarray(oracle.answer_rows(X), dtype=np.float64)
        vals = tokens.project(G.reshape(H * dh, d), sl).reshape(len(X), N, H, dh)
        ell[at:at + len(X)], w[at:at + len(X)] = log_weight_samples(attention_from_rows(Y, vals, Cb, G, c))
    start = (rng.standard_normal((H, dh, d)) / math.sqrt(d), rng.standard_normal((groups, dh, d)) / math.sqrt(d))
    return gauss_newton_logit_maps(tokens, ell, w, theta, groups, start, rounds=rounds, cg_steps=cg_steps, log=log)
