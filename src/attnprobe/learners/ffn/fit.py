"""From jumps and orientations to a network, and the least-squares polish for coarse answers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

#: random inputs per unknown for the least-squares polish (coarse answers only, by default; one more per unknown
#: for biased networks, whose inputs are mostly placed next to the hyperplanes)
POLISH_FACTOR = 3
#: polish rounds at most: each refits with the activation pattern of the last; a neuron that starts 0.1 rad off
#: moves the pattern of many inputs and needs more than three rounds (three left two such nets 1,900–15,500 roundings
#: off their answers, float32 d = 8, m = 32; thirty brought them to 0.6–0.7)
POLISH_ROUNDS = 30
#: least-squares work (rows × unknowns² of one refit, summed over its rounds) for which the polish runs until
#: settled: 30 rounds up to d = 8, m = 40 (≈ 1.9e8 per round); from about d = 64, m = 16 (4.5e9 per round, ~0.6 s
#: here) the 3 rounds of POLISH_MIN_ROUNDS
POLISH_WORK = 6e9
#: rounds every polish may take, whatever its size (the polish as it was before it ran until settled)
POLISH_MIN_ROUNDS = 3
#: the polish refits at most this many unknowns (D·m); larger networks keep their finite-difference neurons
POLISH_MAX_UNKNOWNS = 8192
#: the polish stops once a round lowers the misfit by less than this share
POLISH_SETTLED = 1e-3


@dataclass(frozen=True)
class Neurons:
    """Neurons in the search space: columns of ``dirs`` (D × m, the active side is ``dirs·z > 0``) with output
    weights ``weights`` (m × K), plus the output bias ``c`` (K,) of a lifted (biased) network."""

    dirs: np.ndarray
    weights: np.ndarray
    c: np.ndarray

    def values(self, Z: np.ndarray) -> np.ndarray:
        """The lifted network's answers ``Σ_k w_k ReLU(dir_kᵀz) + c·s`` (no c term when c is empty)."""
        y = np.maximum(Z @ self.dirs, 0) @ self.weights
        return y + Z[:, -1:] * self.c[None, :] if self.c.size else y


