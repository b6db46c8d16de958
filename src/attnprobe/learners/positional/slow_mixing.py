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


def mixing_names(biases: bool) -> tuple[str, ...]:
    """The arrays a mixing moves: ``W_Q``, ``W_K``, and with ``biases`` their biases ``b_Q``, ``b_K``."""
    return ("Wq", "Wk", "bq", "bk") if biases else ("Wq", "Wk")


class MixingTangents:
    """The mixings' unit directions in ``W_Q`` then ``W_K`` (flattened, ``H·d_h·d + G·d_h·d`` numbers; with
    ``biases`` then ``b_Q``, ``b_K``): per head ``h`` and ``(i, j)`` of ``coords``, ``δW_Q,h[c_i] = W_Q,h[c_j]`` (with
    ``biases`` also ``δb_Q,h[c_i] = b_Q,h[c_j]``: the query ``W_Q,h x + b_Q,h`` is what ``P_h`` mixes); then per group
    ``g``, ``δW_K,g[c_i] = W_K,g[c_j]`` (and ``δb_K,g[c_i] = b_K,g[c_j]``). Never stacked: each touches one head's or
    group's ``|S|`` rows, so a dense stack would be ``(H + G)·|S|²`` copies of every weight (~100 GB at LLaMA-3-8B's
    head shape) where one at a time is one copy."""

    def __init__(self, model: PositionalAttention, coords: np.ndarray, *, biases: bool = False):
        self.coords = np.asarray(coords, dtype=int)
        self.blocks = [np.asarray(w, dtype=np.float64) for w in (*model.Wq, *model.Wk)]  # (d_h, d) each
        self.biases = ([np.asarray(b, dtype=np.float64) for b in (*model.bq, *model.bk)] if biases else None)
        self.weights = model.Wq.size + model.Wk.size
        self.size = self.weights + (model.bq.size + model.bk.size if biases else 0)

    def __len__(self) -> int:
        return len(self.blocks) * len(self.coords) ** 2

    def _at(self, block: int) -> int:
        dh, d = self.blocks[0].shape
        return block * dh * d

    def _bias_at(self, block: int) -> int:  # b_Q's heads then b_K's groups, the blocks' order
        return self.weights + block * self.blocks[0].shape[0]

    def vector(self, k: int) -> np.ndarray:
        """Tangent ``k`` as a dense vector."""
        n = len(self.coords)
        block, rest = divmod(k, n * n)
        i, j = divmod(rest, n)
        W = self.blocks[block]
        t = np.zeros(self.size)
        t[self._at(block):self._at(block) + W.size].reshape(W.shape)[self.coords[i]] = W[self.coords[j]]
        if self.biases is not None:
            t[self._bias_at(block) + self.coords[i]] = self.biases[block][self.coords[j]]
        return t

    def dot(self, v) -> np.ndarray:
        """``T v`` for a flat vector ``v`` (every tangent's inner product with it), block by block."""
        v = np.asarray(v, dtype=np.float64)
        out = []
        for block, W in enumerate(self.blocks):
            V = v[self._at(block):self._at(block) + W.size].reshape(W.shape)
            entry = V[self.coords] @ W[self.coords].T  # (i, j): v[c_i] · W[c_j]
            if self.biases is not None:
                vb = v[self._bias_at(block) + self.coords]
                entry = entry + np.outer(vb, self.biases[block][self.coords])
            out.append(entry.ravel())
        return np.concatenate(out)


def mixed(model: PositionalAttention, coords: np.ndarray, step: np.ndarray, *, biases: bool = False) -> np.ndarray:
    """:func:`mixing_names`' arrays flattened (as :class:`MixingTangents`) with each block of ``step`` applied as a
    mixing ``exp(P)`` to a head's (a group's) slow coordinates — of its bias too with ``biases`` (a skew part rotates
    exactly, so a long step along a barely-seen rotation is not also a stretch)."""
    from scipy.linalg import expm

    n = len(coords)
    blocks = step.reshape(-1, n, n)
    arrays = [np.array(getattr(model, name), dtype=np.float64) for name in mixing_names(biases)]
    for a, x in enumerate(arrays):
        first = 0 if a % 2 == 0 else model.H  # W_Q, b_Q: the heads' blocks; W_K, b_K: the groups'
        for h in range(len(x)):
            x[h, coords] = expm(blocks[first + h]) @ x[h, coords]
    return np.concatenate([x.ravel() for x in arrays])


def fit_slow_mixing(model: PositionalAttention, data, pairs, *, rounds: int = ROUNDS, compute: str = "float64",
                    biases: bool = False, log=None):
    """Refit the split of the slow ``pairs`` in every group (module docstring) on every-position rows ``data``
    (``[(X (B, N, d), Y (B, N, K))]``): ``rounds`` Gauss–Newton steps over the mixings, each kept only when the
    cost falls; ``biases``: the mixings move the query and key biases' slow coordinates with their rows (held
    otherwise). Returns the model and a dict (the relative misfit before and after, the steps kept)."""
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
    names = mixing_names(biases)
    before, kept = None, 0
    with one_torch_thread():
        for r in range(rounds):
            problem = StreamedRows(model, names, data, compute=compute)
            p = problem.start
            T = MixingTangents(model, coords, biases=biases)
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
                trial = torch.as_tensor(mixed(model, coords, step, biases=biases))
                c = problem.cost(trial)
                if c < best[0]:
                    best = (c, trial)
            if best[1] is None:
                log(f"slow pairs' mixing round {r + 1}/{rounds}: no damping lowered the cost; stopped")
                break
            arrays = problem.arrays(best[1].double())
            model = balanced(replace(model, **{n: arrays[n].double().numpy() for n in names}))
            kept += 1
            log(f"slow pairs' mixing round {r + 1}/{rounds}: misfit {math.sqrt(cost) / spread:.3e} -> "
                f"{math.sqrt(best[0]) / spread:.3e}")
    final = StreamedRows(model, names, data, compute=compute)
    after = math.sqrt(final.cost(final.start)) / spread
    return model, {"pairs": [int(k) for k in pairs], "misfit_before": before, "misfit_after": after,
                   "steps": kept}
