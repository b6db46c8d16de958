"""The neurons' fixed factors ``w2_i ⊗ (U w1_i)`` from the derivative arrays (:mod:`.derivatives`).

* Width: the first derivatives at n points, flattened to a ``(K·C) × n`` matrix, are ``A diag(μ) S'ᵀ`` with
  ``A`` the m factors and ``S'_{ji} = σ'(a_i(x_j))``: rank m when ``K·C ≥ m`` and ``n ≥ m`` — the hidden width is
  the place where the singular values drop to the differences' noise.
* Factors (Jennrich's simultaneous diagonalisation): the second derivatives form a three-way array
  ``T[(k, c), e, j] = Σ_i A_(kc),i (V w1_i)_e σ''(a_i(x_j))`` whose first and third modes have full column rank;
  reduced to m × m slices ``S_e``, the eigenvectors of ``S_a S_b⁻¹`` (two random mixtures of the slices) are A's
  columns. Two neurons whose eigenvalues nearly meet are ill-separated in one mixture, so several mixtures are
  diagonalised and each neuron keeps the one where its eigenvalue stands farthest from the others.
* Gated units (:func:`block_factors`): each unit is a 2-D block of A, and every pencil of its blocks is a 2 × 2
  Jordan block; the pairs of eigenvalues are matched and each unit's invariant plane read by inverse iteration.
"""

from __future__ import annotations

import numpy as np

from scipy.linalg import lu_factor, lu_solve

from attnprobe.errors import UnidentifiableError

#: singular values must drop by at least this factor at the hidden width
MIN_GAP = 100.0
#: random mixtures of the slices diagonalised (each neuron keeps its best-separated one)
MIXTURES = 4


def hidden_width(M: np.ndarray) -> tuple[int | None, float]:
    """The rank of ``M`` read at its largest drop of singular values: ``(m, drop)``; ``m`` is None when the
    values never drop by :data:`MIN_GAP` (the matrix is too small to show the width, or the answers too noisy)."""
    s = np.linalg.svd(M, compute_uv=False)
    s = s[s > 0]
    if s.size < 2:
        return None, 1.0
    ratios = s[:-1] / s[1:]
    k = int(np.argmax(ratios))
    drop = float(ratios[k])
    return (k + 1 if drop >= MIN_GAP else None), drop


def factors(T: np.ndarray, m: int, rng: np.random.Generator, *, sweeps: int = 0) -> tuple[np.ndarray, dict]:
    """A's m unit columns (``(K·C) × m``) from the second-derivative array ``T`` of shape ``(K·C, E, n)``: each
    neuron keeps the mixture where its eigenvalue stands farthest from the others (the mixtures' eigenvectors
    matched one to one, so no two columns take the same neuron), then ``sweeps`` rounds of alternating least
    squares on all E slices at once (:func:`refine_factors`; for coarse answers)."""
    KC, E, n = T.shape
    if E < 2:
        raise UnidentifiableError("the factors need at least two second directions")
    P, S = _compress(T, m)
    best, sep_best = None, None
    for t in range(MIXTURES):
        a, b = rng.standard_normal(E), rng.standard_normal(E)
        Sa, Sb = np.tensordot(a, S, 1), np.tensordot(b, S, 1)
        try:
            lam, vec = np.linalg.eig(np.linalg.solve(Sb.T, Sa.T).T)
        except np.linalg.LinAlgError:
            continue
        vec = np.real(vec)
        vec /= np.linalg.norm(vec, axis=0)
        lam = np.real(lam)
        sep = _separation(lam)
        if best is None:
            best, sep_best = vec, sep
            continue
        # this mixture's vector of each kept neuron, one to one (a nearest match let two columns take one neuron
        # and lose another: MiniLM's first 192 units on float32 answers, 11 of them)
        from scipy.optimize import linear_sum_assignment  # here: scipy.optimize costs ~0.2 s to import

        match = linear_sum_assignment(-np.abs(best.T @ vec))[1]
        better = sep[match] > sep_best
        best[:, better] = vec[:, match[better]]
        sep_best = np.where(better, sep[match], sep_best)
    if best is None:
        raise UnidentifiableError("the second-derivative slices are singular: no mixture could be diagonalised")
    info = {"worst_separation": float(sep_best.min()), "median_separation": float(np.median(sep_best))}
    if sweeps:
        best, info["core_residual"] = _core_als(S, best, sweeps)
    A = P @ best
    A /= np.linalg.norm(A, axis=0)
    return A, info


def refine_factors(T: np.ndarray, A0: np.ndarray, sweeps: int) -> tuple[np.ndarray, float]:
    """The factors ``A0`` refined by ``sweeps`` rounds of alternating least squares for ``T ≈ Σ_i A_i ⊗ c_i ⊗
    b_i`` on the top-m subspaces of T's first and third modes (every slice at once, where Jennrich reads two
    mixtures); returns the unit factors and the compressed array's relative residual."""
    P, S = _compress(T, A0.shape[1])
    A, res = _core_als(S, P.T @ A0, sweeps)
    A = P @ A
    return A / np.linalg.norm(A, axis=0), res


