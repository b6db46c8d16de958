"""The attention scores ``p_h(y) = W_h y + u_h`` of every head, seen inside FFN regions (transformer learner).

In a :class:`~attnprobe.learners.transformer.frames.Frame` around a base point z, the two-row query
``[b + a; b]`` with a probe ``a ⊥ v_g`` for every other head g (``v_g``: the frame's value vectors) answers
``bᵀg + σ(aᵀp_h(z + b))·aᵀv_h`` (other heads and the residual only see ``b``): head h alone, so the sigmoid
inverts to one exact linear measurement of ``p_h`` on ``S_h = {v_g : g ≠ h}^⊥`` (the isolation of App. C's
two-row form). Last tokens ``b ∈ {0, ρ e_1, …, ρ e_d}`` give ``N_hᵀW_h`` and ``N_hᵀu_h`` (``N_h``: a basis of
S_h); regions with other value vectors give other ``S_h``, and together all of ``W_h, u_h``.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import RecoveryError
from attnprobe.learners.head.sigmoid import RoundingError, invert_two_row

#: probes are scaled so the largest logit is about this (the sigmoid inverts best near 0)
PROBE_LOGIT = 2.0
#: share of the probe along the head's own value direction m_h (the rest along one basis vector of S_h)
ZETA = 0.5


def isolating_basis(v: np.ndarray, h: int) -> np.ndarray:
    """Orthonormal basis ``N_h`` (d × (d − H + 1)) of ``{v_g : g ≠ h}^⊥``."""
    others = np.delete(v, h, axis=0)
    d = v.shape[1]
    if others.shape[0] == 0:
        return np.eye(d)
    _, s, Vt = np.linalg.svd(others)
    rank = int(np.sum(s > 1e-10 * s[0]))
    return Vt[rank:].T


def _logits(frame, v_h, B, A, base):
    """Logits of ``[b + a; b]`` for last tokens B (n, d), probes A (n, d) and ``base = f([b; b])`` (measured:
    the learned FFN's errors in ``g`` and in the frame's offset cancel)."""
    X = np.empty((len(A), 2, frame.d))
    X[:, 0] = B + A
    X[:, 1] = B
    y = frame(X)
    return invert_two_row(y, base, base + A @ v_h, RoundingError(frame.eps))


def token_bases(frame, tokens: np.ndarray) -> np.ndarray:
    """``f([b; b])`` for every last token b (one query each)."""
    return frame(np.repeat(tokens[:, None, :], 2, axis=1))


def head_scores(frame, v: np.ndarray, h: int, tokens: np.ndarray, bases: np.ndarray, *, max_probe: float,
                retries: int = 8):
    """``N_hᵀ p_h(z + b)`` for every last token ``b`` (rows of ``tokens``; ``bases``: their :func:`token_bases`)
    from ``(d − H + 2)`` probes each.

    Probes ``a_0 = γ m_h`` and ``a_i = γ(m_h + ζ n_i)`` (``m_h``: the unit part of ``v_h`` in S_h, ``n_i``: the
    columns of N_h); ``n_iᵀp = (ℓ_i − ℓ_0)/(γζ)``. ``γ`` starts at ``max_probe`` (the probes must keep the FFN
    in its region) and shrinks until no weight saturates. Returns ``(N_h, scores (len(tokens), k))``.
    """
    N = isolating_basis(v, h)
    k = N.shape[1]
    m = N @ (N.T @ v[h])
    if np.linalg.norm(m) <= 1e-12 * np.linalg.norm(v[h]):
        raise RecoveryError(f"head {h}'s value vector lies in the span of the others': it cannot be isolated")
    m /= np.linalg.norm(m)
    D = np.concatenate([m[None], m[None] + ZETA * N.T])  # (k + 1, d) probe directions
    gamma = float(max_probe)
    for _ in range(retries + 40):  # calibrate γ at the first token: the scores barely move between tokens
        lg = _logits(frame, v[h], np.repeat(tokens[:1], k + 1, axis=0), gamma * D, bases[0])
        if not np.any(lg.saturated) and np.max(np.abs(lg.values)) <= 4 * PROBE_LOGIT:
            gamma *= min(PROBE_LOGIT / max(np.max(np.abs(lg.values)), 1e-300), max_probe / gamma)
            break
        gamma /= 4.0 if np.any(lg.saturated) else np.max(np.abs(lg.values)) / PROBE_LOGIT
    else:
        raise RecoveryError(f"head {h}: every probe saturates its attention weight")
    n_t = len(tokens)
    out = np.empty((n_t, k))
    todo = np.arange(n_t)
    scale = np.full(n_t, gamma)
    for _ in range(retries):
        Bt = np.repeat(tokens[todo], k + 1, axis=0)
        A = (scale[todo, None, None] * D[None]).reshape(-1, frame.d)
        lg = _logits(frame, v[h], Bt, A, np.repeat(bases[todo], k + 1))
        L = lg.values.reshape(len(todo), k + 1)
        sat = lg.saturated.reshape(len(todo), k + 1).any(axis=1)
        good = ~sat
        out[todo[good]] = (L[good, 1:] - L[good, :1]) / (ZETA * scale[todo[good], None])
        scale[todo[sat]] /= 4.0
        todo = todo[sat]
        if todo.size == 0:
            return N, out
    raise RecoveryError(f"head {h}: {todo.size} last tokens saturate every probe")


def scores_to_parameters(N: np.ndarray, scores: np.ndarray, z: np.ndarray, rho: float):
    """``N_hᵀW_h`` and ``N_hᵀu_h`` from the scores at last tokens ``z + {0, ρe_1, …, ρe_d, −ρe_1, …, −ρe_d}``
    (central differences; the affine fit through all of them gives ``p_h(z)``)."""
    d = z.size
    plus, minus = scores[1:d + 1], scores[d + 1:2 * d + 1]
    NW = (plus - minus).T / (2 * rho)  # (k, d): column i is N_hᵀW_h e_i
    pz = (scores[0] + plus.sum(axis=0) + minus.sum(axis=0)) / (2 * d + 1)  # the mean token is z
    Nu = pz - NW @ z
    return NW, Nu


def combine_rows(parts) -> tuple[np.ndarray, np.ndarray, float]:
    """``W, u`` from ``(N_j, N_jᵀW, N_jᵀu)`` of several regions by least squares; also the smallest singular
    value of the stacked bases (below ~1e-6 the regions do not see every direction of the head's scores)."""
    Ns = np.concatenate([N.T for N, _, _ in parts])  # (Σk, d)
    NW = np.concatenate([x for _, x, _ in parts])
    Nu = np.concatenate([x for _, _, x in parts])
    sv = np.linalg.svd(Ns, compute_uv=False)
    W, *_ = np.linalg.lstsq(Ns, NW, rcond=None)
    u, *_ = np.linalg.lstsq(Ns, Nu, rcond=None)
    return W, u, float(sv[-1]) if sv.size >= Ns.shape[1] else 0.0
