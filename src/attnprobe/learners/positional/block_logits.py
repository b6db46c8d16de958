"""RoPE heads' query and key maps block by block of the input's coordinates (docs/positional.md, "The every-row
route at LLaMA-3-8B's size"): the every-row route's absolute-logit fit (:mod:`.absolute_logits`) on tokens
supported on a block ``S`` of coordinates, whose logits involve only ``W_Q[:, S]`` and ``W_K[:, S]``.

The fit on the whole input forms a ``(d·d_h)²`` normal matrix per head and half-step (8.6 GB at d = 256, d_h = 128);
on a block of ``s`` coordinates it is ``(s·d_h)²``. Each block's maps come out in their own gauge: a RoPE score
``(W_Q x)ᵀ R(δ) (W_K x)`` is unchanged by ``W_Q,p → A_p W_Q,p``, ``W_K,p → A_p⁻ᵀ W_K,p`` on each rotated pair ``p``
with ``A_p = a I + b J`` (a scaled rotation: the commutant of ``R(δ)``), one ``A_p`` per key/value group. Every block
holds the same ``anchor`` coordinates, so each block's gauge is read against the first block's on them — per pair,
``A Xq = Yq`` (the group's heads' query columns) and ``Aᵀ Yk = Xk`` (the key columns), linear in ``(a, b)``
(:func:`pair_gauges`) — and the blocks' maps assembled in one gauge (:func:`block_logit_maps`).
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError


class BlockOracle:
    """An every-row oracle restricted to the coordinates ``coords``: tokens of ``len(coords)`` numbers placed there,
    zeros elsewhere (the answers, the query count and the precision are the oracle's)."""

    def __init__(self, oracle, coords: np.ndarray):
        self.oracle, self.coords, self.d = oracle, np.asarray(coords), len(coords)

    @property
    def precision(self) -> str:
        return self.oracle.precision

    def answer_rows(self, X: np.ndarray) -> np.ndarray:
        full = np.zeros(np.shape(X)[:-1] + (self.oracle.d,))
        full[..., self.coords] = X
        return self.oracle.answer_rows(full)


def block_coordinates(d: int, block: int, anchor: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The input's coordinates in blocks of ``block``: ``anchor`` random coordinates shared by every block, the rest
    cut among the blocks (the last one topped up from the others so that every block has ``block``)."""
    if not 0 < anchor < block <= d:
        raise ConfigError(f"blocks need 0 < anchor < block <= d; got anchor {anchor}, block {block}, d {d}",
                          param="block")
    order = rng.permutation(d)
    shared, rest = order[:anchor], order[anchor:]
    new = block - anchor
    cuts = [rest[at:at + new] for at in range(0, len(rest), new)]
    if len(cuts[-1]) < new:
        cuts[-1] = np.concatenate([cuts[-1], rest[:new - len(cuts[-1])]])
    return [np.concatenate([shared, c]) for c in cuts]


def _pairs(dh: int) -> list[tuple[int, int]]:
    """The rotated pairs of the ``half`` layout (coordinates ``p`` and ``p + d_h/2``)."""
    return [(p, p + dh // 2) for p in range(dh // 2)]


def _J(X: np.ndarray) -> np.ndarray:
    """``J X`` for the pair's two rows ``X (..., 2, n)`` (``J`` the quarter turn, which commutes with ``R(δ)``)."""
    return np.stack([-X[..., 1, :], X[..., 0, :]], axis=-2)


def pair_gauges(Xq: np.ndarray, Xk: np.ndarray, Yq: np.ndarray, Yk: np.ndarray) -> np.ndarray:
    """Each pair's ``A = a I + b J`` (``(d_h/2, 2)``: ``a, b``) taking one group's maps ``Xq (per, d_h, n)``, ``Xk
    (d_h, n)`` on shared coordinates to ``Yq``, ``Yk``: least squares in ``(a, b)`` over ``A Xq = Yq`` and
    ``Aᵀ Yk = Xk`` (``Aᵀ = a I − b J``), each side weighted by its norm."""
    dh = Xk.shape[0]
    out = np.empty((dh // 2, 2))
    for n, (p, q) in enumerate(_pairs(dh)):
        xq, yq = Xq[:, [p, q]], Yq[:, [p, q]]
        xk, yk = Xk[[p, q]], Yk[[p, q]]
        sq, sk = np.linalg.norm(yq) or 1.0, np.linalg.norm(xk) or 1.0
        D = np.concatenate([np.stack([xq.ravel(), _J(xq).ravel()], 1) / sq,
                            np.stack([yk.ravel(), -_J(yk).ravel()], 1) / sk])
        out[n] = np.linalg.lstsq(D, np.concatenate([yq.ravel() / sq, xk.ravel() / sk]), rcond=None)[0]
    return out


def apply_gauges(Wq: np.ndarray, Wk: np.ndarray, ab: np.ndarray):
    """``W_Q,p → A_p W_Q,p`` (``Wq (per, d_h, s)``, one group's heads) and ``W_K,p → A_p⁻ᵀ W_K,p`` (``Wk (d_h, s)``),
    ``A_p⁻ᵀ = A_p/(a² + b²)``."""
    Wq, Wk = Wq.copy(), Wk.copy()
    for (a, b), (p, q) in zip(ab, _pairs(Wk.shape[0])):
        xq, xk = Wq[:, [p, q]], Wk[[p, q]]
        Wq[:, [p, q]] = a * xq + b * _J(xq)
        Wk[[p, q]] = (a * xk + b * _J(xk)) / (a * a + b * b)
    return Wq, Wk


def slow_gauge(Xq: np.ndarray, Xk: np.ndarray, Yq: np.ndarray, Yk: np.ndarray) -> np.ndarray:
    """A general ``A (m, m)`` on the slow pairs' ``m`` coordinates (pairs that barely turn over the offsets read:
    any mixing of them is nearly a gauge) with ``A Xq = Yq`` and ``Aᵀ Yk = Xk`` in least squares (``Xq (per, m, n)``,
    ``Xk (m, n)``), each side weighted by its norm."""
    m = Xk.shape[0]
    xq, yq = np.concatenate(list(Xq), axis=1), np.concatenate(list(Yq), axis=1)
    sq, sk = np.linalg.norm(yq) or 1.0, np.linalg.norm(Xk) or 1.0
    # vec(A X) = (Xᵀ ⊗ I) vec(A), vec(Aᵀ Y) = (Yᵀ ⊗ I) vec(Aᵀ) = (Yᵀ ⊗ I) P vec(A), column-major vec
    P = np.eye(m * m)[np.arange(m * m).reshape(m, m).T.ravel()]
    D = np.concatenate([np.kron(xq.T, np.eye(m)) / sq, np.kron(Yk.T, np.eye(m)) @ P / sk])
    rhs = np.concatenate([yq.T.ravel() / sq, Xk.T.ravel() / sk])
    return np.linalg.lstsq(D, rhs, rcond=None)[0].reshape(m, m).T


def align_block(Wq: np.ndarray, Wk: np.ndarray, ref_q: np.ndarray, ref_k: np.ndarray, anchor: int,
                slow: np.ndarray | None = None):
    """One block's maps ``Wq (H, d_h, s)``, ``Wk (G, d_h, s)`` (their first ``anchor`` columns the shared
    coordinates) in the gauge of ``ref_q (H, d_h, anchor)``, ``ref_k (G, d_h, anchor)``, group by group: a scaled
    rotation per pair (:func:`pair_gauges`), and on the ``slow`` pairs (indices) a general mixing
    (:func:`slow_gauge`)."""
    G = Wk.shape[0]
    per = Wq.shape[0] // G
    dh = Wk.shape[1]
    Wq, Wk = Wq.copy(), Wk.copy()
    coords = np.array([] if slow is None or not len(slow) else np.concatenate([slow, np.asarray(slow) + dh // 2]),
                      dtype=int)
    for g in range(G):
        hs = slice(g * per, (g + 1) * per)
        ab = pair_gauges(Wq[hs, :, :anchor], Wk[g, :, :anchor], ref_q[hs], ref_k[g])
        q, k = apply_gauges(Wq[hs], Wk[g], ab)
        if len(coords):
            A = slow_gauge(Wq[hs][:, coords, :anchor], Wk[g][coords, :anchor], ref_q[hs][:, coords],
                           ref_k[g][coords])
            q[:, coords] = np.einsum("ab,hbs->has", A, Wq[hs][:, coords])
            k[coords] = np.linalg.solve(A.T, Wk[g][coords])
        Wq[hs], Wk[g] = q, k
    return Wq, Wk


def block_logit_maps(oracle, Cb: np.ndarray, Gh: np.ndarray, c, theta: np.ndarray, groups: int,
                     rng: np.random.Generator, *, block: int = 32, anchor: int = 8, sequences: int = 40,
                     tokens: int = 12, rounds: int = 3, scale: float = 1.0, slow_angle: float = 1.0, log=None):
    """``W_Q (H, d_h, d)`` and ``W_K (G, d_h, d)`` block by block (module docstring): per block of
    :func:`block_coordinates`, :func:`~.absolute_logits.absolute_logit_samples` on ``sequences`` sequences of
    ``tokens`` tokens supported on it (entries of size ``scale·√(d/block)``: a block token's logits as large as a
    whole token's), :func:`~.absolute_logits.fit_logit_maps` (``rounds``), then :func:`align_block` to the first
    block's gauge (the pairs turning less than ``slow_angle`` over the sequences' offsets by a general mixing).
    Returns the maps and a dict: blocks, each block's misfit, the largest gauge residual."""
    from attnprobe.learners.positional.absolute_logits import absolute_logit_samples, fit_logit_maps

    H, dh, d = Gh.shape
    if tokens > min(dh, block):
        raise ConfigError(f"a block's tokens must stay independent in every head's {dh} coordinates and the block's "
                          f"{block}: at most {min(dh, block)} tokens; got {tokens}", param="tokens")
    Wq, Wk = np.zeros((H, dh, d)), np.zeros((groups, dh, d))
    misfits = []
    ref = None
    from attnprobe.learners.positional.absolute_logits import LEAD, LENGTH

    slow = np.flatnonzero(np.asarray(theta) * (LENGTH - LEAD) < slow_angle)
    for n, S in enumerate(block_coordinates(d, block, anchor, rng)):
        data = absolute_logit_samples(BlockOracle(oracle, S), Cb, Gh[:, :, S], c, rng, sequences=sequences,
                                      tokens=tokens, scale=scale * np.sqrt(d / block))
        q, k, misfit = fit_logit_maps(data, H, groups, theta, rng, rounds=rounds)
        if ref is None:
            ref = (q[:, :, :anchor], k[:, :, :anchor])
        else:
            q, k = align_block(q, k, *ref, anchor, slow)
        Wq[:, :, S], Wk[:, :, S] = q, k
        Wq[:, :, S[:anchor]], Wk[:, :, S[:anchor]] = ref
        misfits.append(misfit)
        if log is not None:
            log(f"block {n + 1}: misfit {misfit:.2e}")
    return Wq, Wk, {"blocks": len(misfits), "misfits": misfits}
