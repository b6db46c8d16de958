"""A RoPE head's logit matrices ``B(δ) = Qᵀ R(δ) K`` from their values at a few offsets (docs/positional.md).

All ``B(δ)`` share one column space (span of ``Qᵀ``) and one row space (span of ``Kᵀ``). In orthonormal bases
``U, V`` of them, ``M(δ) = Uᵀ B(δ) V = A R(δ) A'`` with ``A, A'`` invertible (d_h × d_h), so
``T = M(δ₂) M(δ₁)⁻¹ = A R(δ₂ − δ₁) A⁻¹`` is similar to the rotation itself: its eigenvalues are
``e^{∓i(δ₂−δ₁)θ_k}`` and the real and imaginary parts of its eigenvectors are ``A``'s columns up to a scaled rotation
of each pair — the only freedom there is, since a scaled rotation of a pair commutes with ``R(δ)``. The angles
measured at one step are refined at far offsets (the angle ``δθ_k`` is read with the pair basis and unwrapped from
the previous estimate), so ``B(δ)`` for every δ follows without error growing with δ.

Separating each frequency's matrices by linear least squares over offsets instead is hopeless: low frequencies look
constant (condition 1e16–1e20 for offsets up to 4096, measured at d_h = 128).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnprobe.errors import RecoveryError

#: an eigenvector turned by less than this at the largest step is static (θ = 0); the lowest RoPE frequency at
#: base 1e4 and d_h = 128 turns 7e-3 over 63 positions; static
#: vectors measured ≤ 1.4e-9 (GPTNeoXAttention, d = 32, float64 answers)
STATIC_ANGLE = 1e-6
#: largest ratio of the static subspace's singular values of ``T_s − I`` to the smallest rotating one's
STATIC_GAP = 1e-4
#: largest departure of the rotation's eigenvalue moduli from 1 (float64 answers; research scripts relax it)
MODULUS = 1e-3


@dataclass(frozen=True)
class RotaryFactors:
    """``B(δ) = Q R(δ) K`` with ``Q (d, d_h)``, ``K (d_h, d)`` and ``theta (d_h/2,)`` descending; ``R`` in the
    rotate-half layout (pair k = coordinates (k, k + d_h/2)); ``fixed`` coordinates past ``2·len(theta)`` are not
    rotated."""

    Q: np.ndarray
    K: np.ndarray
    theta: np.ndarray

    def rotation(self, delta: float) -> np.ndarray:
        r = self.Q.shape[1]
        h = len(self.theta)
        R = np.eye(r)
        c, s = np.cos(delta * self.theta), np.sin(delta * self.theta)
        i = np.arange(h)
        R[i, i], R[i + h, i + h], R[i, i + h], R[i + h, i] = c, c, -s, s
        return R

    def matrix(self, delta: float) -> np.ndarray:
        return self.Q @ self.rotation(delta) @ self.K


def pair_basis(Ts: dict, *, tol: float = 1e-9, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Pair bases ``P (r, r)`` (columns ``a_1..a_h, b_1..b_h``) and angles ``θ (h,)`` descending with
    ``T_s P = P R(s)`` for every step ``s`` of ``Ts`` (step → ``T_s``, similar to the rotation by ``s θ``).

    The ``T_s`` commute and share their eigenvectors; at one small step the low frequencies' eigenvalues crowd
    near 1 (gap ``|θ_k − θ_{k+1}|``, 7e-4 at d_h = 16 and base 1e4) and the eigenvectors come out that much less
    accurate than the matrices. A random combination ``Σ_s w_s T_s`` has eigenvalues spread around the circle by
    the far steps, so its eigenvectors are as accurate as the matrices; each pair's angle is then read from the
    smallest step (its sign fixes the orientation). Refused when the eigenvalues are not on the unit circle."""
    steps = sorted(Ts, key=abs)
    small = steps[0]
    r = Ts[small].shape[0]
    if r % 2:
        raise RecoveryError(f"a head of odd dimension {r} cannot be rotated pairwise")
    w = np.random.default_rng(seed).standard_normal(len(steps))
    _, vecs = np.linalg.eig(sum(wi * Ts[s] for wi, s in zip(w, steps)))
    vecs = vecs / np.linalg.norm(vecs, axis=0)
    lam = np.einsum("ij,ik,kj->j", vecs.conj(), Ts[small], vecs)  # Rayleigh quotients at the smallest step
    if np.max(np.abs(np.abs(lam) - 1)) > MODULUS:
        raise RecoveryError(f"the logit matrices at two offsets are not related by a rotation (eigenvalue moduli "
                            f"{np.abs(lam).min():.3g} … {np.abs(lam).max():.3g}, not 1); the position term is not RoPE")
    # one eigenvector per pair: the eigenvalue e^{i s θ} with s·θ in (0, π) at the smallest step s; eigenvalue-1
    # vectors (θ = 0 at every step, partial rotary's static coordinates) are told from a low frequency at the
    # largest step, where the lowest frequency has turned farthest
    big = steps[-1]
    turn = np.abs(np.angle(np.einsum("ij,ik,kj->j", vecs.conj(), Ts[big], vecs)))
    static = turn < STATIC_ANGLE
    ang = np.angle(lam) * np.sign(small)
    pick = np.flatnonzero((ang > tol) & ~static)
    m = r - 2 * len(pick)
    if int(np.sum(static)) != m or int(np.sum(~static & (ang < -tol))) != len(pick):
        raise RecoveryError(f"{r - 2 * len(pick) - int(np.sum(static))} coordinates of a head neither rotate nor "
                            "stay fixed between offsets (angles π or a conjugate missing); the position term is not "
                            "RoPE")
    theta = ang[pick] / abs(small)
    order = np.argsort(-theta)
    theta, v = theta[order], vecs[:, pick[order]]
    # T v = e^{iφ} v with v = a − i b: T a = cos φ a + sin φ b and T b = −sin φ a + cos φ b, i.e. R(s) on (a, b)
    P = np.concatenate([np.real(v), -np.imag(v)] + ([static_basis(Ts, m)] if m else []), axis=1)
    return P, theta


