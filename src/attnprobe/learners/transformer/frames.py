"""A multi-head transformer seen as a multi-head attention layer, inside one linear region of its FFN.

Once the FFN ``z ↦ w_oᵀReLU(Cz + b) + c`` of the length-1 queries is known (rows ``c_k`` of C: neuron directions
in token space), ``TF(X) = Gᵀ ã(X) + κ`` wherever ``ã(X)`` (the attention output in the length-1 frame, where
``ã([x]) = x``) stays in the region S of a base point ``z``: ``G = Σ_{k∈S} c_k w_kᵀ``, ``κ = Σ_{k∈S} b_k w_k + c``.
Tokens ``z + s·x'`` keep ``ã`` within ``s·max‖x'‖·Σ_h‖Ṽ_h‖`` of ``z`` (softmax weights are convex), and

    f(X') = (rᵀ(TF(z + sX') − κ) − gᵀz) / s = Σ_h softmax(X'(s²W_h)x'_N + X' s(W_h z + u_h))ᵀ X'(Ṽ_hᵀg) + x'_Nᵀ r₀

with ``g = G r``: a scalar multi-head oracle with scaled scores, value vectors ``Ṽ_hᵀg`` and (residual blocks)
the last-token term ``r₀ = g − Σ_h Ṽ_hᵀg``. :class:`Frame` is that oracle; :func:`frame_values` finds its value
vectors from one saturated half circle (App. C's two-row form, every logit ≫ 40).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnprobe.errors import RecoveryError, SaturationError, UnidentifiableError
from attnprobe.learners.multihead.saturation import Circle, cone_gradients, find_crossings
from attnprobe.oracles.base import Oracle


@dataclass(frozen=True)
class KnownFFN:
    """The FFN as the length-1 queries show it: ``C (m, d)`` neuron rows, biases ``b (m,)``, weights
    ``w (m, K)``, output bias ``c (K,)``; ``scalar``: the oracle answers (B,)."""

    C: np.ndarray
    b: np.ndarray
    w: np.ndarray
    c: np.ndarray
    scalar: bool

    @classmethod
    def from_net(cls, net) -> "KnownFFN":
        w = net.w_o.reshape(net.m, -1)
        return cls(net.A.T.copy(), net.b.copy(), w, np.asarray(net.c, dtype=np.float64).reshape(-1),
                   net.w_o.ndim == 1)

    def pattern(self, Z: np.ndarray) -> np.ndarray:
        """Active neurons at points ``Z (n, d)`` (boolean (n, m))."""
        return np.atleast_2d(Z) @ self.C.T + self.b > 0

    def margin(self, Z: np.ndarray) -> np.ndarray:
        """Distance of each point to the nearest neuron hyperplane ``c_kᵀz + b_k = 0``."""
        pre = np.atleast_2d(Z) @ self.C.T + self.b
        return np.min(np.abs(pre) / np.linalg.norm(self.C, axis=1), axis=1)

    def linear(self, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``G (d, K)`` and ``κ (K,)`` of the region with ``active`` neurons."""
        G = self.C[active].T @ self.w[active]
        kappa = self.b[active] @ self.w[active] + self.c
        return G, kappa


class Frame:
    """The callable ``X' ↦ (rᵀ(TF(z + sX') − κ) − gᵀz)/s`` of the module docstring (counts nothing itself)."""

    def __init__(self, oracle, ffn: KnownFFN, z: np.ndarray, s: float, r: np.ndarray):
        self.oracle, self.ffn, self.z, self.s, self.r = oracle, ffn, np.asarray(z, float), float(s), r
        self.active = ffn.pattern(self.z)[0]
        G, self.kappa = ffn.linear(self.active)
        self.G = G
        self.g = G @ r  # (d,) for a mix r (K,), (d, K') for a matrix r (K, K')
        self.offset = r.T @ self.kappa + self.g.T @ self.z
        self.__name__ = "transformer in one FFN region"
        self.noise = oracle.noise

    def tokens(self, X: np.ndarray) -> np.ndarray:
        return self.z + self.s * np.asarray(X, dtype=np.float64)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        y = np.asarray(self.oracle(self.tokens(X)), dtype=np.float64).reshape(len(X), -1)
        return (y @ self.r - self.offset) / self.s  # (B,) for a mix, (B, K') for a matrix


