"""Multi-head attention regressor (paper Sec. 7 and App. C, with the biases of real layers).

``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ (X v_h) + c``: one output row of a real layer at the last position.
App. C: the concatenate-then-project form ``[a⁽¹⁾, …, a⁽ᴴ⁾]ᵀ w_o + b_o`` is this sum with ``W_h = K_hᵀQ_h/√d_h``,
``v_h = V_hᵀ w_o⁽ʰ⁾`` (:meth:`MultiHeadAttention.from_projections`). Heads are only defined up to permutation
(and not at all when two heads share ``W_h, u_h``: Prop. 7.1); :func:`match_heads` compares two models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.attention import (AttentionHead, AttentionParameters, as_batch, real_array)
from attnprobe.models.softmax import softmax_last
from attnprobe.properties import axis_length


@dataclass(frozen=True)
class MultiHeadAttention(AttentionParameters):
    """``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ (X v_h) + c`` with ``W (H, d, d)``, ``v (H, d)``, ``u (H, d)``
    and one scalar ``c`` (the value biases and the output bias of every head summed; it cannot be split
    among heads from queries). ``dtype`` is the precision the forward pass is computed in (as
    :class:`AttentionHead`); answers are returned as float64.

    Vector layout (the whole output row of a real layer): ``v`` of shape (H, K, d) holds each head's
    value-output map ``V_h = W_O[:, h] W_V[h]`` (rank ``d_h``) and ``c`` (K,); then
    ``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ X V_hᵀ + c`` answers (B, K).
    """

    kind: ClassVar[str] = "multi_head"
    DESCRIPTION: ClassVar[str] = "a multi-head model"
    VECTOR_NDIM: ClassVar[int] = 3

    def __post_init__(self) -> None:
        W = real_array("W", self.W)  # real, finite numbers; the shapes are checked below
        v = real_array("v", self.v)
        if v.ndim not in (2, 3) or min(v.shape) < 1:
            raise ConfigError(f"v must have shape (H, d) or (H, K, d) with H, K, d >= 1; got {v.shape}", param="v")
        H, d = v.shape[0], v.shape[-1]
        if W.shape != (H, d, d):
            raise ConfigError(f"W must have shape (H, d, d) = ({H}, {d}, {d}) to match v of shape {v.shape}; "
                              f"got {W.shape}", param="W")
        u = np.zeros((H, d)) if self.u is None else real_array("u", self.u)
        if u.shape != (H, d):
            raise ConfigError(f"u must have shape (H, d) = ({H}, {d}); got {u.shape}", param="u")
        self._store(W, v, u)

    # ----------------------------------------------------------------------------------------------- shape
    H = axis_length("v", 0, "The heads.")
    d = axis_length("v", -1, "The input width.")

    @staticmethod
    def unknowns(d: int, H: int, bias: bool = True, outputs: int = 1) -> int:
        """Degrees of freedom of the parametrisation with K = ``outputs``: ``H(d² + d + Kd) + K`` with biases
        (``H(d² + 2d) + 1`` for one output), ``H(d² + Kd)`` without."""
        K = int(outputs)
        return H * (d * d + d + K * d) + K if bias else H * (d * d + K * d)

    @staticmethod
    def low_rank_unknowns(d: int, H: int, head_dim: int, outputs: int, bias: bool = True) -> int:
        """Degrees of freedom when every ``W_h`` and ``V_h`` has rank ``head_dim`` (r): ``H(2dr − r²)`` for the
        W_h, ``H(r(d + K) − r²)`` for the V_h, plus ``Hd + K`` biases; divided by K it is the fewest queries
        that can determine a layer answering K numbers per query."""
        r, K = int(head_dim), int(outputs)
        return H * (2 * d * r - r * r) + H * (r * (d + K) - r * r) + (H * d + K if bias else 0)

    @staticmethod
    def query_bound(d: int, H: int) -> int:
        """``4Hd² − 2H + 1``: the value-query count of the generic multi-head learner (arXiv 2608.03294)."""
        return 4 * H * d * d - 2 * H + 1

    # ------------------------------------------------------------------------------------------ conversions
    def head(self, h: int, with_c: bool | None = None) -> AttentionHead:
        """Head ``h`` alone as an :class:`AttentionHead`. The shared ``c`` goes to head 0 (``with_c=None``),
        so ``Σ_h head(h)(X) == self(X)``; ``with_c`` forces it on or off."""
        if not 0 <= h < self.H:
            raise ConfigError(f"head index must be in 0..{self.H - 1}; got {h}", param="h")
        keep = (h == 0) if with_c is None else bool(with_c)
        return AttentionHead(self.W[h], self.v[h], self.u[h], self.c if keep else 0.0 * np.asarray(self.c),
                             self.dtype)

    def heads(self) -> list[AttentionHead]:
        return [self.head(h) for h in range(self.H)]

    @classmethod
    def from_projections(cls, Q, K, V, w_o, b_o: float = 0.0, b_Q=None, b_K=None, b_V=None, *,
                         scale: float | None = None, dtype: str = "float64") -> "MultiHeadAttention":
        """The concatenate-then-project layer of App. C, read at the last position, as the sum form.

        ``Q, K, V`` have shape ``(H, d_h, d)`` (per-head projections acting on row vectors: ``q = Q_h x + b_Q``),
        ``w_o`` (``H·d_h``,) is one row of the output projection over the concatenated heads, ``b_o`` its bias.
        Then ``W_h = s K_hᵀQ_h``, ``u_h = s K_hᵀ b_Q,h`` (key biases shift all scores of a head equally and
        cancel in the softmax), ``v_h = V_hᵀ w_o⁽ʰ⁾``, ``c = Σ_h b_V,h·w_o⁽ʰ⁾ + b_o``; ``s = 1/√d_h`` by default.

        The whole output row: ``w_o`` of shape ``(K, H·d_h)`` (the output projection ``W_O``) and ``b_o`` (K,)
        give the vector layout ``V_h = W_O[:, h] V_h`` (K × d) and ``c = W_O b_V + b_o``.
        """
        Q, K, V = (np.asarray(a, dtype=np.float64) for a in (Q, K, V))
        if Q.ndim != 3 or K.shape != Q.shape or V.shape != Q.shape:
            raise ConfigError(f"Q, K, V must all have shape (H, d_h, d); got {Q.shape}, {K.shape}, {V.shape}",
                              param="Q")
        H, dh, d = Q.shape
        w = np.asarray(w_o, dtype=np.float64)
        whole = w.ndim == 2
        if whole and w.shape[1] != H * dh:
            raise ConfigError(f"w_o must have shape (K, H·d_h) = (K, {H * dh}) for the whole output row; "
                              f"got {w.shape}", param="w_o")
        w = w.reshape(-1) if not whole else w
        if not whole and w.shape != (H * dh,):
            raise ConfigError(f"w_o must have length H·d_h = {H * dh}; got {w.shape}", param="w_o")
        zeros = np.zeros((H, dh))
        bQ = zeros if b_Q is None else np.asarray(b_Q, dtype=np.float64).reshape(H, dh)
        bV = zeros if b_V is None else np.asarray(b_V, dtype=np.float64).reshape(H, dh)
        # b_K is accepted for completeness: it adds q·b_K to every score of a head and cancels in the softmax
        s = 1.0 / np.sqrt(dh) if scale is None else float(scale)
        W = s * np.einsum("hkd,hke->hde", K, Q)
        u = s * np.einsum("hkd,hk->hd", K, bQ)
        if whole:
            WO = w.reshape(w.shape[0], H, dh)  # (K, H, d_h)
            v = np.einsum("khj,hjd->hkd", WO, V)
            c = WO.reshape(w.shape[0], -1) @ bV.reshape(-1) + np.broadcast_to(np.asarray(b_o, float), w.shape[:1])
            return cls(W, v, u, c, dtype)
        w = w.reshape(H, dh)
        v = np.einsum("hkd,hk->hd", V, w)
        c = float(np.sum(bV * w) + float(b_o))
        return cls(W, v, u, c, dtype)

    def with_dtype(self, dtype: str) -> "MultiHeadAttention":
        return MultiHeadAttention(self.W, self.v, self.u, self.c, dtype)

    def permuted(self, perm) -> "MultiHeadAttention":
        """The same function with heads reordered: head ``i`` of the result is head ``perm[i]`` of this one."""
        perm = np.asarray(perm, dtype=int)
        if sorted(perm.tolist()) != list(range(self.H)):
            raise ConfigError(f"perm must be a permutation of 0..{self.H - 1}; got {perm.tolist()}", param="perm")
        return MultiHeadAttention(self.W[perm], self.v[perm], self.u[perm], self.c, self.dtype)

    # ---------------------------------------------------------------------------------------------- forward
    def _forward(self, X: np.ndarray):
        p = self._params()
        Xc = as_batch(X, self.d).astype(p["dt"])
        H, d = p["W"].shape[:2]
        q = Xc[:, -1, :] @ p["W"].reshape(H * d, d).T  # W_h x_N for every head, one BLAS product: (B, H·d)
        scores = np.matmul(Xc, q.reshape(-1, H, d).transpose(0, 2, 1)) + Xc @ p["u"].T  # (B, N, H)
        return Xc, softmax_last(scores.transpose(0, 2, 1)), p

    def attention(self, X: np.ndarray) -> np.ndarray:
        """Attention weights of every head, shape (B, H, N)."""
        return self._forward(X)[1]

    def head_outputs(self, X: np.ndarray) -> np.ndarray:
        """Each head's contribution ``α_hᵀ X v_h`` (without ``c``), shape (B, H), or (B, H, K) in the vector
        layout, as float64."""
        Xc, alpha, p = self._forward(X)
        ctx = np.matmul(alpha, Xc)  # α_hᵀ X per head: (B, H, d)
        if self.vector:
            return np.einsum("bhd,hkd->bhk", ctx, p["v"], optimize=True).astype(np.float64)
        return np.einsum("bhd,hd->bh", ctx, p["v"]).astype(np.float64)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        Xc, alpha, p = self._forward(X)
        ctx = np.matmul(alpha, Xc)  # (B, H, d)
        B, H, d = ctx.shape
        if self.vector:
            out = ctx.reshape(B, H * d) @ p["v"].transpose(0, 2, 1).reshape(H * d, -1) + p["c"]
        else:
            out = ctx.reshape(B, H * d) @ p["v"].reshape(H * d) + p["c"]
        return out.astype(np.float64)


@dataclass(frozen=True)
class HeadMatch:
    """Heads of ``got`` matched to heads of ``true`` (Hungarian assignment on relative parameter distances).

    ``perm[h]`` is the index in ``got`` of the head matched to true head ``h`` (-1 if unmatched, when ``got``
    has fewer heads). ``W``, ``v``, ``u`` are per-true-head relative errors (inf when unmatched); ``worst`` is
    the largest relative error over every matched head and parameter; ``c`` the error of the shared bias.
    """

    perm: np.ndarray
    W: np.ndarray
    v: np.ndarray
    u: np.ndarray
    c: float

    @property
    def head_error(self) -> np.ndarray:
        """Per true head: the largest of its W, v, u relative errors."""
        return np.maximum(np.maximum(self.W, self.v), self.u)

    @property
    def worst(self) -> float:
        return float(self.head_error.max()) if self.head_error.size else 0.0

    def as_dict(self) -> dict:
        return {"perm": self.perm.tolist(), "W": self.W.tolist(), "v": self.v.tolist(), "u": self.u.tolist(),
                "c": self.c, "worst": self.worst}


def _rel(a: np.ndarray, b: np.ndarray, axes) -> np.ndarray:
    """‖a − b‖/‖b‖ over ``axes`` (absolute where ‖b‖ = 0)."""
    num = np.sqrt(np.sum((a - b) ** 2, axis=axes))
    den = np.sqrt(np.sum(b ** 2, axis=axes))
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), num)


def match_heads(true: MultiHeadAttention, got: MultiHeadAttention) -> HeadMatch:
    """Match the heads of ``got`` to those of ``true`` up to permutation (``scipy.optimize.linear_sum_assignment``
    on the sum of relative ``W`` and ``v`` distances) and report per-head relative errors of W, v and u."""
    from scipy.optimize import linear_sum_assignment

    if true.d != got.d:
        raise ConfigError(f"cannot compare models of widths {true.d} and {got.d}", param="got")
    if true.v.shape[1:] != got.v.shape[1:]:
        raise ConfigError(f"cannot compare value layouts {true.v.shape[1:]} and {got.v.shape[1:]} (one output vs "
                          "K outputs, or different K)", param="got")
    dW = _rel(got.W[None, :], true.W[:, None], (2, 3))  # (H_true, H_got)
    dv = _rel(got.v[None, :], true.v[:, None], tuple(range(2, got.v.ndim + 1)))
    du = _rel(got.u[None, :], true.u[:, None], 2)
    rows, cols = linear_sum_assignment(dW + dv)
    perm = -np.ones(true.H, dtype=int)
    perm[rows] = cols
    errs = []
    for D in (dW, dv, du):
        e = np.full(true.H, np.inf)
        e[rows] = D[rows, cols]
        errs.append(e)
    c_err = float(_rel(np.asarray(got.c), np.asarray(true.c), None))
    return HeadMatch(perm, errs[0], errs[1], errs[2], float(c_err))