def _compress(T: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-m left singular vectors P of T's first mode and the slices ``S_e = Pᵀ T_e Q`` (m × m)."""
    KC, E, n = T.shape
    P = _top_left(T.reshape(KC, E * n), m)
    Q = _top_left(np.transpose(T, (2, 1, 0)).reshape(n, E * KC), m)
    return P, np.einsum("ai,aen,nj->eij", P, T, Q, optimize=True)


def _core_als(S: np.ndarray, A: np.ndarray, sweeps: int) -> tuple[np.ndarray, float]:
    """``S_e ≈ A diag(c_e) Bᵀ`` by alternating least squares from A (m × m); returns A and the relative residual."""
    E, m, _ = S.shape
    M = (np.linalg.pinv(A) @ S.transpose(1, 0, 2).reshape(m, E * m)).reshape(m, E, m)
    u, s, vt = np.linalg.svd(M, full_matrices=False)  # each row of A⁻¹ S is c_i ⊗ b_i
    C, B = u[:, :, 0].T * s[:, 0], vt[:, 0, :].T
    for _ in range(sweeps):
        A = np.linalg.lstsq((C.T @ C) * (B.T @ B), np.einsum("eab,bi,ei->ia", S, B, C, optimize=True),
                            rcond=None)[0].T
        B = np.linalg.lstsq((C.T @ C) * (A.T @ A), np.einsum("eab,ai,ei->ib", S, A, C, optimize=True),
                            rcond=None)[0].T
        C = np.linalg.lstsq((A.T @ A) * (B.T @ B), np.einsum("eab,ai,bi->ie", S, A, B, optimize=True),
                            rcond=None)[0].T
    res = np.linalg.norm(S - np.einsum("ai,ei,bi->eab", A, C, B, optimize=True)) / max(np.linalg.norm(S), 1e-300)
    return A, float(res)


def distinct_columns(A: np.ndarray, same: float = 0.9) -> np.ndarray:
    """Indices of A's columns with every column that is nearly the same (|cos| > ``same``) after the first of it
    left out: alternating least squares can pull two columns onto one neuron."""
    G = np.abs(A.T @ A)
    keep: list[int] = []
    for i in range(A.shape[1]):
        if not keep or np.max(G[i, keep]) <= same:
            keep.append(i)
    return np.array(keep, dtype=int)


def _top_left(M: np.ndarray, m: int) -> np.ndarray:
    """The top-m left singular vectors of M."""
    U, _, _ = np.linalg.svd(M, full_matrices=False)
    return U[:, :m]


def _separation(lam: np.ndarray) -> np.ndarray:
    """Distance of each eigenvalue to its nearest other, relative to the eigenvalues' spread."""
    order = np.argsort(lam)
    s = lam[order]
    gaps = np.diff(s)
    near = np.minimum(np.r_[np.inf, gaps], np.r_[gaps, np.inf])
    out = np.empty_like(lam)
    out[order] = near / max(float(np.median(np.abs(lam - np.median(lam)))), 1e-300)
    return out


def split_factors(A: np.ndarray, K: int, C: int) -> tuple[np.ndarray, np.ndarray]:
    """Each column of A as ``w2_i ⊗ z_i`` (its best rank-one fit): unit output directions ``(K, m)`` and the
    direction-mode vectors ``z_i ∝ U w1_i`` ``(C, m)``."""
    m = A.shape[1]
    R = A.T.reshape(m, K, C)
    u, s, vt = np.linalg.svd(R, full_matrices=False)
    return u[:, :, 0].T, (vt[:, 0, :] * s[:, :1]).T


#: mixtures of the slices tried by :func:`block_factors` (each neuron keeps the one where its pair stands apart)
BLOCK_MIXTURES = 8
#: inverse-iteration sweeps for each neuron's 2-D invariant subspace
INVERSE_SWEEPS = 20
#: the inverse iteration's shift stays this far (relative to the eigenvalues' scale) from a pair's mean
SHIFT_FLOOR = 1e-7
#: an eigenvector this close to a kept neuron's subspace (cosine) is that neuron's (all mixtures share it)
SAME_NEURON = 0.9


def block_factors(T: np.ndarray, m: int, rng: np.random.Generator) -> tuple[list[np.ndarray], dict]:
    """Each gated neuron's 2-D block of factors from the second-derivative array ``T`` ``(K·C, E, n)``.

    A gated neuron ``w2 σ(g·x + bg)(u·x + bu)`` contributes ``w2 ⊗ U·span{g, u}`` to the first mode, ``V·span{g,
    u}`` to the second and two point functions (``σ''·(u·x + bu)``, ``σ'``) to the third: a rank-(2, 2, 2) block
    term. Reduced to 2m × 2m slices, ``S_a S_b⁻¹`` is block diagonal in A's basis with one 2 × 2 Jordan block per
    neuron (its Hessian has no ``u uᵀ`` term, so every pencil of its blocks has a double eigenvalue): the
    eigenvalues come in pairs split by about √(the derivatives' error). Pairs are matched greedily by distance; each
    neuron keeps the mixture where its pair stands farthest from the other eigenvalues (relative to its split), and
    its 2-D invariant subspace is read by inverse iteration at the pair's mean (stable where the eigenvectors of a
    near-Jordan pair are not; each sweep gains the factor G²/ε, G the distance to the next pair, ε the split, hence
    :data:`INVERSE_SWEEPS` sweeps). Returns the m blocks ``(K·C, 2)`` (orthonormal columns) and the separations."""
    KC, E, n = T.shape
    r = 2 * m
    if E < 2:
        raise UnidentifiableError("the block factors need at least two second directions")
    P = _top_left(T.reshape(KC, E * n), r)
    Q = _top_left(np.transpose(T, (2, 1, 0)).reshape(n, E * KC), r)
    S = np.einsum("ai,aen,nj->eij", P, T, Q, optimize=True)
    candidates = []  # (ratio, mixture, eigenvector, centre)
    mats = []
    for t in range(BLOCK_MIXTURES):
        a, b = rng.standard_normal(E), rng.standard_normal(E)
        Sa, Sb = np.tensordot(a, S, 1), np.tensordot(b, S, 1)
        try:
            Tm = np.linalg.solve(Sb.T, Sa.T).T
            lam, vec = np.linalg.eig(Tm)
        except np.linalg.LinAlgError:
            continue
        mats.append(Tm)
        scale = float(np.median(np.abs(lam)))
        for i, j, ratio in _pairs(lam):
            v = vec[:, i] / np.linalg.norm(vec[:, i])
            # the shift is the pair's mean, kept SHIFT_FLOOR·scale away from it (an exact pair would make the shifted
            # matrix singular)
            mu = float(np.real(lam[i] + lam[j]) / 2) + SHIFT_FLOOR * scale
            candidates.append((ratio, len(mats) - 1, v, mu))
    if not candidates:
        raise UnidentifiableError("the second-derivative slices are singular: no mixture could be diagonalised")
    candidates.sort(key=lambda c: -c[0])
    blocks: list[np.ndarray] = []
    ratios: list[float] = []
    basis = np.zeros((r, 0))
    for ratio, t, v, mu in candidates:
        if len(blocks) == m:
            break
        if basis.shape[1] and np.max(np.linalg.norm((basis.T @ v).reshape(-1, 2), axis=1)) > SAME_NEURON:
            continue  # a neuron already kept (from a mixture where it stood farther apart)
        Z = _invariant_pair(mats[t], mu, rng)
        blocks.append(Z)
        ratios.append(ratio)
        basis = np.hstack([basis, Z])
    if len(blocks) < m:
        raise UnidentifiableError(f"only {len(blocks)} of {m} gated neurons could be told apart in the second "
                                  "derivatives; give more answers or check the hidden width")
    A = [P @ Z for Z in blocks]
    return A, {"worst_separation": float(min(ratios)), "median_separation": float(np.median(ratios))}


def _pairs(lam: np.ndarray) -> list[tuple[int, int, float]]:
    """Eigenvalues matched in pairs, closest first (greedy); each pair with the distance from it to the nearest
    other eigenvalue relative to its own split."""
    r = lam.size
    D = np.abs(lam[:, None] - lam[None, :])
    np.fill_diagonal(D, np.inf)
    iu = np.triu_indices(r, 1)
    order = np.argsort(D[iu])
    free = np.ones(r, bool)
    out = []
    for k in order:
        i, j = iu[0][k], iu[1][k]
        if free[i] and free[j]:
            free[i] = free[j] = False
            others = np.minimum(D[i], D[j])
            others[[i, j]] = np.inf
            out.append((i, j, float(others.min() / max(D[i, j], 1e-300))))
            if not free.any():
                break
    return out


def _invariant_pair(Tm: np.ndarray, mu: float, rng: np.random.Generator) -> np.ndarray:
    """The 2-D invariant subspace of ``Tm`` for its two eigenvalues nearest the shift ``mu`` (inverse subspace
    iteration)."""
    r = Tm.shape[0]
    shift = Tm - mu * np.eye(r)
    Z = np.linalg.qr(rng.standard_normal((r, 2)))[0]
    lu = lu_factor(shift, check_finite=False)
    for _ in range(INVERSE_SWEEPS):
        Z = np.linalg.qr(lu_solve(lu, Z, check_finite=False))[0]
    return Z