def frame_oracle(oracle, ffn: KnownFFN, z, s: float, r, answer_scale: float) -> Oracle:
    """:class:`Frame` as an :class:`Oracle` (its queries count on ``oracle``, within its budget). Its ``eps`` is
    the rounding of ``TF(z)`` relative to answers of size ``answer_scale`` (the subtraction of ``κ + gᵀz`` keeps the
    absolute rounding of the large answers near z)."""
    fn = Frame(oracle, ffn, z, s, r)
    budget = None if oracle.budget is None else int(oracle.remaining)
    out = Oracle(fn, oracle.d, budget=budget, precision=oracle.precision, name=f"{oracle.name}[one FFN region]")
    size = float(np.max(np.abs(fn.offset)) + np.max(np.abs(r.T) @ np.abs(fn.kappa))
                 + np.linalg.norm(fn.g) * np.linalg.norm(z))
    fn.rounding = oracle.eps * size / fn.s  # absolute rounding of the frame's answers
    set_scale(out, answer_scale)
    return out


def set_scale(frame, answer_scale: float) -> None:
    """Set a frame oracle's ``eps`` for answers of size ``answer_scale`` (its rounding is absolute)."""
    frame.eps_floor = max(frame.fn.oracle.eps, frame.fn.rounding / max(answer_scale, 1e-300))


def heads_sum(oracle, scale: float) -> np.ndarray:
    """``Σ_h v_h`` exactly from ``F(w) − F(−w) = Σ_h wᵀv_h`` (σ(t) + σ(−t) = 1) at ``w = ±scale·e_i``: 2d queries.
    With a residual block it differs from the length-1 gradient by the last-token term."""
    d = oracle.d
    X = np.zeros((2 * d, 2, d))
    X[:d, 0] = scale * np.eye(d)
    X[d:, 0] = -scale * np.eye(d)
    y = oracle(X)
    return (y[:d] - y[d:]) / scale  # (d,) or (d, K') for vector answers


@dataclass
class FrameValues:
    """Value vectors ``v (H, d)`` of a frame's heads, the circle they were read on and its crossings."""

    v: np.ndarray
    z0: np.ndarray
    z1: np.ndarray
    radius: float
    crossings: np.ndarray  # θ of each head's crossing, in the order of v
    signs: np.ndarray  # +1: the head switches on at its crossing, −1: off
    details: dict


def frame_values(oracle, v_heads: np.ndarray, rng, *, T: float, grid: int = 8, resolution: float = 1e-7,
                 plane: np.ndarray | None = None, max_crossings: int | None = None,
                 sign_tol: float = 1e-6) -> FrameValues:
    """Every head's value vector on one saturated half circle of radius ``T`` (as the generic multi-head learner's
    first stage, :mod:`attnprobe.learners.multihead.saturation`, with last token 0 and the radius chosen by the
    caller). ``plane``: an orthonormal (d, k ≥ 2) basis the circle is drawn in (default all of R^d);
    ``sign_tol``: how far the cone gradients may be from a 0/−1 combination of the jumps."""
    d = oracle.d
    basis = np.eye(d) if plane is None else plane
    Z = basis @ np.linalg.qr(rng.standard_normal((basis.shape[1], 2)))[0]
    base = float(oracle(np.zeros((1, 2, d)))[0])
    gain = float(np.linalg.norm(v_heads))
    # with every head off F is 0 (no residual): a shift s = Σ_h v_h keeps every cone's label away from 0; the
    # cone opposite ĝ = g + s then has ĝ' = (Σ_h v_h − g) + s = 3s − ĝ
    circle = Circle(oracle, np.zeros_like(Z[:, 0]), Z[:, 0], Z[:, 1], base, 2 * gain,
                    tol=max(1e-7, 1e5 * oracle.eps), shift=v_heads)
    closing = 3 * v_heads
    cross, scale = find_crossings(circle, T, closing, grid, resolution, max_crossings=max_crossings)
    if cross.size == 0:
        raise UnidentifiableError("the saturated answers are linear in the probe: no head's attention depends on it")
    lo = np.concatenate([[cross[-1] - np.pi], cross[:-1]])
    qbasis = np.linalg.qr(rng.standard_normal((d, d)))[0].T
    grads, _ = cone_gradients(circle, lo, cross, T, qbasis, oracle.eps, tries=12,
                              refusal="the probe leaves the FFN region, or two heads' logits are too close")
    floor = max(1e-6, 1e5 * oracle.eps) * float(np.max(np.linalg.norm(grads, axis=1)))
    merged, real = [grads[0]], []  # crossing j separates cone j from cone j + 1; equal gradients: spurious
    for j, g in enumerate(grads[1:], start=1):
        if np.linalg.norm(g - merged[-1]) > floor:
            merged.append(g)
            real.append(cross[j - 1])
    if len(merged) > 1 and np.linalg.norm(merged[-1] - (closing - merged[0])) <= floor:
        merged[-1] = closing - merged[0]  # the last cone is already the one opposite the first
    else:
        merged.append(closing - merged[0])
        real.append(cross[-1])
    G = np.array(merged) - v_heads  # undo the shift
    J = np.diff(G, axis=0)
    coef, *_ = np.linalg.lstsq(J.T, G[0], rcond=None)
    off = coef < -0.5
    bad = float(np.max(np.abs(np.where(off, coef + 1, coef))))
    if bad > max(sign_tol, 1e5 * oracle.eps):
        raise RecoveryError(f"the cone gradients along the saturated circle are not a sum of per-head value vectors "
                            f"({len(J)} crossings; a coefficient is off 0/−1 by {bad:.1e}): the probes left the FFN "
                            "region, or the target is not a transformer of this form")
    signs = np.where(off, -1.0, 1.0)
    v = signs[:, None] * J
    return FrameValues(v, Z[:, 0], Z[:, 1], T, np.array(real), signs,
                       {"label_scale": scale, "sign_residual": bad, "crossings": len(v)})


