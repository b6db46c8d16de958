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

#: the query block's lengths m
BLOCKS = (1, 4, 16, 64)
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
              starts: int = STARTS, blocks=BLOCKS, zeros=ZEROS):
    """One query's answers ``Y`` (rows, K) less ``c`` as ``Σ_h shape_h ⊗ u_h`` (module docstring): variable
    projection over the centres (H, len(blocks)) from ``start`` or ``starts`` random ones, in the answers' leading
    H right singular directions. Returns ``U`` (H, K) (``u_h = V_h z``), the centres and the relative misfit."""
    P = np.linalg.svd(Y, full_matrices=False)[2][:H].T
    Yr = Y @ P
    shape = (H, len(blocks))

    def residual(p):
        F = sweep_shapes(p.reshape(shape), blocks, zeros)
        return (F @ np.linalg.lstsq(F, Yr, rcond=None)[0] - Yr).ravel()

    if start is not None:
        tries = [np.asarray(start, dtype=np.float64)]
    else:
        tries = [rng.uniform(*START_RANGE, H)[:, None] + np.log(np.asarray(blocks, dtype=np.float64))[None]
                 for _ in range(starts)]
    best = min((least_squares(residual, np.clip(t.ravel(), *CENTRES), bounds=CENTRES) for t in tries),
               key=lambda r: r.cost)
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
                step: float = 0.3):
    """Rough output spaces (H, K, d_h) from the sweep along a walk of ``steps`` nearby queries (each fit started at
    the previous one's centres, each head's ``V_h z`` matched to the previous by |cos|): the span of each head's
    directions. Costs ``(steps + 1)·len(BLOCKS)·len(ZEROS)`` queries."""
    d, K = oracle.d, c.shape[0]
    dh = K // H
    z = rng.standard_normal(d) * scale
    U, logS, _ = fit_sweep(sweep_answers(oracle, z[None])[0] - c, H, rng)
    dirs = [U]
    for _ in range(steps):
        q = rng.standard_normal(d)
        z = z + step * np.linalg.norm(z) * q / np.linalg.norm(q)
        z *= scale * math.sqrt(d) / np.linalg.norm(z)
        U, logS, _ = fit_sweep(sweep_answers(oracle, z[None])[0] - c, H, rng, start=logS)
        U = _assign(dirs[-1], U)
        dirs.append(U)
    D = np.stack(dirs)  # (steps + 1, H, K)
    return np.stack([np.linalg.svd(D[:, h].T, full_matrices=False)[0][:, :dh] for h in range(H)])


def sweep_value_maps(oracle, c: np.ndarray, H: int, rng: np.random.Generator, *, per: int, scale: float = QUERY_SCALE,
                     walk: int = 1, batch: int = 64, trims: int = TRIMS):
    """Every head's value map ``V_h`` (H, K, d) from the sweep at ``per·d`` independent random queries: each
    query's ``V_h z`` labelled by the head whose rough space (:func:`walk_spaces`) holds it best, ``V_h`` the
    least-squares map ``z ↦ V_h z`` with outlying queries dropped. Returns ``V`` and the median misfit."""
    d, K = oracle.d, c.shape[0]
    rough = walk_spaces(oracle, c, H, rng, scale=scale, steps=walk * math.ceil(K / H) + 4)
    Z = rng.standard_normal((per * d, d)) * scale
    S = np.empty((len(Z), H, K))
    misfits = []
    for at in range(0, len(Z), batch):
        Y = sweep_answers(oracle, Z[at:at + batch]) - c
        for i, y in enumerate(Y):
            U, _, misfit = fit_sweep(y, H, rng)
            fit = np.linalg.norm(np.einsum("hkj,gk->hgj", rough, U), axis=2)  # (head space, direction)
            rows, cols = linear_sum_assignment(-fit)
            S[at + i] = U[cols[np.argsort(rows)]]
            misfits.append(misfit)
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


def sweep_queries(d: int, H: int, outputs: int | None = None, *, per: int, walk: int = 1) -> int:
    """Queries :func:`sweep_value_maps` asks."""
    K = outputs or d
    return (per * d + walk * math.ceil(K / H) + 5) * len(BLOCKS) * len(ZEROS)