def jump_neurons(J: np.ndarray, N: np.ndarray, seg_dirs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit normals oriented along the segment each was crossed on (``n_k·q > 0``) and the effective output weights
    ``c_kj = J_kj·n_k`` (= ``w_kj‖ã_k‖``): crossing along q turns on the neuron ``ReLU(±n_kᵀz)``."""
    flip = np.sign(np.einsum("ik,ik->k", N, seg_dirs))
    N = N * np.where(flip == 0, 1.0, flip)[None, :]
    return N, np.einsum("kje,ek->kj", J, N)


def linear_rest_neurons(rest: np.ndarray, dim: int, dx: int, tiny: float) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of neurons ``±u`` carrying the linear part ``½ restᵀx`` (rest: K × dx) the orientations missed:
    ``½σ vᵀ(ReLU(uᵀx) − ReLU(−uᵀx)) = ½σ v uᵀx`` for each singular triplet of restᵀ."""
    U, S, Vt = np.linalg.svd(rest.T, full_matrices=False)
    dirs, weights = [], []
    for i in np.flatnonzero(S > tiny):
        u = np.zeros(dim)
        u[:dx] = U[:, i]
        dirs += [u, -u]
        weights += [0.5 * S[i] * Vt[i], -0.5 * S[i] * Vt[i]]
    if not dirs:
        return np.zeros((dim, 0)), np.zeros((0, rest.shape[0]))
    return np.array(dirs).T, np.array(weights)


def fit_output_bias(neurons: Neurons, Z: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Lifted answers are ``h(z) + c·s``: c by least squares over answers the learner already has."""
    s = Z[:, -1]
    r = Y - np.maximum(Z @ neurons.dirs, 0) @ neurons.weights
    return (s @ r) / float(s @ s)


def polish(neurons: Neurons, Z: np.ndarray, Y: np.ndarray, lifted: bool, *, margin: float = 1e-3,
           rounds: int | None = None, max_unknowns: int = POLISH_MAX_UNKNOWNS) -> tuple[Neurons, bool]:
    """Least-squares polish: with the activation pattern of the current neurons fixed, the answers are linear in
    ``B_k = dir_k w_kᵀ`` (and c when lifted); each refitted ``B_k`` is brought back to rank one (its leading
    singular pair). Points within ``margin``·‖z‖ of a hyperplane are left out (their pattern is uncertain), and
    only neurons seen on both sides by many points are refitted (a biased neuron the inputs never switch is
    indistinguishable from an affine term there, and its refit would move its hyperplane). Averaging over many
    answers beats the d + 1 finite differences per region when answers are coarse (float32). ``rounds``: at most
    (default :func:`polish_rounds` of the problem's size). Returns (neurons, used?)."""
    D, m = neurons.dirs.shape
    if D * m > max_unknowns:
        return neurons, False
    rounds = polish_rounds(Z.shape[0], D * m) if rounds is None else rounds
    used = False
    for _ in range(rounds):
        H = Z @ neurons.dirs
        dist = np.abs(H) / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-300)
        ok = np.min(dist, axis=1) > margin
        on = H[ok] > 0
        free = np.minimum(on.sum(axis=0), (~on).sum(axis=0)) >= D
        n_unknown = D * int(free.sum()) + int(lifted)
        if not free.any() or ok.sum() < 2 * n_unknown:
            break
        fixed = Neurons(neurons.dirs[:, ~free], neurons.weights[~free], np.zeros(0))
        target = Y[ok] - fixed.values(Z[ok])
        F = (on[:, free][:, :, None] * Z[ok][:, None, :]).reshape(int(ok.sum()), -1)
        if lifted:
            F = np.concatenate([F, Z[ok][:, -1:]], axis=1)
        old = float(np.linalg.norm(neurons.values(Z[ok]) - Y[ok]))
        coef = scipy.linalg.lstsq(F, target, lapack_driver="gelsy", check_finite=False)[0]  # QR: fast
        new = float(np.linalg.norm(F @ coef - target))
        cand = _rank_one(coef[: D * free.sum()].reshape(int(free.sum()), D, -1), neurons, free,
                         coef[-1] if lifted else neurons.c)
        if cand is None or not new < old:
            break
        neurons, used = cand, True
        if new > (1 - POLISH_SETTLED) * old:
            break
    return neurons, used


def polish_answers(dim: int, m: int, lifted: bool) -> int:
    """Inputs the polish asks for m neurons in ``dim`` unknowns each: :data:`POLISH_FACTOR` per unknown, one more for
    a biased (lifted) network."""
    return (POLISH_FACTOR + int(lifted)) * dim * m


def polish_rounds(rows: int, unknowns: int) -> int:
    """Rounds the polish may take on ``rows`` answers and ``unknowns`` unknowns: until settled (at most
    :data:`POLISH_ROUNDS`) while the work stays within :data:`POLISH_WORK`, never fewer than
    :data:`POLISH_MIN_ROUNDS`."""
    per_round = float(rows) * float(unknowns) ** 2
    return int(min(POLISH_ROUNDS, max(POLISH_MIN_ROUNDS, POLISH_WORK // max(per_round, 1.0))))


def _rank_one(B: np.ndarray, old: Neurons, free: np.ndarray, c: np.ndarray) -> Neurons | None:
    """Neurons from refitted ``B_k = dir_k w_kᵀ`` (one (D, K) block per free neuron; the others are kept); None
    when a neuron turned over or vanished."""
    dirs, weights = old.dirs.copy(), old.weights.copy()
    for i, k in enumerate(np.flatnonzero(free)):
        U, S, Vt = np.linalg.svd(B[i], full_matrices=False)
        u, w = U[:, 0], S[0] * Vt[0]
        if u @ old.dirs[:, k] < 0:
            u, w = -u, -w
        scale = np.linalg.norm(old.dirs[:, k])
        dirs[:, k], weights[k] = u * scale, w / scale
    same = np.einsum("kj,kj->k", weights, old.weights) > 0  # the neuron keeps its orientation
    if not same.all() or not np.all(np.linalg.norm(weights, axis=1) > 0):
        return None
    return Neurons(dirs, weights, np.asarray(c, dtype=np.float64).reshape(-1))