def saturated_radius(oracle, rng, *, top: float, shrink: float = 10.0, n_points: int = 16,
                     safety: float = 8.0) -> float:
    """Largest radius ``top/shrink^k`` at which ``F(2w) = 2F(w)`` at random probes, divided by ``safety``.

    Far from the origin every logit is huge, so a failure of homogeneity means that ``2w`` left the FFN region
    (the answers then jump by the other region's offset): the radius shrinks until it stays inside."""
    d = oracle.d
    W = rng.standard_normal((n_points, d))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    base = float(oracle(np.zeros((1, 2, d)))[0])
    T = top
    while T >= top * 1e-9:
        X = np.zeros((2 * n_points, 2, d))
        X[:n_points, 0] = T * W
        X[n_points:, 0] = 2 * T * W
        F = oracle(X) - base
        F1, F2 = F[:n_points], F[n_points:]
        if np.all(np.abs(F2 - 2 * F1) <= 1e-9 * np.abs(F2) + 64 * oracle.fn.rounding):
            return T / safety
        T /= shrink
    raise SaturationError("the answers are not homogeneous in the probe at any radius: the probes leave the FFN "
                          "region before the heads saturate (a target that is not a transformer of this form?)")


def frame_maps(oracle, vals: FrameValues, heads_total: np.ndarray, rng) -> np.ndarray:
    """Every head's map ``Ṽ_hᵀG`` (H, d, K) from a vector-answer frame (``r`` the identity) on the circle where
    :func:`frame_values` found the crossings: the gradient (d, K) of every cone between consecutive crossings,
    the last cone ``Σ_h − first`` (``heads_total``: :func:`heads_sum` of the vector frame), jumps times signs."""
    d = oracle.d
    T = vals.radius
    cross = np.sort(vals.crossings)
    lo = np.concatenate([[cross[-1] - np.pi], cross[:-1]])
    Q = np.linalg.qr(rng.standard_normal((d, d)))[0].T
    scale = max(float(np.linalg.norm(heads_total)), 1e-300)  # a cone's gradient can be 0 (every head off)
    grads = []
    for a, b in zip(lo, cross):
        th = 0.5 * (a + b)
        center = T * (np.cos(th) * vals.z0 + np.sin(th) * vals.z1)
        delta = 0.25 * T * np.sin(0.5 * (b - a))
        for _ in range(12):
            P = np.concatenate([center[None], center + delta * Q, center + (delta / 4) * Q])
            X = np.zeros((len(P), 2, d))
            X[:, 0] = P
            F = np.asarray(oracle(X)).reshape(len(P), -1)
            g1 = Q.T @ ((F[1:d + 1] - F[0]) / delta)
            g4 = Q.T @ ((F[d + 1:] - F[0]) / (delta / 4))
            if np.linalg.norm(g1 - g4) <= 1e-6 * scale:
                break
            delta /= 8
        else:
            raise SaturationError("no step stays inside a saturated cone of the probe circle (vector answers)")
        grads.append(g1)
    grads.append(heads_total.reshape(d, -1) - grads[0])
    G = np.array(grads)  # (H + 1, d, K)
    order = np.argsort(np.argsort(vals.crossings))  # position of each head's crossing among the sorted ones
    J = np.diff(G, axis=0)
    return vals.signs[:, None, None] * J[order]
