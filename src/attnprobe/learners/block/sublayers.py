"""A pre-norm RMSNorm block split into an FFN oracle and an attention oracle (docs/block.md, "The learner").

With ``RMSNorm(x) = w ⊙ x / √(mean x² + ε)`` (the weights fold into the next projections) the norm maps the ray of
``z`` onto the open ball ``mean z² < 1`` one to one: ``x = z √(ε / (1 − mean z²))`` is normalised to exactly ``z``,
and a zero row stays zero. So both sublayers can be fed any normalised rows of rms below 1:

- :func:`linear_part`: tiny single tokens (``‖x‖ ≪ ε``) see a linear block, ``y'(0) = I + M'/√ε`` with
  ``M' = M diag(w1)`` the value map (a bias-free gated FFN is flat to first order at 0), by Richardson-extrapolated
  central differences;
- :func:`sqrt_eps`: ``√ε`` from a few driven-out tokens on the sphere, whose FFN share the zero keys remove
  (:func:`.levers.ffn_on_sphere`): ``M' û = √ε (y'(0) − I) û``;
- :class:`FFNThroughBlock`: ``v ↦ F(w2 ⊙ v)`` for ``mean v² < 1``: the single token ``x`` whose residual
  ``h = x + M' n1(x)`` is ``c·v`` with ``c = √(ε/(1 − mean v²))`` (a scalar fixed point per row), answered ``y − h``;
- :class:`AttentionThroughBlock`: normalised rows ``Z`` (keys of rms below 1, the query of rms 1) ↦ the
  attention's last row ``A_N(Z)``, from ``y_N − x_N = a + F(n2(x_N + a))`` with the query driven far out
  (``x_N = T z_N``): a fixed point in ``a`` on the learned FFN, whose error at the query is measured on the single
  token ``[x_N]`` (its attention is the value map) and taken off. (Queries of rms below 1 need ``x_N`` tiny, where
  ``a ↦ a + F(n2(x_N + a))`` has several roots: Newton's method found wrong ones in 10 of 16 rows, measured.)
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import ConfigError, RecoveryError
from attnprobe.learners.block.levers import driven_out, ffn_on_sphere

#: singular values of ``M'`` below this fraction of the largest are its null space (GQA: rank ``G·d_h``)
RANK_GAP = 1e-9
#: Newton steps on the token's d equations after its scale's root (:meth:`FFNThroughBlock._refine`)
REFINE_STEPS = 2
#: token norms of :func:`linear_part` (Richardson over s, s/2, s/4): far below ε (≥ 1e-8 supported)
LINEAR_STEP = 1e-10
#: the largest row rms a normalised input may have (the norm reaches rms < 1 only)
MAX_RMS = 0.98
#: the largest input scale of the gated FFN learner through the block (:func:`ffn_scale`)
FFN_SCALE_MAX = 0.6
#: fixed-point steps and the relative change at which :class:`AttentionThroughBlock` stops
NEWTON_STEPS, NEWTON_TOL = 200, 1e-16
#: the query row's drive: ``T·z_N`` with ``z_N`` of rms 1
QUERY_DRIVE = 10.0
#: Newton steps on each token's norm scale in :meth:`FFNThroughBlock.token_for`
TOKEN_STEPS = 50
#: rows whose root has ``κ√ε`` below this are scanned for a larger root (a smaller token), on this many points
SCAN_BELOW, SCAN_POINTS, SCAN_CHUNK = 0.1, 48, 128


def ffn_scale(d: int) -> float:
    """The gated FFN learner's input scale (standard deviation per coordinate) through the block: as large as keeps
    its rows' rms, ``≈ s(1 ± z/√(2d))``, below :data:`MAX_RMS` at six standard deviations, at most
    :data:`FFN_SCALE_MAX`. Larger inputs mean larger residuals ``h`` beside the victim's rounding: at d = 128 the
    gated learner through the block failed at 0.35 (function error 1.0, its second differences on FFN answers
    ~1e-12 off) and read the FFN to 4.3e-12 at 0.6 (measured; docs/block.md)."""
    return min(FFN_SCALE_MAX, 0.95 * MAX_RMS / (1 + 6 / math.sqrt(2 * d)))


def first_rows(answer_rows, X: np.ndarray) -> np.ndarray:
    return np.asarray(answer_rows(X), dtype=np.float64)[:, 0]


def linear_part(answer_rows, d: int, step: float = LINEAR_STEP, levels: int = 3) -> np.ndarray:
    """``y'(0)`` (d × d) of the single-token map, by central differences along the coordinates at token norms
    ``step, step/2, …`` Richardson-extrapolated (``2·levels·d`` queries of length 1)."""
    table = []
    for i in range(levels):
        s = step / 2**i
        E = np.eye(d) * s
        y = first_rows(answer_rows, np.concatenate([E, -E])[:, None, :])
        table.append(((y[:d] - y[d:]) / (2 * s)).T)
    for k in range(1, levels):
        f = 4.0**k
        table = [(f * table[i + 1] - table[i]) / (f - 1) for i in range(len(table) - 1)]
    return table[0]


def sqrt_eps(answer_rows, K0: np.ndarray, rng: np.random.Generator, tokens: int = 2,
             heads: int | None = None) -> tuple[float, float]:
    """``√ε`` by least squares from ``tokens`` directions ``u`` on the sphere (rms 1): the attention's share of a
    driven-out single token is ``M' u = L([u]) − F(n2(u))`` and ``y'(0) − I = M'/√ε``; ``F(n2(u))`` by
    :func:`.levers.ffn_on_sphere` (its rational limit when ``heads`` is given). Returns it and the fit's relative
    misfit."""
    d = K0.shape[0]
    U = rng.standard_normal((tokens, d))
    U *= math.sqrt(d) / np.linalg.norm(U, axis=1, keepdims=True)
    Mu = driven_out(answer_rows, U[:, None, :]) - ffn_on_sphere(answer_rows, U, heads=heads)
    P = U @ (K0 - np.eye(d)).T
    s = float(np.sum(P * Mu) / np.sum(P * P))
    misfit = float(np.linalg.norm(Mu - s * P) / np.linalg.norm(Mu))
    return s, misfit


def inverse_norm(Z: np.ndarray, eps: float) -> np.ndarray:
    """Rows ``x`` with ``x / √(mean x² + ε) = z`` (rms(z) < 1): ``x = z √(ε/(1 − mean z²))``; refuses rows of rms
    ≥ :data:`MAX_RMS`, which no input reaches through the norm."""
    ms = np.mean(Z * Z, axis=-1, keepdims=True)
    if np.any(ms >= MAX_RMS**2):
        raise ConfigError(f"a normalised row of rms {math.sqrt(float(ms.max())):.3f} was asked; an RMSNorm's outputs "
                          f"have rms below 1 (this learner feeds rows up to {MAX_RMS})", param="inputs")
    return Z * np.sqrt(eps / (1 - ms))


class FFNThroughBlock:
    """``V (B, 1, d) ↦ F(w2 ⊙ v) (B, d)`` for rows of rms below 1, by one single-token query each (module
    docstring). ``M`` is ``M' = M diag(w1)``; ``eps`` the norms' ε (both norms share it)."""

    def __init__(self, answer_rows, M: np.ndarray, eps: float):
        self.answer_rows, self.eps, self.d = answer_rows, float(eps), M.shape[0]
        U, sv, Vt = np.linalg.svd(M)
        r = max(1, int(np.sum(sv > RANK_GAP * sv[0])))
        U, Vt = U[:, :r] * sv[:r], Vt[:r]
        self.U, self.Vt, self.B = U, Vt, Vt @ U
        lam, Q = np.linalg.eig(self.B)  # M' U Q = U Q Λ: the nonzero eigenvalues, on an r-dim basis
        self.lam, self.UQ, self.QinvV = lam, U @ Q, np.linalg.solve(Q, Vt)

    def token_for(self, H: np.ndarray) -> np.ndarray:
        """Single tokens ``x`` with ``x + M' x / √(mean x² + ε) = h`` (rows of ``H``): ``x(κ) = (I + κM')⁻¹ h`` with
        ``κ = 1/√(mean x(κ)² + ε)``, a scalar equation per row solved by Newton's method from ``κ = 1/√ε``."""
        W = H @ self.QinvV.T
        d, lam = self.d, self.lam
        kappa = np.full((len(H), 1), 1 / math.sqrt(self.eps))
        for _ in range(TOKEN_STEPS):
            X = self._x(H, W, kappa)
            dX = -np.real((W / (1 + kappa * lam) ** 2) @ self.UQ.T)
            q = np.mean(X * X, axis=1, keepdims=True) + self.eps
            g = kappa - q ** -0.5
            dg = 1 + q ** -1.5 * np.sum(X * dX, axis=1, keepdims=True) / d
            step = g / dg
            kappa = np.clip(kappa - step, 1e-3 * kappa, 1 / math.sqrt(self.eps))
            if np.max(np.abs(step) / kappa) < 1e-15:
                break
        X = self._x(H, W, kappa)
        bad = self._miss(X, kappa) > 1e-12
        if np.any(bad):  # Newton left the bracket: bisection, g(0) < 0 < g(1/√ε) (poles keep g > 0)
            Hb, Wb = H[bad], W[bad]
            lo, hi = np.zeros((len(Wb), 1)), np.full((len(Wb), 1), 1 / math.sqrt(self.eps))
            for _ in range(80):
                mid = (lo + hi) / 2
                Xm = self._x(Hb, Wb, mid)
                neg = mid < 1 / np.sqrt(np.mean(Xm * Xm, axis=1, keepdims=True) + self.eps)
                lo, hi = np.where(neg, mid, lo), np.where(neg, hi, mid)
            X[bad] = self._x(Hb, Wb, lo)
            kappa[bad] = lo
        low = kappa[:, 0] * math.sqrt(self.eps) < SCAN_BELOW
        if np.any(low):
            X[low], kappa[low] = self._largest_root(H[low], W[low], kappa[low])
        miss = self._miss(X, kappa)
        X = self._refine(H, X)
        if np.any(miss > 1e-10):
            raise RecoveryError(f"no single token reaches the asked FFN input through the first sublayer (the "
                                f"norm's scale equation missed by {miss.max():.1e})")
        return X

    def _largest_root(self, H: np.ndarray, W: np.ndarray, kappa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The largest root ``κ`` of ``g(κ) = κ − 1/√(mean x(κ)² + ε)`` above the found one (the smallest token): the
        scale equation has several roots where ``M'`` has eigenvalues below ``−√ε``, and a large token cancelled by
        its own attention (``x ≈ −M' n1(x)``) loses its answer's digits to rounding (d = 64: 5.8e-10 against
        3.1e-12 at the larger root, measured). ``g`` on :data:`SCAN_POINTS` log-spaced points between the found root and
        ``1/√ε``, then bisection on the topmost sign change."""
        top = 1 / math.sqrt(self.eps)
        out = kappa[:, 0].copy()
        t = np.linspace(0, 1, SCAN_POINTS)
        for at in range(0, len(W), SCAN_CHUNK):  # rows in chunks: (rows, points, d) complex at a time
            h, w, k0 = H[at:at + SCAN_CHUNK], W[at:at + SCAN_CHUNK], out[at:at + SCAN_CHUNK]
            ks = k0[:, None] * (top / k0[:, None]) ** t[None]  # log-spaced: the roots crowd at small κ
            g = ks - 1 / np.sqrt(self._mean_square(h[:, None], w[:, None], ks[..., None]) + self.eps)
            change = np.sign(g[:, 1:]) != np.sign(g[:, :-1])
            j = SCAN_POINTS - 2 - np.argmax(change[:, ::-1], axis=1)  # the topmost sign change per row
            has = change.any(axis=1) & (j > 0)
            r = np.arange(len(w))
            lo, hi, neg = ks[r, j], ks[r, j + 1], g[r, j] < 0
            for _ in range(60):
                mid = (lo + hi) / 2
                gm = mid - 1 / np.sqrt(self._mean_square(h, w, mid[:, None]) + self.eps)
                up = (gm < 0) == neg
                lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
            out[at:at + SCAN_CHUNK] = np.where(has, lo, k0)
        return self._x(H, W, out[:, None]), out[:, None]

    def _residual(self, H: np.ndarray, X: np.ndarray) -> np.ndarray:
        """``h − (x + M' x/√(mean x² + ε))`` per row."""
        k = 1 / np.sqrt(np.mean(X * X, axis=1, keepdims=True) + self.eps)
        return H - X - k * ((X @ self.Vt.T) @ self.U.T)

    def _refine(self, H: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Newton's method on the d equations ``x + M' n1(x) = h`` from the scale equation's root: the root of that
        scalar equation fixes ``x`` to ~1e-11 of ``h`` only where the map is near a fold (``x`` several times ``h``,
        its attention cancelling it; d = 128: the FFN oracle 9e-12 → 1e-12 off, measured). The Jacobian ``I + κM' −
        (κ³/d) M'x xᵀ`` is a rank-(r + 1) update of the identity: each step solves (r + 1) × (r + 1) systems
        (Woodbury). Rows are kept at their best residual over :data:`REFINE_STEPS` steps."""
        d, r = self.d, self.B.shape[0]
        R = self._residual(H, X)
        best = np.linalg.norm(R, axis=1)
        for _ in range(REFINE_STEPS):
            k = 1 / np.sqrt(np.mean(X * X, axis=1) + self.eps)
            p, ux = X @ self.Vt.T, X @ self.U
            c3 = k**3 / d
            S = np.zeros((len(X), r + 1, r + 1))
            S[:, :r, :r] = np.eye(r) + k[:, None, None] * self.B
            S[:, :r, r] = -c3[:, None] * (p @ self.B.T)
            S[:, r, :r] = k[:, None] * ux
            S[:, r, r] = 1 - c3 * np.sum(ux * p, axis=1)
            rhs = np.concatenate([R @ self.Vt.T, np.sum(X * R, axis=1, keepdims=True)], axis=1)
            c = np.linalg.solve(S, rhs[..., None])[..., 0]
            step = R - k[:, None] * (c[:, :r] @ self.U.T) + (c3 * c[:, r])[:, None] * (p @ self.U.T)
            trial = X + step
            R_new = self._residual(H, trial)
            norm = np.linalg.norm(R_new, axis=1)
            better = norm < best
            X, R = np.where(better[:, None], trial, X), np.where(better[:, None], R_new, R)
            best = np.minimum(norm, best)
        return X

    def _x(self, h: np.ndarray, w: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The token ``x(κ) = (I + κM')⁻¹ h = h − Re(UQ (κ w/(1 + κλ)))`` for rows ``h`` with coordinates ``w = Q⁻¹Vᵀh``
        at scales ``k`` (broadcast): on ``M'``'s range only (its null space passes ``h`` unchanged), so the rounding is
        that of ``h`` and of an r-dimensional eigenbasis, not of a d-dimensional one with a degenerate zero eigenvalue
        (GQA: rank ``G·d_h`` < d; 1e-11 off with the full eigenbasis at d = 128, measured)."""
        return h - np.real((w * (k / (1 + k * self.lam))) @ self.UQ.T)

    def _mean_square(self, h: np.ndarray, w: np.ndarray, k: np.ndarray) -> np.ndarray:
        """``mean x(κ)²`` (:meth:`_x`)."""
        return np.mean(self._x(h, w, k) ** 2, axis=-1)

    def _miss(self, X: np.ndarray, kappa: np.ndarray) -> np.ndarray:
        """Per row, how far the tokens ``X`` at scales ``kappa (B, 1)`` miss the norm's scale equation."""
        return np.abs(kappa[:, 0] * np.sqrt(np.mean(X * X, axis=1) + self.eps) - 1)

    def __call__(self, V: np.ndarray) -> np.ndarray:
        V = np.asarray(V, dtype=np.float64)
        if V.ndim != 3 or V.shape[1] != 1:
            raise ConfigError(f"the FFN oracle reads length-1 rows (B, 1, d); got {V.shape}", param="inputs")
        H = inverse_norm(V[:, 0], self.eps)
        X = self.token_for(H)
        return first_rows(self.answer_rows, X[:, None, :]) - H


class AttentionThroughBlock:
    """Rows ``Z (B, N, d)`` of rms below 1, the last (the query) of rms :attr:`query_rms` (just below 1) ↦
    ``A_N(Z) (B, d)``: the attention's last row on normalised rows (module docstring). Every row goes in through the
    norm's inverse, so the query as ``x_N ≈ T z_N`` with ``T`` = :data:`QUERY_DRIVE`; then ``y_N − x_N =
    a + F(n2(x_N + a))`` is the identity plus a map of slope ``~1/T`` in ``a``: a fixed point, given the learned
    FFN ``ffn`` (``v ↦ F(w2 ⊙ v)``, a :class:`~attnprobe.models.gated_ffn.GatedFFN`). With ``value_map`` (``M'``)
    the learned FFN's error at each query is measured and taken off (:meth:`_ffn_offsets`): without it that error
    (2e-10 at d = 64) comes into every answer as a per-query shift the RoPE learner's sketches read as keys' weights
    (answers 2e-9 off, its rotation fit refused); with it the answers are 2e-10 off and the attention comes out
    (measured, docs/block.md)."""

    def __init__(self, answer_rows, ffn, eps: float, d: int, value_map: np.ndarray | None = None):
        self.answer_rows, self.ffn, self.eps, self.d = answer_rows, ffn, float(eps), d
        self.query_rms = QUERY_DRIVE / math.sqrt(QUERY_DRIVE**2 + self.eps)
        self.value_map = None if value_map is None else np.asarray(value_map, dtype=np.float64)
        self._offsets: dict[bytes, np.ndarray] = {}

    def _F(self, Hs: np.ndarray) -> np.ndarray:
        """``F(n2(h))`` for rows ``h``."""
        return self.ffn.forward(Hs / np.sqrt(np.mean(Hs * Hs, axis=1, keepdims=True) + self.eps))

    def _ffn_offsets(self, Xq: np.ndarray, single: np.ndarray | None = None) -> np.ndarray:
        """Per driven-out query row ``x_N`` (B, d), the learned FFN's error at the query: the single token ``[x_N]``
        attends to itself alone, ``a₁ = M' n1(x_N)`` (the value map), so its answer gives the true
        ``F(n2(x_N + a₁)) = y − x_N − a₁`` and ``e = F̂(n2(x_N + a₁)) − F(n2(x_N + a₁))``. One single-token query per
        distinct query row (kept across calls; ``single``: the rows' single-token answers when already asked);
        zeros without ``value_map``."""
        if self.value_map is None:
            return np.zeros_like(Xq)
        keys = [row.tobytes() for row in Xq]
        new = {k: i for i, k in enumerate(keys) if k not in self._offsets}
        if new:
            U = Xq[list(new.values())]
            y = single[list(new.values())] if single is not None else first_rows(self.answer_rows, U[:, None, :])
            a1 = (U / np.sqrt(np.mean(U * U, axis=1, keepdims=True) + self.eps)) @ self.value_map.T
            e = self._F(U + a1) - (y - U - a1)
            self._offsets.update(zip(new, e))
        return np.stack([self._offsets[k] for k in keys])

    def __call__(self, Z: np.ndarray) -> np.ndarray:
        Z = np.asarray(Z, dtype=np.float64)
        if Z.ndim != 3 or Z.shape[2] != self.d:
            raise ConfigError(f"the attention oracle reads (B, N, {self.d}) rows; got {Z.shape}", param="inputs")
        q = np.sqrt(np.mean(Z[:, -1] ** 2, axis=1))
        if np.any(np.abs(q / self.query_rms - 1) > 1e-9):
            raise ConfigError(f"the attention oracle's queries (last rows) must have rms {self.query_rms:.15f} (the "
                              f"norm fixes their scale); got rms {q.min():.3g} … {q.max():.3g}", param="inputs")
        X = np.concatenate([inverse_norm(Z[:, :-1], self.eps), Z[:, -1:] * QUERY_DRIVE / self.query_rms], axis=1)
        xq = X[:, -1]
        y = np.asarray(self.answer_rows(X), dtype=np.float64)[:, -1]
        r = y - xq
        off = self._ffn_offsets(xq, y if X.shape[1] == 1 else None)
        a = r - self._F(xq + r) + off
        last = np.inf
        for _ in range(NEWTON_STEPS):  # until the change stops shrinking (rounding) below NEWTON_TOL·… or is 0
            new = r - self._F(xq + a) + off
            moved = np.max(np.abs(new - a)) / max(float(np.max(np.abs(r))), 1e-300)
            a = new
            if moved <= NEWTON_TOL or (moved < 1e-13 and moved >= last):
                break
            last = moved
        else:
            raise RecoveryError(f"the attention's share of the answers did not separate from the FFN's (the fixed "
                                f"point still moved by {moved:.1e}): the learned FFN does not describe the block")
        return a
