"""RoPE attention from coarse answers (float32, bfloat16): a start from averaged probes, then the joint polish
(docs/positional.md, "Coarse answers").

The float64 learner (:mod:`.rope`) differentiates answers by Richardson's extrapolation over three steps, which
float32 rounding ruins. Here every stage averages many answers instead:

1. **values** — ``[x] ↦ M x + c`` by least squares over ``VALUE_REPEATS·2d`` one-token sequences.
2. **heads** — the zero-key pair probe's ``D`` (:mod:`.heads`) as the slope at 0 of a Chebyshev fit of the odd part
   of the answer over ``NODES`` key steps up to ``COARSE_STEP`` of the token norm (the truncation falls
   exponentially with the degree, the rounding is averaged over the nodes: each head's direction to ~1e-5 from
   float32 answers at d = 32, where Richardson's three steps give 2e-3 … 3e-2); Jennrich's method and the walk
   of :mod:`.heads` give each head's output space ``C_h`` (its ``K/H`` leading directions), and ``V_h = C_h G_h``.
3. **logits** — sequences of zeros with ``KEYS`` random keys at random offsets up to ``-SPAN`` and a random query:
   each head's weights are solved in its coordinates, ``log α_hj/α_h0`` (against a zero key) is
   ``(W_Q,h z)ᵀ R(δ_j) (W_K,h x_j)``, bilinear in the two maps for the frequencies of the declared base (or
   ``DEFAULT_BASE``): alternating least squares over every sample.
4. **polish** — :func:`~.polish.polish` on fresh answers (the frequencies fitted too when the base was not declared).

The start needs only to fall in the polish's basin; the polish averages the rounding over every fresh number.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import RecoveryError, UnidentifiableError
from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.positional.heads import head_directions, match
from attnprobe.learners.positional import coarse_bias, wide_logits
from attnprobe.learners.positional.logit_samples import (ALS_ROUNDS, LOGIT_OFFSETS, SAMPLES_PER_ENTRY, kept_offsets,
                                                         log_weights, reliability)
from attnprobe.models.positional import PositionalAttention, rope_frequencies, rotation_matrix
from attnprobe.learners.positional.polish import POLISH_WORK
from attnprobe.learners.positional.token_scale import PAIRS as TOKEN_PAIRS, ScaledTokens, token_scale, unscale

#: Chebyshev nodes on (0, 1] per key step sign, the odd polynomial's degree, the longest step (of the token norm)
NODES, DEGREE, COARSE_STEP = 16, 15, 0.3
#: the pair probe's settings (query scale, extra zero keys), as the float64 learner's
SETTINGS = ((1.0, 0), (1.5, 0), (1.0, 8), (1.5, 8))
#: the key probe's settings (q/k biases): the query's scale fixed, 0 … 16 zero keys (as the float64 learner's)
KEY_SETTINGS = ((1.0, 0), (1.0, 4), (1.0, 8), (1.0, 16))
#: one-token sequences per input dimension and sign in the values stage
VALUE_REPEATS = 4
#: wide heads' logit maps (``d_h·d`` above :data:`DENSE_ALS`): ``extra = LOGIT_EXTRA·d`` sequences beyond ``d`` per
#: regression and ``⌈(d_h + extra)/9⌉`` key sets, without the alternating least squares (LLaMA d = 128, 8/2,
#: float32, value maps 1e-4 off: extra 16 leaves the start 0.28 … 0.92 off, extra 256 1.3e-3 … 3.7e-3, as with
#: exact value maps; the dense ALS's normal equations, 2,048 unknowns per half-step, took over ten minutes per call
#: at extra 16; docs/positional.md, "d = 128, 8/2: where the start breaks")
LOGIT_EXTRA, DENSE_ALS = 2, 1024
#: the base assumed when none is declared (Hugging Face's default): the polish fits the frequencies from it
DEFAULT_BASE = 10000.0
#: target median |logit| of the logit sequences (float32 answers: larger logits leave keys far below a zero key,
#: whose log-weights the rounding spoils; measured at d = 32: median error 9e-7 at 0.6, 3e-5 with outliers of 6.6 at
#: 2.5)
TARGET_LOGIT = 0.5
#: the median |logit| above which the value maps' random queries are shrunk to it (a Hugging Face LLaMA folder at
#: std 0.3 has 2.1: one head's V_h came out 0.40 off; random-init layers at d = 32 have 0.6 … 0.7)
PROBE_LOGIT = 0.7
#: independent random queries per input dimension at which the heads' value maps are read
VALUE_QUERIES = 6
#: rounds of dropping the value maps' outlying queries
TRIMS = 3
#: the polish after the coarse start: fresh sequences per ⌈unknowns/K⌉ (more numbers average the rounding, and
#: keep the polish on its conjugate-gradient path) and Levenberg–Marquardt rounds (a start ~1e-2 off needs more
#: than the float64 learners' four)
POLISH_PER, POLISH_ROUNDS = 4, 8


def pair_derivative(layer, z: np.ndarray, E: np.ndarray, eta: float, zeros: int = 0, nodes: int = NODES,
                    degree: int = DEGREE) -> np.ndarray:
    """The pair probe's ``D e`` (:func:`~.heads.pair_jacobian`) for the rows ``e`` of ``E`` as the slope at 0 of a
    least-squares Chebyshev fit (odd terms up to ``degree``) of ``(y(ηe) − y(−ηe))/2`` over ``nodes`` steps
    ``η = eta·cos(π(i + ½)/(2·nodes))``: averaged rounding, truncation falling with the degree. Costs
    ``2·nodes·r`` queries. Returns (K, r)."""
    r, d = E.shape
    n = 3 + zeros
    u = chebyshev_nodes(nodes)
    X = np.zeros((2, nodes, r, n, d))
    for s, sign in enumerate((1.0, -1.0)):
        X[s, :, :, -3] = -sign * eta * u[:, None, None] * E  # offset −2
        X[s, :, :, -2] = sign * eta * u[:, None, None] * E  # offset −1
    X[..., -1, :] = z
    y = np.asarray(layer(X.reshape(-1, n, d)), dtype=np.float64).reshape(2, nodes, r, -1)
    return odd_slope((y[0] - y[1]) / 2, u, degree) / eta


def key_derivative(layer, z: np.ndarray, E: np.ndarray, eta: float, zeros: int = 0, nodes: int = NODES,
                   degree: int = DEGREE) -> np.ndarray:
    """The key probe's ``D e`` (:func:`~.heads.key_jacobian`: one key at offset −1, moved along ``e`` inside the
    kernel of the value maps, before ``zeros`` zero keys' … the query ``z``; rank H with or without q/k biases) as
    the slope at 0 of :func:`pair_derivative`'s Chebyshev fit over ``nodes`` steps up to ``eta``. Costs
    ``2·nodes·r`` queries. Returns (K, r)."""
    r, d = E.shape
    n = 2 + zeros
    u = chebyshev_nodes(nodes)
    X = np.zeros((2, nodes, r, n, d))
    for s, sign in enumerate((1.0, -1.0)):
        X[s, :, :, -2] = sign * eta * u[:, None, None] * E  # offset −1
    X[..., -1, :] = z
    y = np.asarray(layer(X.reshape(-1, n, d)), dtype=np.float64).reshape(2, nodes, r, -1)
    return odd_slope((y[0] - y[1]) / 2, u, degree) / eta


def probe_directions(d: int, rng: np.random.Generator, count: int, kernel: np.ndarray | None = None):
    """The probe's key directions ``E`` (up to ``count`` rows) and :func:`~.heads.head_directions`' settings and
    derivative: random orthonormal rows and the zero-key pair probe (:func:`pair_derivative`), or with ``kernel``
    (rows spanning the kernel of the value maps: q/k biases) rows inside it and the key probe
    (:func:`key_derivative`), whose settings change the zero keys only (a query bias turns the probe's rows with the
    query's scale)."""
    if kernel is None:
        return random_orthogonal(d, rng)[: min(d, count)], dict(settings=SETTINGS, jacobian=pair_derivative)
    E = random_orthogonal(len(kernel), rng)[: min(len(kernel), count)] @ kernel
    return E, dict(settings=KEY_SETTINGS, jacobian=key_derivative)


def chebyshev_nodes(nodes: int = NODES) -> np.ndarray:
    """The steps (fractions of the longest) of :func:`pair_derivative`: ``cos(π(i + ½)/(2·nodes))``."""
    return np.cos(np.pi * (np.arange(nodes) + 0.5) / (2 * nodes))


def odd_slope(odd: np.ndarray, u: np.ndarray, degree: int = DEGREE) -> np.ndarray:
    """The slope at 0 of the least-squares odd Chebyshev fit (terms up to ``degree``) of ``odd (nodes, r, K)``
    sampled at the steps ``u``: (K, r), per unit step."""
    nodes, r = odd.shape[:2]
    ks = np.arange(1, degree + 1, 2)
    T = np.cos(np.outer(np.arccos(u), ks))  # T_k(u), odd k
    coef = np.linalg.lstsq(T, odd.reshape(nodes, -1), rcond=None)[0]
    slope = ks * (-1.0) ** ((ks - 1) // 2)  # T_k'(0)
    return (slope @ coef).reshape(r, -1).T


def start_frequencies(oracle, head_dim: int, base: float | None = None) -> tuple[np.ndarray, str]:
    """The rotation frequencies an every-row start uses and where they came from: the oracle's declared ones (a
    Hugging Face folder's config's: ``"declared"``, held by the polish), else those of ``base`` (default
    :data:`DEFAULT_BASE`: ``"fitted"``, the polish fits them)."""
    from attnprobe.oracles.wrappers import declared_attribute

    declared = declared_attribute(oracle.fn, "rotary_frequencies")
    if declared is not None:
        return np.asarray(declared, dtype=np.float64), "declared"
    return rope_frequencies(head_dim, base or DEFAULT_BASE), "fitted"


def coarse_values(oracle, rng: np.random.Generator, rho: float, repeats: int = VALUE_REPEATS):
    """``M`` (K, d) and ``c`` (K,) from ``2d·repeats`` one-token sequences ``±ρ P`` (P random orthogonal)."""
    d = oracle.d
    Ms, cs = [], []
    for _ in range(repeats):
        P = rho * random_orthogonal(d, rng)
        y = np.asarray(oracle(np.concatenate([P, -P])[:, None, :]), dtype=np.float64)
        Ms.append(((y[:d] - y[d:]) / 2).T @ P / rho**2)
        cs.append((y[:d] + y[d:]).mean(axis=0) / 2)
    return np.mean(Ms, axis=0), np.mean(cs, axis=0)


def coarse_output_spaces(oracle, M: np.ndarray, rng: np.random.Generator, H: int, walk: int = 1, *,
                         kernel: np.ndarray | None = None):
    """Each head's output space from :func:`pair_derivative` along a walk of nearby queries (as the float64
    learner's): ``Cb (K, H·d_h)`` with ``d_h = K/H`` and ``G (H, d_h, d)`` with ``V_h = C_h G_h``; ``kernel``:
    the key probe inside it instead (:func:`probe_directions`)."""
    d, K = oracle.d, M.shape[0]
    if K % H:
        raise RecoveryError(f"the output row (K = {K}) does not split into {H} heads of equal width")
    dh = K // H
    z0 = rng.standard_normal(d)
    eta = COARSE_STEP * math.sqrt(d)
    E, probe = probe_directions(d, rng, 2 * H + 8, kernel)
    kw = dict(eta=eta, rank=H, noise=0.0, rng=rng, **probe)
    W0, _, _ = head_directions(oracle, z0, E, **kw)
    dirs, z = [W0], z0
    E = E[: H + 4]
    for _ in range(walk * math.ceil(K / H) + 4):
        q = rng.standard_normal(d)
        step = 0.4
        while True:
            znew = z + step * q * np.linalg.norm(z0) / np.linalg.norm(q)
            znew *= np.linalg.norm(z0) / np.linalg.norm(znew)
            W, _, _ = head_directions(oracle, znew, E, **kw)
            try:
                dirs.append(match(dirs[-1], W))
                break
            except RecoveryError:
                if step < 0.05:
                    raise
                step /= 2
        z = znew
    C = [np.linalg.svd(np.stack([w[:, h] for w in dirs], axis=1), full_matrices=False)[0][:, :dh] for h in range(H)]
    Cb = np.concatenate(C, axis=1)
    return Cb, (np.linalg.pinv(Cb) @ M).reshape(H, dh, -1)


def _regress(F: np.ndarray, y: np.ndarray) -> np.ndarray:
    ok = np.isfinite(y)
    w = reliability(y[ok])
    return np.linalg.lstsq(F[ok] * w[:, None], y[ok] * w, rcond=None)[0]


def logit_maps(oracle, rng, Cb, G, c, theta, rho: float, *, offsets=LOGIT_OFFSETS, extra: int = 16,
               rounds: int = ALS_ROUNDS, query_sets: int | None = None, samples: int = SAMPLES_PER_ENTRY):
    """Every head's ``W_Q``, ``W_K`` (d_h, d) from log-weights (:func:`log_weights`), keys at ``offsets``:

    (a) a fixed key set against ``d + extra`` random queries: ``ℓ_j = zᵀ B_h(δ_j) x_j`` is linear in ``z``, its
        vector ``B_h(δ_j) x_j`` in ``W_Q,h``'s row space ``U``; a fixed query against random keys: ``B_h(δ)ᵀ z``
        in ``W_K,h``'s row space ``V`` (least squares over the sequences, d_h + extra vectors each);
    (b) ``M(δ) = Uᵀ B_h(δ) V`` by least squares on every sequence and ``2·d_h²`` more with random queries and keys
        (d_h² unknowns per offset);
    (c) ``M(δ) = A_Qᵀ R(δ) A_K``: ``A_K M(δ₀)⁻¹ M(δ) = R(δ − δ₀) A_K`` is linear in ``A_K`` with the frequencies
        known; its null space is the commutant of the rotations (the gauge: a scaled rotation per pair), any
        invertible member serves; ``A_Q`` by least squares. ``W_Q = A_Q Uᵀ``, ``W_K = A_K Vᵀ``.

    ``extra``: sequences beyond ``d`` per regression in (a); ``query_sets``: fixed queries in (a) (default as many
    as key sets; bfloat16 needs ``d_h + 8``: a query spans ``W_K``'s rows through ``R(δ)ᵀ W_Q z`` only, where low
    frequencies add no direction); ``samples``: random sequences per entry in (b).
    Returns (Wq, Wk) (H, d_h, d) each and the sequences asked."""
    d = oracle.d
    H, dh = G.shape[:2]
    offsets = kept_offsets(offsets, dh)
    offs = np.array(offsets)
    m, span = len(offs), int(-offs.min())
    sets = math.ceil((dh + extra) / m)
    n = d + extra
    seqs, Us, Vs = [], [], []
    for _ in range(sets):  # (a) fixed keys, random queries
        toks = np.repeat(rng.standard_normal((1, m + 1, d)) * rho, n, axis=0)
        toks[:, -1] = rng.standard_normal((n, d)) * rho
        ell = log_weights(oracle, Cb, G, c, toks, np.tile(offs, (n, 1)), span)
        Us.append(np.stack([[_regress(toks[:, -1], ell[:, h, j]) for j in range(m)] for h in range(H)]))
        seqs.append((toks, ell))
    for _ in range(query_sets or sets):  # fixed query, random keys (each spans W_K's rows only through R(δ)ᵀ q)
        toks = rng.standard_normal((n, m + 1, d)) * rho
        toks[:, -1] = rng.standard_normal(d) * rho
        ell = log_weights(oracle, Cb, G, c, toks, np.tile(offs, (n, 1)), span)
        Vs.append(np.stack([[_regress(toks[:, j], ell[:, h, j]) for j in range(m)] for h in range(H)]))
        seqs.append((toks, ell))
    free = samples * dh * dh  # (b) random queries and keys: every offset's M(δ) seen in every entry
    toks = rng.standard_normal((free, m + 1, d)) * rho
    batch = free if not wide_logits.wide(len(seqs) * n + free, dh) else max(1, 2**28 // (8 * (span + 1) * d))
    seqs.append((toks, np.concatenate([log_weights(oracle, Cb, G, c, toks[i:i + batch],
                                                   np.tile(offs, (len(toks[i:i + batch]), 1)), span)
                                       for i in range(0, free, batch)])))  # wide: X in batches of ≤ 256 MB
    Us, Vs = np.concatenate(Us, axis=1), np.concatenate(Vs, axis=1)  # (H, vectors, d)
    toks = np.concatenate([t for t, _ in seqs])
    ell = np.concatenate([e for _, e in seqs])
    R = [rotation_matrix(float(o), theta, dh) for o in offs]
    large = wide_logits.wide(len(toks), dh)  # the d_h² × d_h² solves without forming them
    Wq, Wk = [], []
    for h in range(H):
        U = np.linalg.svd(Us[h].T, full_matrices=False)[0][:, :dh]
        V = np.linalg.svd(Vs[h].T, full_matrices=False)[0][:, :dh]
        zq = toks[:, -1] @ U
        Ms = []
        for j in range(m):
            kx = toks[:, j] @ V
            if large:
                ok = np.isfinite(ell[:, h, j])
                Ms.append(wide_logits.reduced_logit_matrix(zq[ok], kx[ok], ell[ok, h, j], reliability(ell[ok, h, j])))
                continue
            Ms.append(_regress((zq[:, :, None] * kx[:, None, :]).reshape(len(zq), -1), ell[:, h, j]).reshape(dh, dh))
        ref = np.linalg.inv(Ms[0])
        if large:
            Ak = wide_logits.rotation_gauge([ref @ Ms[j] for j in range(1, m)],
                                            [R[j] @ R[0].T for j in range(1, m)], rng)
        else:
            eye = np.eye(dh)
            rows = [np.kron((ref @ Ms[j]).T, eye) - np.kron(eye, R[j] @ R[0].T) for j in range(1, m)]
            null = np.linalg.svd(np.concatenate(rows), full_matrices=False)[2][-dh:]  # vec (column-major) of A_K
            Ak = (rng.standard_normal(dh) @ null).reshape(dh, dh, order="F")
        lhs = np.concatenate([R[j] @ Ak for j in range(m)], axis=1)
        AqT = np.linalg.lstsq(lhs.T, np.concatenate(Ms, axis=1).T, rcond=None)[0].T
        q, k = refine_logit_maps(AqT.T @ U.T, Ak @ V.T, toks, offs, ell[:, h], theta, rounds)
        Wq.append(q)
        Wk.append(k)
    return np.array(Wq), np.array(Wk), len(toks)


def refine_logit_maps(Wq, Wk, toks, offs, ell, theta, rounds: int = ALS_ROUNDS):
    """Alternating least squares on ``ell[b, j] ≈ (W_Q z_b)ᵀ R(δ_j) (W_K x_bj)`` (the query ``z_b = toks[b, −1]``
    at offset 0 last) over every finite sample, from ``(Wq, Wk)``: a start near the answer converges in a few
    rounds (from a random one it crawls: 10 % misfit after 12 rounds on exact logits at d = 32)."""
    if rounds < 1:  # nothing to refine (wide heads): not even the samples' rotations (57 GB at d = 256, d_h = 128)
        return Wq, Wk
    dh, d = Wq.shape
    B, T1, _ = toks.shape
    delta = np.tile(np.append(offs, 0), B)
    z = np.repeat(toks[:, -1], T1, axis=0)
    x = toks.reshape(-1, d)
    y = ell.reshape(-1)
    ok = np.isfinite(y)
    z, x, delta, y = z[ok], x[ok], delta[ok], y[ok]
    rots = {int(o): rotation_matrix(float(o), theta, dh) for o in np.unique(delta)}
    R = np.stack([rots[int(o)] for o in delta])
    w = reliability(y)
    for _ in range(rounds):
        Wq = _bilinear_solve(np.einsum("nab,bd,nd->na", R, Wk, x), z, y, w)
        Wk = _bilinear_solve(np.einsum("nba,bd,nd->na", R, Wq, z), x, y, w)
    return Wq, Wk


def _bilinear_solve(a: np.ndarray, b: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """``W`` (p, d) minimising ``Σ_n w_n² (a_nᵀ W b_n − y_n)²`` (normal equations, a tiny ridge for the gauge)."""
    if w is not None:
        a, y = a * w[:, None], y * w
    F = (a[:, :, None] * b[:, None, :]).reshape(len(y), -1)
    A = F.T @ F
    A[np.diag_indices_from(A)] += 1e-10 * np.trace(A) / len(A)
    return np.linalg.solve(A, F.T @ y).reshape(a.shape[1], b.shape[1])


def coarse_value_maps(oracle, M: np.ndarray, Cb: np.ndarray, rng: np.random.Generator, H: int, *,
                      per: int = VALUE_QUERIES, trims: int = TRIMS, query_scale: float = 1.0,
                      kernel: np.ndarray | None = None, row_space: bool = False) -> np.ndarray:
    """Every head's value map ``V_h`` (H, K, d) from the pair probe's directions at ``per·d`` independent random
    queries ``z``: each direction is labelled by the head whose rough output space (``Cb``, from the walk) holds
    it best, scaled so that the directions sum to ``M z = Σ_h V_h z``, and ``V_h`` is the least-squares map
    ``z ↦ V_h z`` over every query, those it misses by more than 3× the median dropped ``trims`` times.
    Independent queries spread over every direction of ``V_h``, where the walk's nearby ones span each head's
    space poorly (measured, float32 answers at d = 32: the walk's spaces 5e-3 … 7e-3 off, ``V_h`` 3e-5 off from
    6d queries). ``query_scale``: the queries' entries' size (smaller where large logits leave a head's zero keys
    almost no weight, and its direction in the rounding); ``kernel``: the key probe inside it
    (:func:`probe_directions`: q/k biases). ``row_space``: ``per·r`` queries instead of ``per·d``, ``V_h`` regressed
    on the coordinates of ``M``'s row space (rank ``r``, the complement of ``kernel``: every ``V_h`` vanishes on the
    kernel), ``r = d/4`` at LLaMA-3's GQA (docs/positional.md, "The start at LLaMA-3-8B's size")."""
    from scipy.optimize import linear_sum_assignment

    d, K = oracle.d, M.shape[0]
    dh = Cb.shape[1] // H
    P = [np.linalg.qr(Cb[:, h * dh:(h + 1) * dh])[0] for h in range(H)]
    E, probe = probe_directions(d, rng, H + 4, kernel)
    kw = dict(eta=COARSE_STEP * math.sqrt(d), rank=H, noise=0.0, rng=rng, **probe)
    basis = row_space_basis(kernel, d) if row_space else None
    Z = rng.standard_normal((per * (d if basis is None else len(basis)), d)) * query_scale
    S = np.empty((len(Z), K, H))
    for i, z in enumerate(Z):
        W, _, _ = head_directions(oracle, z, E, **kw)
        fit = np.array([[np.linalg.norm(P[h].T @ W[:, j]) for j in range(H)] for h in range(H)])
        rows, cols = linear_sum_assignment(-fit)
        W = W[:, cols[np.argsort(rows)]]
        S[i] = W * np.linalg.lstsq(W, M @ z, rcond=None)[0]
    V = np.empty((H, K, d))
    coords = Z if basis is None else Z @ basis.T
    for h in range(H):
        ok = np.ones(len(Z), dtype=bool)
        for _ in range(trims + 1):
            fit = np.linalg.lstsq(coords[ok], S[ok, :, h], rcond=None)[0].T
            V[h] = fit if basis is None else fit @ basis
            miss = np.linalg.norm(Z @ V[h].T - S[:, :, h], axis=1) / np.linalg.norm(S[:, :, h], axis=1)
            ok = miss <= 3 * np.median(miss)
            if ok.sum() < coords.shape[1]:
                raise RecoveryError(f"head {h}'s value map is not read consistently at the random queries (fewer than "
                                    f"{coords.shape[1]} of {len(Z)} fit within 3× the median); the answers are not "
                                    "those of bias-free RoPE heads")
    return V


def row_space_basis(kernel: np.ndarray | None, d: int) -> np.ndarray:
    """Orthonormal rows spanning the complement of ``kernel``'s rows (the value maps' common row space); refused
    without a kernel."""
    if kernel is None:
        raise RecoveryError("the value maps' row space needs the kernel of M (heads sharing keys and values)")
    Q = np.linalg.svd(np.asarray(kernel, dtype=np.float64), full_matrices=True)[2]
    return Q[len(kernel):]


def split_value_maps(V: np.ndarray, M: np.ndarray):
    """``Cb (K, H·d_h)`` (each head's output space, its ``d_h = K/H`` leading left singular vectors) and ``G`` with
    ``V_h = C_h G_h``, the split of ``M`` (more accurate than the sum of the ``V_h``)."""
    H, K, _ = V.shape
    dh = K // H
    Cb = np.concatenate([np.linalg.svd(V[h], full_matrices=False)[0][:, :dh] for h in range(H)], axis=1)
    return Cb, (np.linalg.pinv(Cb) @ M).reshape(H, dh, -1)


def coarse_queries(d: int, H: int, outputs: int | None = None, *, walk: int = 1, per: int = VALUE_QUERIES,
                   biases: bool = False) -> int:
    """Queries :func:`coarse_start` asks (the walk's halved steps apart): values, the walk, the value maps, the
    token-scale probe and the logit maps' sequences (the logits' size probe first; ``biases``: the
    token scale's 16 with the keys flipped, and
    :func:`~.coarse_bias.biased_logit_maps`'s sequences)."""
    K = outputs or d
    dh = K // H
    probe = 2 * NODES * len(SETTINGS)
    first = min(d, 2 * H + 8)
    if biases:  # the first probe's directions lie in the kernel of M: at most d − d_h dimensions (one KV group)

        logits = TOKEN_PAIRS + 16 + coarse_bias.biased_logit_map_queries(d, dh,
                                                                         extra=logit_settings(d, dh).get("extra", 16))
        first = min(d - dh, first)
    else:  # the logits' size probe (token_scale.py) first, with or without biases
        logits = TOKEN_PAIRS + logit_map_queries(d, dh, extra=logit_settings(d, dh).get("extra", 16))
    return (2 * d * VALUE_REPEATS + probe * first + probe * (H + 4) * (walk * math.ceil(K / H) + 4)
            + probe * (H + 4) * per * d + 16 + logits)


def logit_settings(d: int, dh: int) -> dict:
    """The float32 route's :func:`logit_maps` settings for heads of width ``dh`` at width ``d``: its defaults, and
    for wide heads (``dh·d > DENSE_ALS``) ``LOGIT_EXTRA·d`` extra sequences and no alternating least squares."""
    return {} if dh * d <= DENSE_ALS else {"extra": LOGIT_EXTRA * d, "rounds": 0}


def logit_map_queries(d: int, dh: int, *, extra: int = 16, query_sets: int | None = None,
                      samples: int = SAMPLES_PER_ENTRY) -> int:
    """Sequences :func:`logit_maps` asks with these settings: ``sets`` fixed key sets and ``query_sets`` fixed
    queries (default ``sets``) of ``d + extra`` sequences each, and ``samples`` per entry of the ``d_h × d_h``
    reduced logit matrices."""
    m = len(kept_offsets(LOGIT_OFFSETS, dh))  # the offsets logit_maps keeps
    sets = math.ceil((dh + extra) / m)
    return (sets + (query_sets or sets)) * (d + extra) + samples * dh * dh


def key_probe_kernel(M: np.ndarray, H: int, key_probe: bool | None = None) -> np.ndarray | None:
    """The bias-free route's choice of head probe: rows spanning the kernel of ``M`` (the key probe,
    :func:`probe_directions`) or None (the pair probe). ``key_probe`` None: the key probe for wide heads
    (``d_h·d`` above :data:`DENSE_ALS`) whose ``M`` has a kernel (heads sharing keys and values, LLaMA's GQA), the
    pair probe otherwise (LLaMA d = 128, 8/2, float32: each ``V_h`` 1.1e-4 … 1.5e-4 off and the start 5.6e-4 from
    the float64 module with the key probe; 1.0e-3 … 1.2e-3 and 4.3e-3 with the pair probe; docs/positional.md,
    "d = 128, 8/2: where the start breaks"); True: the key probe (refused without a kernel); False: the pair
    probe."""

    if key_probe is False:
        return None
    if key_probe is None:
        if (M.shape[0] // H) * M.shape[1] <= DENSE_ALS:
            return None
        try:
            return coarse_bias.coarse_kernel(M, H)
        except UnidentifiableError:
            return None
    return coarse_bias.coarse_kernel(M, H)


def coarse_start(oracle, H: int, rng: np.random.Generator, *, base: float | None = None, walk: int = 1,
                 per: int = VALUE_QUERIES, biases: bool = False, key_probe: bool | None = None,
                 theta: np.ndarray | None = None):
    """A start for the polish from coarse answers (module docstring, stages 1–3): a :class:`PositionalAttention`
    (one key and value map per head) and a dict of what each stage measured. ``biases``: q/k biases (Qwen2;
    :mod:`.coarse_bias`): the heads from the key probe inside the kernel of ``M``, the token scale from the keys'
    odd part of the log-weights, and the logit maps with the biases. ``key_probe``: the bias-free heads' probe
    (:func:`key_probe_kernel`; default: the key probe for wide heads sharing keys and values). ``theta``: the
    frequencies the oracle declares (a folder's config), used when they fill the heads' width (else ``base``'s)."""

    d = oracle.d
    rho = math.sqrt(d)
    M, c = coarse_values(oracle, rng, rho)
    # small weights: the probes on tokens scaled up to logits of order one (token_scale.py; q/k biases stay as they
    # are in the scaled layer, the value and output biases shrink with it)
    up, flat = token_scale(oracle, M, c, rng, rho)
    if up != 1.0:
        oracle, c = ScaledTokens(oracle, up), c / up
    kernel = coarse_bias.coarse_kernel(M, H) if biases else key_probe_kernel(M, H, key_probe)
    rough, G = coarse_output_spaces(oracle, M, rng, H, walk, kernel=kernel)
    probe = rng.standard_normal((16, len(LOGIT_OFFSETS) + 1, d))  # the logits' size, read in the rough spaces
    ell = log_weights(oracle, rough, G, c, probe, np.tile(LOGIT_OFFSETS, (16, 1)), -min(LOGIT_OFFSETS))
    if biases:  # the biases' terms do not grow with the tokens: the keys' odd part alone
        flip = probe.copy()
        flip[:, :-1] *= -1
        ell = (ell - log_weights(oracle, rough, G, c, flip, np.tile(LOGIT_OFFSETS, (16, 1)), -min(LOGIT_OFFSETS))) / 2
    med = max(float(np.nanmedian(np.abs(ell))), 1e-12)
    scale = float(np.clip(math.sqrt(TARGET_LOGIT / med), 1e-3, 1e3))
    Cb, G = split_value_maps(coarse_value_maps(oracle, M, rough, rng, H, per=per, kernel=kernel,
                                               query_scale=min(1.0, math.sqrt(PROBE_LOGIT / med))), M)
    dh = G.shape[1]
    held = theta is not None and len(theta) == dh // 2
    theta = np.asarray(theta, dtype=np.float64) if held else rope_frequencies(dh, base or DEFAULT_BASE)
    bq = bk = None
    if biases:
        Wq, Wk, bq, bk, count = coarse_bias.biased_logit_maps(oracle, rng, Cb, G, c, theta, scale,
                                                              **logit_settings(d, dh))
    else:
        Wq, Wk, count = logit_maps(oracle, rng, Cb, G, c, theta, scale, **logit_settings(d, dh))
    model = unscale(PositionalAttention(Wq, Wk, G, Cb, bq=bq, bk=bk, bo=c, position="rope", inv_freq=theta,
                                        layout="half", scale=1.0, causal=True), up)
    return model, {"logit_sequences": count, "token_scale": scale, "tokens_scaled_up": up,
                   "logit_difference": flat, "head_probe": "pair" if kernel is None else "key",
                   "frequencies": "declared" if held else "from base"}


def extract_coarse_positional(oracle, *, heads, seed=0, check=True, progress=None, walk: int = 1,
                              base: float | None = None, per: int = VALUE_QUERIES, asked_before=None,
                              biases: bool | None = None):
    """RoPE attention (LLaMA, Mistral; Qwen2 with ``biases``) from float32 answers at the last position:
    :func:`coarse_start`, checked; the learners' hook (:func:`~.polish_hook.polish_extraction`) then polishes it
    on fresh answers, the frequencies fitted from ``base`` (default :data:`DEFAULT_BASE`). Needs the number of heads.
    ``biases``: q/k biases (:mod:`.coarse_bias`; default: as the oracle declares, a Hugging Face folder's config)."""
    from attnprobe.errors import ConfigError
    from attnprobe.learners.core.skeleton import Run
    from attnprobe.learners.positional.method import CHECK_LENGTHS, METHOD

    from attnprobe.oracles.wrappers import declared_attribute

    if biases is None:  # a Hugging Face folder says so (Qwen2)
        biases = bool(declared_attribute(oracle.fn, "qk_biases"))
    if heads is None:  # a Hugging Face folder declares them (its config)
        heads = declared_attribute(oracle.fn, "heads", accept=lambda v: isinstance(v, int) and v >= 1)
    # a folder's rotation (its config) is held through the polish; the answers determine the lowest frequencies
    # only weakly where the logits are small (a 0.02-init LLaMA folder's lowest came out 38 % off, docs/positional.md)
    declared = declared_attribute(oracle.fn, "rotary_frequencies") if base is None else None
    if heads is None:
        raise ConfigError("the RoPE route for float32 answers needs the number of heads (the pair probe's rank has no "
                          "gap at float32's rounding)", param="heads")
    d = oracle.d
    run = Run(oracle, METHOD, seed=seed, check=check, check_lengths=CHECK_LENGTHS, progress=progress,
              asked_before=asked_before)
    run.plan(coarse_queries(d, heads, oracle.outputs, walk=walk, per=per, biases=biases),
             f"the positional learner on {oracle.precision} answers at d={d}", at_least=True)
    with run.phase("coarse start"):
        model, measured = coarse_start(oracle, heads, run.rng, base=base, walk=walk, per=per, biases=biases,
                                       theta=declared)
    run.report()
    K = model.outputs
    unknowns = PositionalAttention.unknowns(d, heads, heads, K // heads, K, bias=biases)
    details = {"heads": heads, "head_dim": K // heads, "route": "coarse", "base_start": base or DEFAULT_BASE,
               "polish_plan": {"sequences": POLISH_PER * math.ceil(unknowns / K), "rounds": POLISH_ROUNDS,
                               "relative": True, "work": POLISH_WORK,
                               "frequencies": measured["frequencies"] != "declared"},
               "qk_biases": biases, **measured}
    rotation = ("the frequencies the oracle declares (its config's rotation), held through the polish"
                if measured["frequencies"] == "declared" else
                f"frequencies from base {base or DEFAULT_BASE:g}, fitted by the polish")
    heads_from = ("; q/k biases: the heads from the key probe inside the kernel of the value maps, the biases with "
                  "the logit maps" if biases else
                  "; the heads from the key probe inside the kernel of the value maps (heads sharing keys and values)"
                  if measured["head_probe"] == "key" else "")
    notes = [f"{oracle.precision} answers: the coarse RoPE route (averaged probes, value maps at {per}·d random "
             f"queries, logit maps from log-weights; {rotation}){heads_from}"]
    return run.finish(model, unknowns=unknowns, details=details, notes=notes, check_fn=worst_length_check)


def worst_length_check(oracle, model, rng, lengths, per_length):
    """The route's functional check: the largest relative error of any length (``norm="worst"``), the error the
    route claims (the RMS over lengths hid a 9× larger error at length 256: 2.4e-4 against 2.2e-3, d = 32)."""
    from attnprobe.learners.core.check import functional_check

    return functional_check(oracle, model, rng, lengths, per_length, norm="worst")
