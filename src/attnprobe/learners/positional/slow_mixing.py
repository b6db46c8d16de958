"""The slow rotation pairs' split, refitted as a small mixing of their coordinates (docs/positional.md, "bfloat16
answers": where the d = 128 error sits).

Over rows of N tokens a pair with ``N θ_k ≪ 1`` barely rotates: ``e^{iδθ_k} ≈ 1 + iδθ_k − δ²θ_k²/2``, so the slow
pairs of a key/value group act together as one bilinear form at ``δ = 0`` and their split between frequencies shows
only in the small terms in ``δ``. The row polish reads the sum well (d = 128, 8/2, bfloat16 rows: the two slowest
pairs' summed form 1.3 … 2.9 % off at ``δ = 0``, and their key rows' span within a sine of 2.6e-2 of the truth's) but
not the split (each pair's own form 30 … 100 % off, the summed form 4 … 13 % off at ``δ = 255``): in the
conjugate-gradient steps over every weight those directions have ~``(Nθ)⁴`` of the curvature and are barely moved.

Here the split alone is fitted, densely. In group ``g`` with slow coordinates ``S`` (both coordinates of each slow
pair) the key rows ``W_K,g[S]`` become ``R_g W_K,g[S]`` and each of its heads' query rows ``W_Q,h[S]`` become
``P_h W_Q,h[S]`` (``|S| × |S|`` mixings, identity at the start): ``G·(1 + H/G)·|S|²`` unknowns (160 at 8/2 with two slow
pairs), their Gauss–Newton matrix from that many Jacobian products (:meth:`~.row_polish.StreamedRows.normal`), solved
for a ladder of dampings (Levenberg–Marquardt), the step kept when the cost falls.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from attnprobe.models.positional import PositionalAttention, rotation_pairs

#: Gauss–Newton rounds (each forms the mixing's normal matrix anew)
ROUNDS = 3
#: the normal matrix's eigenvalues under this fraction of its largest are dropped: the pairs' gauge (a scaled
#: rotation of a pair's query and key coordinates leaves the function as it is) and what the rows cannot tell
NULL_EIGENVALUE = 1e-10
#: the Levenberg–Marquardt dampings tried, as fractions of the largest eigenvalue
DAMPINGS = (0.0, 1e-8, 1e-6, 1e-4, 1e-2)
#: the most mixing unknowns fitted (a Jacobian product each, a round): the slowest pairs that fit (8/2 heads: four
#: pairs, 640 unknowns)
MAX_UNKNOWNS = 640


def mixing_pairs(model: PositionalAttention, length: int) -> list[int]:
    """The slow pairs over ``length`` tokens (:func:`~.pair_signs.slow_pairs`), the slowest whose mixings' unknowns
    ``(H + G)·(2·pairs)²`` stay within :data:`MAX_UNKNOWNS`."""
    from attnprobe.learners.positional.pair_signs import slow_pairs

    most = int(math.sqrt(MAX_UNKNOWNS / (model.H + model.G)) // 2)
    return slow_pairs(model, length, most=most) if most else []


def slow_coordinates(model: PositionalAttention, pairs) -> np.ndarray:
    """Both coordinates of each rotation pair in ``pairs`` (rotate-half or interleaved), first coordinates first."""
    a, b = rotation_pairs(model.rotary_dim, model.layout)
    pairs = np.asarray(pairs, dtype=int)
    return np.concatenate([a[pairs], b[pairs]])


class MixingTangents:
    """The mixings' unit directions in ``W_Q`` then ``W_K`` (flattened, ``H·d_h·d + G·d_h·d`` numbers): per head
    ``h`` and ``(i, j)`` of ``coords``, ``δW_Q,h[c_i] = W_Q,h[c_j]``; then per group ``g``, ``δW_K,g[c_i] =
    W_K,g[c_j]``. Never stacked: each touches one head's or group's ``|S|`` rows, so a dense stack would be
    ``(H + G)·|S|²`` copies of every weight (~100 GB at LLaMA-3-8B's head shape) where one at a time is one copy."""

    def __init__(self, model: PositionalAttention, coords: np.ndarray):
        self.coords = np.asarray(coords, dtype=int)
        self.blocks = [np.asarray(w, dtype=np.float64) for w in (*model.Wq, *model.Wk)]  # (d_h, d) each
        self.queries = model.Wq.size
        self.size = self.queries + model.Wk.size

    def __len__(self) -> int:
        return len(self.blocks) * len(self.coords) ** 2

    def _at(self, block: int) -> int:
        dh, d = self.blocks[0].shape
        return block * dh * d

    def vector(self, k: int) -> np.ndarray:
        """Tangent ``k`` as a dense vector."""
        n = len(self.coords)
        block, rest = divmod(k, n * n)
        i, j = divmod(rest, n)
        W = self.blocks[block]
        t = np.zeros(self.size)
        t[self._at(block):self._at(block) + W.size].reshape(W.shape)[self.coords[i]] = W[self.coords[j]]
        return t

    def dot(self, v) -> np.ndarray:
        """``T v`` for a flat vector ``v`` (every tangent's inner product with it), block by block."""
        v = np.asarray(v, dtype=np.float64)
        out = []
        for block, W in enumerate(self.blocks):
            V = v[self._at(block):self._at(block) + W.size].reshape(W.shape)
            out.append((V[self.coords] @ W[self.coords].T).ravel())  # entry (i, j): v[c_i] · W[c_j]
        return np.concatenate(out)


def mixed(model: PositionalAttention, coords: np.ndarray, step: np.ndarray) -> np.ndarray:
    """``W_Q`` then ``W_K`` flattened (as :class:`MixingTangents`) with each block of ``step`` applied as a mixing
    ``exp(P)`` (a skew part rotates exactly, so a long step along a barely-seen rotation is not also a stretch)."""
    from scipy.linalg import expm

    n = len(coords)
    blocks = step.reshape(-1, n, n)
    Wq, Wk = np.array(model.Wq, dtype=np.float64), np.array(model.Wk, dtype=np.float64)
    for h in range(model.H):
        Wq[h, coords] = expm(blocks[h]) @ Wq[h, coords]
    for g in range(model.G):
        Wk[g, coords] = expm(blocks[model.H + g]) @ Wk[g, coords]
    return np.concatenate([Wq.ravel(), Wk.ravel()])


def fit_slow_mixing(model: PositionalAttention, data, pairs, *, rounds: int = ROUNDS, compute: str = "float64",
                    log=None):
    """Refit the split of the slow ``pairs`` in every group (module docstring) on every-position rows ``data``
    (``[(X (B, N, d), Y (B, N, K))]``): ``rounds`` Gauss–Newton steps over the mixings, each kept only when the
    cost falls. Returns the model and a dict (the relative misfit before and after, the steps kept)."""
    import torch

    from attnprobe.learners.positional.polish import DENSE_LIMIT, one_torch_thread
    from attnprobe.learners.positional.row_polish import StreamedRows, rows_spread
    from attnprobe.models.positional_gauge import balanced

    log = log or (lambda line: None)
    if not len(pairs):
        return model, {"pairs": [], "steps": 0}
    model = balanced(model)
    coords = slow_coordinates(model, pairs)
    spread = rows_spread(data)
    before, kept = None, 0
    with one_torch_thread():
        for r in range(rounds):
            problem = StreamedRows(model, ("Wq", "Wk"), data, compute=compute)
            p = problem.start
            T = MixingTangents(model, coords)
            grad, cost = problem.gradient(p)
            before = before if before is not None else math.sqrt(cost) / spread
            if problem.numbers * problem.unknowns <= DENSE_LIMIT:  # small: the Jacobian itself, then J Tᵀ
                J = problem.jacobian(p)
                JT = np.stack([J @ T.vector(k) for k in range(len(T))], 1)
                N = JT.T @ JT
            else:  # streamed: T JᵀJ t_k, a product each
                N = np.stack([T.dot(problem.normal(p, torch.as_tensor(T.vector(k))).double().numpy())
                              for k in range(len(T))])
            N = (N + N.T) / 2
            g = T.dot(grad.double().numpy())
            lam_, U = np.linalg.eigh(N)
            keep = lam_ > NULL_EIGENVALUE * lam_.max()  # the pairs' gauge (scaled rotations) and what the rows miss
            U, lam_, gu = U[:, keep], lam_[keep], U[:, keep].T @ g
            best = (cost, None)
            for damping in DAMPINGS:
                step = -U @ (gu / (lam_ + damping * lam_.max()))
                trial = torch.as_tensor(mixed(model, coords, step))
                c = problem.cost(trial)
                if c < best[0]:
                    best = (c, trial)
            if best[1] is None:
                log(f"slow pairs' mixing round {r + 1}/{rounds}: no damping lowered the cost; stopped")
                break
            arrays = problem.arrays(best[1].double())
            model = balanced(replace(model, Wq=arrays["Wq"].double().numpy(), Wk=arrays["Wk"].double().numpy()))
            kept += 1
            log(f"slow pairs' mixing round {r + 1}/{rounds}: misfit {math.sqrt(cost) / spread:.3e} -> "
                f"{math.sqrt(best[0]) / spread:.3e}")
    final = StreamedRows(model, ("Wq", "Wk"), data, compute=compute)
    after = math.sqrt(final.cost(final.start)) / spread
    return model, {"pairs": [int(k) for k in pairs], "misfit_before": before, "misfit_after": after,
                   "steps": kept}
