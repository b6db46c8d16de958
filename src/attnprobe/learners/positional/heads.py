"""Each head's output column space from zero-key Jacobians (docs/positional.md, "Separating the heads").

Sequence ``[0, …, 0, x_{−2}, x_{−1}, t z]``: zero keys carry no value, and without biases their logits are 0, so at
``x = 0`` every zero key of head ``h`` weighs the same ``α_h0(t)``. Moving ``x_{−1} = ηe`` and ``x_{−2} = −ηe``
together changes the answer, to first order, by

    ``D(t) e = −Σ_h α_h0 α_hN · t² (V_h z) ((B_h(−1) − B_h(−2))ᵀ z)ᵀ e``

— zero for every δ-free model (the offset detector: moving a pair of tokens apart changes nothing), a rank-H matrix
under RoPE. Its columns ``V_h z`` are the heads' output directions; the scalars ``α_h0 α_hN`` change with the query
scale ``t``, so Jennrich's method on ``D(t₁), D(t₂)`` separates them (the eigenvectors of ``D(t₂) D(t₁)⁺`` on
their span). Heads that share keys and values (GQA) still differ in ``W_O,h`` and ``W_Q,h``, so they separate too;
this is where the offset-free probes of the vector learner fail (their logit differences are quadratic in the
varied token under RoPE). Queries ``z₀ + ε q_k`` nearby keep each head's label; the span of a head's ``V_h z_k`` is
its output column space ``C_h``.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import RecoveryError

#: Richardson-extrapolated central differences: steps η, η/2, η/4 (error O(η⁶)), η relative to the token norm
STEP, LEVELS = 1e-2, 3
#: alternating least-squares rounds that polish Jennrich's directions on every setting at once
CP_ROUNDS = 20
#: why the bias-free pair probe refuses a layer with key or query biases (it needs zero keys of logit 0;
#: docs/positional.md): the biased route reads them
BIASES_REFUSED = ("key or query biases (Qwen2-style) are read by the biased RoPE route (extract_positional with "
                  "key_bias, through the kernel of the value maps), which the positional method tries next")

#: largest ratio of the first dropped to the last kept singular value of the pair probe (measured 5e-10 on LLaMA
#: layers in float64; with key/query biases there is no gap)
GAP = 1e-5


def pair_jacobian(layer, z: np.ndarray, E: np.ndarray, eta: float, levels: int = LEVELS, zeros: int = 0) -> np.ndarray:
    """``D e`` for the rows ``e`` of ``E`` (r, d): the first-order change of the answer (K,) when the keys at
    offsets −1 and −2 move to ``±ηe`` from zero, query ``z`` last: central differences at ``η, η/2, …`` combined by
    Richardson's extrapolation (error O(η^(2·levels))); ``zeros`` more zero keys before them. Costs
    ``2·levels·r`` queries. Returns (K, r)."""
    r, d = E.shape
    n = 3 + zeros
    steps = [eta / 2**i for i in range(levels)]
    X = np.zeros((2 * levels, r, n, d))
    for i, step in enumerate(steps):
        for j, sgn in enumerate((1.0, -1.0)):
            X[2 * i + j, :, -3] = -sgn * step * E  # offset −2
            X[2 * i + j, :, -2] = sgn * step * E  # offset −1
    X[:, :, -1] = z  # the query
    y = layer(X.reshape(2 * levels * r, n, d)).reshape(2 * levels, r, -1)
    return _richardson([(y[2 * i] - y[2 * i + 1]) / (2 * step) for i, step in enumerate(steps)]).T


def key_jacobian(layer, z: np.ndarray, E: np.ndarray, eta: float, levels: int = LEVELS, zeros: int = 0) -> np.ndarray:
    """``D e`` for the rows ``e`` of ``E`` (r, d), all inside the kernel of ``M = Σ_h V_h``: the first-order change of
    the answer (K,) when the key at offset −1 moves to ``±ηe`` from zero, query ``z`` last, ``zeros`` more zero keys
    before it (:func:`pair_jacobian`'s signature and differences). The moved key's value does not change
    (``V_h e = 0``: ``e`` is in the kernel of every group's ``W_V``, which exists when heads share keys and values,
    ``G·d_h < d``), and the zero keys' values equal each other, so only the query's weight moves the answer:

        ``D e = −Σ_h α_hN α_h,−1 (V_h z) (W_K,gᵀ R(−1)ᵀ q_h)ᵀ e``  (``q_h = W_Q,h z + b_Q,h``)

    rank H with or without q/k biases (the pair probe's value term ``(α_h,−1 − α_h,−2) V_h e``, full rank when a
    key bias weighs the zero keys unequally, never arises)."""
    r, d = E.shape
    n = 2 + zeros
    steps = [eta / 2**i for i in range(levels)]
    X = np.zeros((2 * levels, r, n, d))
    for i, step in enumerate(steps):
        X[2 * i, :, -2], X[2 * i + 1, :, -2] = step * E, -step * E
    X[:, :, -1] = z
    y = layer(X.reshape(2 * levels * r, n, d)).reshape(2 * levels, r, -1)
    return _richardson([(y[2 * i] - y[2 * i + 1]) / (2 * step) for i, step in enumerate(steps)]).T


def _richardson(table: list) -> np.ndarray:
    """Central differences at steps η, η/2, … combined to error O(η^(2·levels))."""
    for k in range(1, len(table)):
        f = 4.0**k
        table = [(f * table[i + 1] - table[i]) / (f - 1) for i in range(len(table) - 1)]
    return table[0]


def head_directions(layer, z: np.ndarray, E: np.ndarray, *, settings, eta: float, rank: int | None, noise: float,
                    rng: np.random.Generator, floor: float = 0.0, jacobian=pair_jacobian):
    """The heads' output directions ``V_h z`` (K, H) at query ``z`` from :func:`pair_jacobian` at several
    ``settings`` (query scale t, extra zero keys): every ``D`` shares the columns ``V_h z``, each head scaled by
    ``α_h0 α_hN t²``, which the settings change differently per head. Jennrich's method on two random combinations
    of them (the eigenvectors of ``D_a D_b⁺`` on their span) gives the columns; the zero keys spread the heads'
    ratios far more than the query scale does. ``rank``: H when known (else read from the singular values above
    ``floor``, an absolute size below which ``D`` is finite-difference error: no offset dependence, rank 0).
    ``jacobian``: how each ``D`` is measured (:func:`pair_jacobian`'s signature; coarse answers use a fit over many
    steps). Returns the directions (unit columns), the singular values of the first ``D`` and the rank."""
    Ds = [jacobian(layer, t * z, E, eta, zeros=n) for t, n in settings]
    U, s, _ = np.linalg.svd(Ds[0], full_matrices=False)
    if s[0] <= floor:
        return None, s, 0
    # the key probe sees H directions with or without biases: its failures are not the biases' signature
    why = "a sum of RoPE heads" if jacobian is key_jacobian else BIASES_REFUSED
    if rank is None:
        keep = s > 10 * math.sqrt(noise) * s[0]  # finite differences: errors far above the rounding
        rank = int(np.sum(keep))
        if rank == len(s) or rank < len(s) and s[rank] > GAP * s[rank - 1]:
            raise RecoveryError(f"moving zero keys changed the answer in {rank} or more directions without a gap "
                                f"(a sum of RoPE heads shows exactly H); {why}")
    if rank < 1:
        return None, s, rank
    Ur = U[:, :rank]
    A = [Ur.T @ D for D in Ds]
    best = None
    for _ in range(4):  # the draw whose eigenvalues are best separated
        a, b = rng.standard_normal(len(A)), rng.standard_normal(len(A))
        T = sum(x * Ai for x, Ai in zip(a, A)) @ np.linalg.pinv(sum(x * Ai for x, Ai in zip(b, A)))
        vals, vecs = np.linalg.eig(T)
        if np.max(np.abs(np.imag(vals))) > 1e-6 * np.max(np.abs(vals)):
            continue
        v = np.sort(np.real(vals))
        gap = float(np.min(np.diff(v)) / np.max(np.abs(v))) if len(v) > 1 else 1.0
        if best is None or gap > best[0]:
            best = (gap, np.real(vecs))
    if best is None:
        raise RecoveryError("the heads did not separate at the zero-key probe (complex eigenvalues): the answers are "
                            f"not those of RoPE heads, or two heads weigh their keys alike in every setting; {why}")
    W = refine_directions(Ds, Ur @ best[1])
    return W, s, rank


def refine_directions(Ds, W: np.ndarray, rounds: int = CP_ROUNDS) -> np.ndarray:
    """Every ``D_i = W diag(c_i) Rᵀ`` (the columns ``V_h z``, the rows ``(B_h(−1) − B_h(−2))ᵀ z`` common, one scalar
    per head and setting): alternating least squares on this rank-H decomposition of all the ``D`` at once, from
    Jennrich's directions (which use two combinations of them only). Measured 1.1 … 3× closer to ``V_h z`` at
    d = 128. Returns unit columns."""
    H = W.shape[1]
    R = np.linalg.lstsq(W, Ds[0], rcond=None)[0].T
    C = np.ones((len(Ds), H))
    for _ in range(rounds):
        for i, D in enumerate(Ds):
            C[i] = np.linalg.lstsq(np.einsum("kh,rh->krh", W, R).reshape(-1, H), D.reshape(-1), rcond=None)[0]
        W = np.linalg.lstsq(np.concatenate([(R * c).T for c in C], axis=1).T, np.concatenate(Ds, axis=1).T,
                            rcond=None)[0].T
        R = np.linalg.lstsq(np.concatenate([W * c for c in C]), np.concatenate(Ds), rcond=None)[0].T
        norm = np.linalg.norm(W, axis=0)
        W, R = W / norm, R * norm
    return W


def match(ref: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Columns of ``W`` reordered and signed to follow ``ref`` (largest |cos| assignment); refused when a match is
    ambiguous."""
    from scipy.optimize import linear_sum_assignment  # here: scipy.optimize costs ~0.2 s to import

    C = np.abs(ref.T @ W)
    rows, cols = linear_sum_assignment(-C)
    if np.min(C[rows, cols]) < 0.5:
        raise RecoveryError(f"a head's direction moved too far between nearby queries to keep its label (|cos| "
                            f"{np.min(C[rows, cols]):.2f}); lower the step between queries")
    out = W[:, cols]
    return out * np.sign(np.sum(out * ref, axis=0))
