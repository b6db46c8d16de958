"""Each RoPE head's value map from how its weight falls with the number of zero keys (bfloat16 answers;
docs/positional.md, "bfloat16 answers").

Sequence ``[0 × n, z × m]``: zero keys carry no value and, without biases, logit 0, so head ``h`` gives the block
of ``m`` copies of the query ``z`` the weight ``S_hm / (n + S_hm)`` with ``S_hm = Σ_{δ<m} exp(zᵀ B_h(−δ) z)``, and

    ``y(n, m) − c = Σ_h S_hm / (n + S_hm) · V_h z``

— a sum of H known shapes in ``n`` (logistic in ``log n``, centred at ``log S_hm``) with vector coefficients
``V_h z``. At ``n = 0`` every shape is 1 (``y = M z + c``). The pair probe of the float32 route
(:mod:`.coarse`) differentiates the answer, a signal ~1e-2 of it that bfloat16 rounds away; here every head's
share moves from all to nothing of the answer, and a variable-projection fit of the ``H × |m|`` centres (the
coefficients by linear least squares) reads ``V_h z`` to ~0.4 % from bfloat16 answers (d = 32; a single block
``m = 1`` leaves heads whose query weighs below a zero key with one shape, ``e^b/n``: 5 … 9 % off). Over
independent random queries, labelled by a walk of nearby ones, least squares gives ``V_h``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import least_squares, linear_sum_assignment

from attnprobe.errors import RecoveryError

#: the query block's lengths m (two heads; :func:`sweep_blocks`)
BLOCKS = (1, 4, 16, 64)
#: ... and for more heads: twelve blocks. At d = 128, 8/2 heads (bfloat16 LLaMA, 5 random queries), the fit with
#: four blocks left each query's worst ``V_h z`` 1.2 … 4e4 off; with twelve 1.3 … 5.9 % (exact shapes: 2.7 %)
MANY_BLOCKS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: the numbers of zero keys n before the block (0, then geometric up to 512)
ZEROS = tuple(int(n) for n in np.unique(np.concatenate([[0], np.round(np.geomspace(1, 512, 24))])))
#: random starts of each query's fit (the centres: log S_hm = b + log m, b uniform in START_RANGE)
STARTS, START_RANGE = 8, (-3.0, 5.0)
#: the centres' range (log S: a head with S far below 1 or far above the longest sweep has one shape left)
CENTRES = (-15.0, 20.0)
#: the queries' entries' size relative to the token scale: the heads' self-logits spread over a few units
QUERY_SCALE = 2.0
#: rounds of dropping the value maps' outlying queries (those missed by more than 3× the median)
TRIMS = 3
#: a query's fit is accepted at a misfit within this factor of the walk's median (the rounding floor): random
#: starts stop there, and queries left above it are dropped (a fit in a wrong minimum has 2 … 13× the floor at
#: d = 128)
FLOOR_FACTOR = 1.3


def sweep_blocks(H: int) -> tuple:
    """The block lengths the sweep uses for ``H`` heads: :data:`BLOCKS` up to two heads, else :data:`MANY_BLOCKS`."""
    return BLOCKS if H <= 2 else MANY_BLOCKS


def sweep_answers(oracle, Z: np.ndarray, blocks=BLOCKS, zeros=ZEROS) -> np.ndarray:
    """The answers to ``[0 × n, z × m]`` for every query ``z`` (rows of ``Z``), block length ``m`` and count ``n``:
    (len(Z), len(blocks)·len(zeros), K), rows ordered block-major. One oracle call per ``(m, n)``."""
    B, d = Z.shape
    out = []
    for m in blocks:
        for n in zeros:
            X = np.zeros((B, n + m, d))
            X[:, n:] = Z[:, None]
            out.append(np.asarray(oracle(X), dtype=np.float64))
    return np.stack(out, axis=1)


def sweep_shapes(logS: np.ndarray, blocks=BLOCKS, zeros=ZEROS) -> np.ndarray:
    """Every head's weight of the query block ``S/(n + S)`` at each row of :func:`sweep_answers`: (rows, H) from
    the centres ``logS`` (H, len(blocks))."""
    S = np.exp(np.clip(logS, *CENTRES))  # (H, blocks)
    n = np.asarray(zeros, dtype=np.float64)
    return (S[:, :, None] / (n[None, None, :] + S[:, :, None])).reshape(len(S), -1).T


def fit_sweep(Y: np.ndarray, H: int, rng: np.random.Generator, *, start: np.ndarray | None = None,
              starts: int = STARTS, blocks=BLOCKS, zeros=ZEROS, accept: float = 0.0):
    """One query's answers ``Y`` (rows, K) less ``c`` as ``Σ_h shape_h ⊗ u_h`` (module docstring): variable
    projection over the centres (H, len(blocks)) from ``start`` or up to ``starts`` random ones (stopping at the
    first whose relative misfit is ≤ ``accept``), in the answers' leading H right singular directions (Kaufman's
    Jacobian). Returns ``U`` (H, K) (``u_h = V_h z``), the centres and the relative misfit."""
    P = np.linalg.svd(Y, full_matrices=False)[2][:H].T
    Yr = Y @ P
    shape = (H, len(blocks))

    n = np.asarray(zeros, dtype=np.float64)
    R = len(n) * len(blocks)

    def residual(p):
        F = sweep_shapes(p.reshape(shape), blocks, zeros)
        return (F @ np.linalg.lstsq(F, Yr, rcond=None)[0] - Yr).ravel()

    def jacobian(p):  # Kaufman's variable-projection Jacobian: P⊥ (∂F/∂log S_hb) c_h, one column per centre
        logS = np.clip(p.reshape(shape), *CENTRES)
        F = sweep_shapes(logS, blocks, zeros)
        Q = np.linalg.qr(F)[0]
        coef = np.linalg.lstsq(F, Yr, rcond=None)[0]  # (H, H)
        S = np.exp(logS)[:, :, None]
        dF = np.zeros((R, H * len(blocks)))
        slope = (S * n / (n + S) ** 2)  # (H, blocks, zeros): d(S/(n + S))/d log S
        for h in range(H):
            for b in range(len(blocks)):
                dF[b * len(n):(b + 1) * len(n), h * len(blocks) + b] = slope[h, b]
        dF -= Q @ (Q.T @ dF)
        inside = ((p > CENTRES[0]) & (p < CENTRES[1])).astype(np.float64)
        J = dF[:, :, None] * np.repeat(coef, len(blocks), axis=0)[None] * inside[None, :, None]  # (R, params, H)
        return J.transpose(0, 2, 1).reshape(R * Yr.shape[1], -1)

    if start is not None:
        tries = [np.asarray(start, dtype=np.float64)]
    else:
        tries = [rng.uniform(*START_RANGE, H)[:, None] + np.log(np.asarray(blocks, dtype=np.float64))[None]
                 for _ in range(starts)]
    rest = max(0.0, float(np.sum(Y ** 2) - np.sum(Yr ** 2)))  # outside the leading H directions
    best = None
    for t in tries:
        fit = least_squares(residual, np.clip(t.ravel(), *CENTRES), jac=jacobian, bounds=CENTRES)
        if best is None or fit.cost < best.cost:
            best = fit
        if math.sqrt(2 * best.cost + rest) <= accept * np.linalg.norm(Y):
            break
    logS = best.x.reshape(shape)
    F = sweep_shapes(logS, blocks, zeros)
    U = np.linalg.lstsq(F, Y, rcond=None)[0]
    return U, logS, float(np.linalg.norm(F @ U - Y) / np.linalg.norm(Y))


def _assign(ref: np.ndarray, U: np.ndarray) -> np.ndarray:
    """The rows of ``U`` (H, K) reordered to follow the rows of ``ref`` (largest |cos| assignment)."""
    a = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    b = U / np.linalg.norm(U, axis=1, keepdims=True)
    rows, cols = linear_sum_assignment(-np.abs(a @ b.T))
    return U[cols[np.argsort(rows)]]


def walk_spaces(oracle, c: np.ndarray, H: int, rng: np.random.Generator, *, scale: float, steps: int,
                step: float = 0.3, blocks=BLOCKS, retry: bool = False):
    """Rough output spaces (H, K, d_h) from the sweep along a walk of ``steps`` nearby queries (each fit started at
    the previous one's centres, each head's ``V_h z`` matched to the previous by |cos|): the span of each head's
    directions, and the walk's median misfit (the rounding floor). ``retry``: a step whose misfit is above
    :data:`FLOOR_FACTOR` × the median so far is fitted again from random starts (a wrong minimum would break the
    labels). Costs ``(steps + 1)·len(blocks)·len(ZEROS)`` queries."""
    d, K = oracle.d, c.shape[0]
    dh = K // H
    z = rng.standard_normal(d) * scale
    U, logS, misfit = fit_sweep(sweep_answers(oracle, z[None], blocks)[0] - c, H, rng, blocks=blocks)
    dirs, misfits = [U], [misfit]
    for _ in range(steps):
        q = rng.standard_normal(d)
        z = z + step * np.linalg.norm(z) * q / np.linalg.norm(q)
        z *= scale * math.sqrt(d) / np.linalg.norm(z)
        Y = sweep_answers(oracle, z[None], blocks)[0] - c
        U, found, misfit = fit_sweep(Y, H, rng, start=logS, blocks=blocks)
        floor = FLOOR_FACTOR * float(np.median(misfits))
        if retry and misfit > floor:
            again = fit_sweep(Y, H, rng, blocks=blocks, accept=floor)
            if again[2] < misfit:
                U, found, misfit = again
        logS = found
        U = _assign(dirs[-1], U)
        dirs.append(U)
        misfits.append(misfit)
    D = np.stack(dirs)  # (steps + 1, H, K)
    return (np.stack([np.linalg.svd(D[:, h].T, full_matrices=False)[0][:, :dh] for h in range(H)]),
            float(np.median(misfits)))


def label_directions(spaces: np.ndarray, U: np.ndarray) -> np.ndarray:
    """One query's directions ``U`` (H, K) reordered so that row ``h`` is the one head ``h``'s space (H, K, d_h)
    holds best (an assignment)."""
    fit = np.linalg.norm(np.einsum("hkj,gk->hgj", spaces, U), axis=2) / np.linalg.norm(U, axis=1)[None]
    rows, cols = linear_sum_assignment(-fit)
    return U[cols[np.argsort(rows)]]


def output_spaces(S: np.ndarray, rough: np.ndarray, *, rounds: int = TRIMS) -> np.ndarray:
    """Each head's output space (H, K, d_h) from labelled directions ``S`` (queries, H, K): the leading ``d_h`` left
    singular vectors of the directions each space holds (each query relabelled by the spaces of the round before,
    from ``rough``; directions farther from their space than 3× the median dropped). Needs ≥ d_h directions a
    head."""
    H, K, dh = rough.shape
    spaces = rough
    unit = S / np.linalg.norm(S, axis=2, keepdims=True)
    for _ in range(rounds + 1):
        L = np.stack([label_directions(spaces, u) for u in unit])
        new = np.empty_like(spaces)
        for h in range(H):
            miss = np.linalg.norm(L[:, h] - np.einsum("kj,nj->nk", spaces[h], L[:, h] @ spaces[h]), axis=1)
            ok = miss <= 3 * max(np.median(miss), 1e-12)
            if ok.sum() < dh:
                raise RecoveryError(f"head {h}'s output space is held by fewer than d_h = {dh} of {len(S)} of the "
                                    "sweep's directions; the answers are not those of bias-free RoPE heads")
            new[h] = np.linalg.svd(L[ok, h].T, full_matrices=False)[0][:, :dh]
        spaces = new
    return spaces


def sweep_value_maps(oracle, c: np.ndarray, H: int, rng: np.random.Generator, *, per: int, scale: float = QUERY_SCALE,
                     walk: int = 1, batch: int = 64, trims: int = TRIMS, M: np.ndarray | None = None,
                     spaces: int | None = None):
    """Every head's value map ``V_h`` (H, K, d) from the sweep at ``per·d`` independent random queries: each
    query's ``V_h z`` labelled by the head whose rough space (:func:`walk_spaces`) holds it best, ``V_h`` the
    least-squares map ``z ↦ V_h z`` with outlying queries dropped. With ``M`` (``Σ_h V_h``) and ``spaces``: at
    ``spaces·d_h`` random queries instead, each fitted until its misfit is within :data:`FLOOR_FACTOR` of the
    walk's (queries above it dropped), each head's output space ``C_h`` from its labelled directions
    (:func:`output_spaces`) and ``V_h = C_h G_h`` with ``G = [C_1 … C_H]⁺ M``: d_h directions per head suffice
    where the map ``z ↦ V_h z`` needs d. Returns ``V`` and the median misfit."""
    d, K = oracle.d, c.shape[0]
    dh = K // H
    by_space = M is not None and spaces is not None
    blocks = sweep_blocks(H) if by_space else BLOCKS
    rough, floor = walk_spaces(oracle, c, H, rng, scale=scale, steps=walk * math.ceil(K / H) + 4, blocks=blocks,
                               retry=by_space)
    accept = FLOOR_FACTOR * floor if by_space else 0.0
    Z = rng.standard_normal((spaces * dh if by_space else per * d, d)) * scale
    S = np.empty((len(Z), H, K))
    misfits = []
    for at in range(0, len(Z), batch):
        Y = sweep_answers(oracle, Z[at:at + batch], blocks) - c
        for i, y in enumerate(Y):
            U, _, misfit = fit_sweep(y, H, rng, blocks=blocks, accept=accept)
            S[at + i] = label_directions(rough, U)
            misfits.append(misfit)
    if by_space:
        kept = np.asarray(misfits) <= accept
        if kept.sum() < dh:
            raise RecoveryError(f"the sweep fitted {kept.sum()} of {len(Z)} random queries within {FLOOR_FACTOR}× the "
                                f"walk's misfit {floor:.1e} (needs d_h = {dh}); the answers are not those of "
                                f"bias-free RoPE heads")
        C = output_spaces(S[kept], rough, rounds=trims)
        Cb = np.concatenate(list(C), axis=1)
        G = (np.linalg.pinv(Cb) @ M).reshape(H, dh, -1)
        return np.einsum("hkj,hjd->hkd", C, G), float(np.median(misfits))
    V = np.empty((H, K, d))
    for h in range(H):
        ok = np.ones(len(Z), dtype=bool)
        for _ in range(trims + 1):
            V[h] = np.linalg.lstsq(Z[ok], S[ok, h], rcond=None)[0].T
            miss = np.linalg.norm(Z @ V[h].T - S[:, h], axis=1) / np.linalg.norm(S[:, h], axis=1)
            ok = miss <= 3 * np.median(miss)
            if ok.sum() < d:
                raise RecoveryError(f"head {h}'s value map is not read consistently at the random queries (fewer than "
                                    f"d = {d} of {len(Z)} fit within 3× the median); the answers are not those of "
                                    "bias-free RoPE heads")
    return V, float(np.median(misfits))


def sweep_queries(d: int, H: int, outputs: int | None = None, *, per: int, walk: int = 1,
                  spaces: int | None = None) -> int:
    """Queries :func:`sweep_value_maps` asks (``spaces``: its mode reading output spaces, with ``M``)."""
    K = outputs or d
    if spaces is not None:
        return (spaces * (K // H) + walk * math.ceil(K / H) + 5) * len(sweep_blocks(H)) * len(ZEROS)
    return (per * d + walk * math.ceil(K / H) + 5) * len(BLOCKS) * len(ZEROS)