def static_basis(Ts: dict, m: int) -> np.ndarray:
    """An orthonormal basis ``(r, m)`` of the vectors every ``T_s`` keeps (``T_s v = v``: the coordinates partial
    rotary leaves alone), the last right singular vectors of the stacked ``T_s − I``; refused without a gap below
    them (a frequency too low to tell from zero at these offsets)."""
    r = next(iter(Ts.values())).shape[0]
    _, s, Vt = np.linalg.svd(np.concatenate([T - np.eye(r) for T in Ts.values()]))
    if m < r and s[r - m] > STATIC_GAP * s[r - m - 1]:
        raise RecoveryError(f"the {m} coordinates that do not rotate are not told apart from the rotating ones "
                            f"(singular values {s[r - m - 1]:.1e} and {s[r - m]:.1e}); use farther offsets")
    return Vt[r - m:].T


def refine_angles(theta: np.ndarray, P: np.ndarray, M: dict, K0: np.ndarray) -> np.ndarray:
    """Angles refined at the far offsets of ``M`` (offset → ``M(δ)``): with ``M(δ) ≈ P R(δ) K0``, the pair block of
    ``P⁻¹ M(δ) K0⁺`` is a rotation by ``δθ_k``; read and unwrap from the nearest estimate, offsets in order of
    size, and fit ``θ`` by least squares through every reading."""
    h = len(theta)
    Pi = np.linalg.inv(P)
    K0p = np.linalg.pinv(K0)
    th = theta.copy()
    rows, rhs = [], []
    for delta in sorted(M, key=abs):
        if delta == 0:
            continue
        C = Pi @ M[delta] @ K0p
        i = np.arange(h)
        # block [[c, −s], [s, c]] (up to the pair's scale): angle from the antisymmetric and symmetric parts
        phi = np.arctan2(C[i + h, i] - C[i, i + h], C[i, i] + C[i + h, i + h])
        n = np.round((delta * th - phi) / (2 * np.pi))
        rows.append(delta)
        rhs.append(phi + 2 * np.pi * n)
        D = np.array(rows, dtype=float)
        th = (D @ np.array(rhs)) / (D @ D)
    return th


def factor_rotary(M: dict, U: np.ndarray, V: np.ndarray, first: int, second: int) -> RotaryFactors:
    """``B(δ) = U M(δ) Vᵀ`` for the offsets in ``M`` → :class:`RotaryFactors` (module docstring); ``first`` and
    ``second`` are the two offsets whose ratio gives the pair bases (nearby: their angles below π)."""
    inv = np.linalg.inv(M[first])
    P, theta = pair_basis({delta - first: M[delta] @ inv for delta in M if delta != first})
    f = RotaryFactors(np.eye(P.shape[0]), np.eye(P.shape[0]), theta)
    K0 = fit_keys(P, f, {first: M[first], second: M[second]})  # the near offsets only: θ is not refined yet
    theta = refine_angles(theta, P, M, K0)
    f = RotaryFactors(np.eye(P.shape[0]), np.eye(P.shape[0]), theta)
    K0 = fit_keys(P, f, M)
    return RotaryFactors(U @ P, K0 @ V.T, theta)


def fit_keys(P, f: RotaryFactors, M: dict) -> np.ndarray:
    """The key factor ``K`` of least squares over the offsets in ``M``: ``P R(δ) K ≈ M(δ)`` for every ``δ``,
    with the pair basis ``P`` and the rotations ``R(δ)`` of the angles in ``f``."""
    A = np.concatenate([P @ f.rotation(delta) for delta in M])
    B = np.concatenate([M[delta] for delta in M])
    return np.linalg.lstsq(A, B, rcond=None)[0]
