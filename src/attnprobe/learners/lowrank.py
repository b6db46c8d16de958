"""Query-optimal adaptive sketch for low-rank heads (Sec. 5 setting, ``rank W ≤ r``).

A rank-r d×d matrix has ``2dr − r²`` degrees of freedom; this learner spends exactly that many bilinear
measurements ``aᵀW b`` (one two-row query ``[(a+b); b]`` each, eq. 1), plus ``2d + 1`` for ``v, u, c``:

1. **range sketch** ``M = W B`` for ``k`` random orthonormal directions ``B`` (d probes per direction, the
   column pass of Thm 4.1): ``k·d`` measurements. ``U`` = an orthonormal basis of the numerical range of ``M``
   (= range of W when ``k ≥ r``). Without a given rank the sketch grows one direction at a time until
   ``extra_columns`` directions add nothing above the answers' rounding (the detected rank).
2. **co-range sketch** ``UᵀW C`` on the orthogonal complement ``C`` of ``B``: probes ``a ∈ span(U)``, so each of
   the ``d − k`` directions costs ``r`` measurements: ``r(d − k)``.
3. ``W = U (UᵀM Bᵀ + UᵀW C Cᵀ)`` — the stable form of ``(W B)(AᵀW B)⁻¹(AᵀW)`` with ``A = U``: no inverse of a
   measured matrix is ever formed, so the error is that of the measurements themselves.

``oversample P`` measures ``P`` more range directions and uses ``r + P`` probes per co-range direction
(least squares on a tight frame of span(U)), averaging rounding noise on float32 answers. A final
*rank certificate* asks a few probes ``a ⊥ span(U)``: their logits must be ``aᵀu`` alone, otherwise the rank
was under-estimated and :class:`RecoveryError` is raised instead of returning a wrong W.
"""

from __future__ import annotations

import math
import time

import numpy as np

from attnprobe.errors import ConfigError, RecoveryError
from attnprobe.learners.check import DEFAULT_LENGTHS, check_queries, finish
from attnprobe.learners.exact import learn_value
from attnprobe.learners.scaling import TARGET_LOGIT, calibrate, max_probe_scale, measure_block, probe_scales
from attnprobe.learners.probes import equal_projection_orthogonal, random_orthogonal
from attnprobe.learners.result import Extraction
from attnprobe.learners.sigmoid import measure_logits
from attnprobe.models.attention import AttentionHead

#: a singular value of the range sketch counts when it exceeds this multiple of the sketch's rounding error
RANK_SAFETY = 10.0
#: a certificate residual counts as signal above this multiple of its rounding error
CERTIFICATE_SAFETY = 30.0
CERTIFICATE_PROBES = 8
#: calibration allowance MIN_CALIBRATION + d/8 queries: fewer than 3 probes per calibration step give scale
#: estimates off by 10x or more (measured); the allowance must not depend on the rank (detection costs ≤ 2d more)
MIN_CALIBRATION = 48
#: default --oversample for answers coarser than float64 (measured on MiniLM heads, docs/benchmarks.md)
FLOAT32_OVERSAMPLE = 4


def lowrank_dof(d: int, r: int) -> int:
    """Degrees of freedom of a rank-r d×d matrix: ``2dr − r²``."""
    return 2 * d * r - r * r


def lowrank_queries(d: int, r: int, oversample: int = 0, extra: int = 0, bias: bool = True) -> int:
    """Planned sketch queries (before calibration, retries and certificate): ``2d+1`` for v, u, c, then
    ``d(r+P+e)`` range measurements and ``(r+P)(d−r−P−e)`` co-range measurements."""
    k = min(d, r + oversample + extra)
    n_probe = min(d, r + oversample)
    return (2 * d + 1 if bias else d) + d * k + (n_probe * (d - k) if k < d else 0)


def default_oversample(oracle) -> int:
    """No oversampling for float64 answers; ``FLOAT32_OVERSAMPLE`` for anything coarser."""
    return 0 if oracle.eps < 1e-12 else FLOAT32_OVERSAMPLE


def _frame_probes(U, v, n, rng):
    """``n ≥ r`` unit probes ``a_k = U g_k (+ γ p)`` spanning span(U): ``G`` (n×r) has orthonormal columns and
    equal ``|g_kᵀUᵀv|``; ``p ⊥ span(U)`` (the part of v outside the range) lifts every ``|a_kᵀv|`` to at least
    ``‖v‖/√d`` without changing ``a_kᵀW`` (because ``pᵀW = 0`` when ``range W ⊆ span U``)."""
    d, r = U.shape
    w = np.zeros(n)
    uv = U.T @ v
    w[:r] = uv
    if np.linalg.norm(uv) > 0:
        G = equal_projection_orthogonal(w, rng)[:, :r]
    else:
        G = random_orthogonal(n, rng)[:, :r]
    A = G @ U.T
    v_perp = v - U @ uv
    n_perp, n_v = float(np.linalg.norm(v_perp)), float(np.linalg.norm(v))
    if n_perp > 1e-8 * n_v:
        gamma = n_v / (math.sqrt(d) * n_perp)
        sign = np.where(A @ v >= 0, 1.0, -1.0)
        A = A + gamma * sign[:, None] * (v_perp / n_perp)[None, :]
    return A, G


def extract_lowrank(oracle, *, rank: int | None = None, oversample: int | None = None, bias: bool = True,
                    seed: int = 0, extra_columns: int = 2, target_logit: float = TARGET_LOGIT,
                    certificate: int = CERTIFICATE_PROBES, check: bool = True, check_lengths=DEFAULT_LENGTHS,
                    progress=None, block_floats: int = 2**22) -> Extraction:
    """Recover a low-rank head ``(W, v[, u, c])`` with ``2dr − r²`` bilinear measurements (+ ``2d+1``).

    ``rank``: the rank bound r (head dimension) if known; ``None`` detects it, spending ``extra_columns``
    range directions beyond it. ``oversample``: extra range directions and co-range probes for noisy answers
    (default: 0 for float64 answers, ``FLOAT32_OVERSAMPLE`` otherwise). ``certificate``: probes outside the
    recovered range that must show no signal (0 disables the under-estimated-rank check).
    """
    d = oracle.d
    if rank is not None and not 1 <= int(rank) <= d:
        raise ConfigError(f"--rank must be between 1 and d = {d}; got {rank}")
    if oversample is not None and oversample < 0:
        raise ConfigError(f"--oversample must be ≥ 0; got {oversample}")
    if extra_columns < 1:
        raise ConfigError(f"extra_columns must be ≥ 1 to detect a rank; got {extra_columns}")
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    start = oracle.queries
    P = default_oversample(oracle) if oversample is None else int(oversample)
    report = progress or (lambda done, total: None)
    n_check = check_queries(check_lengths) if check else 0
    if rank is not None:  # up front: sketch + the most calibration and certificate can take + the check
        planned = lowrank_queries(d, int(rank), P, 0, bias) + MIN_CALIBRATION + d // 8 + certificate
        oracle.require(planned + n_check, f"low-rank extraction at d={d}, rank {rank} ({planned} sketch, "
                                          f"calibration and certificate queries + {n_check} check queries)")

    v, c, _ = learn_value(oracle, bias)
    Q = equal_projection_orthogonal(v, rng)  # range-pass probes (rows)
    Pdir = random_orthogonal(d, rng)  # rows: the directions b; the first k form B, the rest C
    r_guess = int(rank) if rank is not None else max(1, d // 8)
    allowance = MIN_CALIBRATION + d // 8  # the same with and without a given rank
    nu_u, nu_w, used, _, _ = calibrate(oracle, Q, Pdir, v, c, bias, allowance,
                                       probes_per_step=max(1, min(16, allowance // 8)))
    s_u, s_a, s_b = probe_scales(nu_u, nu_w, target_logit, max_probe_scale(oracle))
    details: dict = {"bias": bias, "seed": seed, "oversample": P, "calibration_queries": used,
                     "rank_given": rank, "scale_u": s_u, "scale_a": s_a, "scale_b": s_b}
    notes: list[str] = []
    total = lowrank_queries(d, r_guess, P, 0 if rank else extra_columns, bias) + used

    u, eta_u = np.zeros(d), 0.0
    if bias:
        Zu, _, _, Nu = measure_block(oracle, Q, np.zeros((1, d)), s_u, v, c, "orthogonal", "the query-bias pass [a; 0]",
                                  with_noise=True)
        u = Q.T @ Zu[:, 0]
        eta_u = float(np.linalg.norm(Nu[:, 0]))
    report(oracle.queries - start, total)

    # ---- 1. range sketch M = W B (columns one block at a time; grown one direction at a time without a rank)
    M = np.empty((d, d))
    eta = np.empty(d)  # rounding error bound of each column of M
    k, r_hat = 0, 0
    target_k = min(d, int(rank) + P) if rank is not None else None
    block = max(1, min(d, block_floats // (2 * d * d)))
    while True:
        if target_k is not None:
            if k >= target_k:
                break
            J = np.arange(k, min(target_k, k + block))
        else:
            J = np.arange(k, k + 1)
        Z, rms, _, N = measure_block(oracle, Q, s_b * Pdir[J], s_a, v, c, "orthogonal",
                                  f"range directions {J[0]}..{J[-1]}", with_noise=True)
        M[:, J] = (Q.T @ Z - u[:, None]) / s_b
        eta[J] = (np.linalg.norm(N, axis=0) + eta_u) / s_b
        if np.isfinite(rms) and rms > 0:
            s_a *= float(np.clip(target_logit / rms, 0.5, 2.0))
        k = J[-1] + 1
        report(oracle.queries - start, total)
        if target_k is None:
            r_hat = _numerical_rank(M[:, :k], eta[:k])
            if k >= d or r_hat <= k - extra_columns:
                break
            total = max(total, lowrank_queries(d, k + 1, P, extra_columns, bias) + used)
    Uall, sv, _ = np.linalg.svd(M[:, :k], full_matrices=False)
    tol = _rank_tolerance(eta[:k], d)
    r_num = int(np.sum(sv > tol))
    if rank is None:
        r_hat = min(r_num, max(k - extra_columns, 1)) if k < d else r_num
    else:  # trust the given bound: a direction too weak to count is measured anyway (harmless if W lacks it)
        r_hat = min(int(rank), k)
        if r_num > int(rank):
            raise RecoveryError(
                f"the range sketch has numerical rank {r_num} > --rank {rank}: W has a larger rank than given. "
                "Omit --rank to detect it, or give the true head dimension")
        if r_num < int(rank):
            notes.append(f"the range sketch has numerical rank {r_num} < --rank {rank} at the answers' rounding "
                         "(W may have a smaller rank, or the square sketch is ill-conditioned: see --oversample)")
    if r_hat == 0:
        raise RecoveryError("the range sketch shows no signal above the answers' rounding: W is 0 to the oracle's "
                            "precision (or the probes are far too small, or the answers too coarse for the sketch: float16 and "
                            "bfloat16 answers are, where the exact method still works); nothing low-rank to recover")
    details.update(range_directions=k, detected_rank=r_hat, numerical_rank=r_num, singular_values=sv[: min(k, r_hat + 4)].tolist(),
                   rank_tolerance=tol)

    if k >= d:  # the sketch already holds all of W B for an orthonormal basis B
        W = M @ Pdir
        notes.append(f"W is full rank to the answers' precision (rank {r_hat}); the sketch measured every column")
    else:
        U = Uall[:, :r_hat]
        Y_B = U.T @ M[:, :k]  # UᵀW B (denoised range part)
        # ---- 2. co-range sketch UᵀW C with r_hat + P probes a ∈ span(U) (+ a part of v outside the range)
        n_probe = min(d, r_hat + P)
        A, G = _frame_probes(U, v, n_probe, rng)
        Au = A @ u
        # RMS a_kᵀW c for unit a ∈ span(U), unit c: ‖W‖_F/√(r d) = ν_W √(d/r) (ν_W: RMS qᵀW p of random unit
        # q, p from the calibration); the sketch's own estimate is the fallback (it is poor when B is unlucky)
        nu_w2 = (nu_w * math.sqrt(d / r_hat) if nu_w else float(np.linalg.norm(Y_B)) / math.sqrt(k * n_probe))
        nu_u2 = float(np.sqrt(np.mean(Au**2))) if bias else None
        _, s_a2, s_b2 = probe_scales(nu_u2 if bias else None, nu_w2, target_logit, max_probe_scale(oracle))
        Cdir = Pdir[k:]
        Y_C = np.empty((r_hat, d - k))
        block2 = max(1, min(d - k, block_floats // (2 * d * max(n_probe, 1))))
        for j0 in range(0, d - k, block2):
            J = np.arange(j0, min(d - k, j0 + block2))
            Z, rms, _ = measure_block(oracle, A, s_b2 * Cdir[J], s_a2, v, c, "orthogonal",
                                   f"co-range directions {J[0]}..{J[-1]}")
            Y_C[:, J] = G.T @ (Z - Au[:, None]) / s_b2
            if np.isfinite(rms) and rms > 0:
                s_a2 *= float(np.clip(target_logit / rms, 0.5, 2.0))
            report(oracle.queries - start, total)
        # ---- 3. assemble W = U (UᵀW B Bᵀ + UᵀW C Cᵀ)
        W = U @ (Y_B @ Pdir[:k] + Y_C @ Cdir)
        details.update(co_range_probes=n_probe, scale_a2=s_a2, scale_b2=s_b2)
        if certificate:
            # sin∠(U, range W) ≲ error/σ_r(M), times ‖W‖ ≈ σ_1(M); random unit a ⊥ U, b see ~√r/d of it
            leak = tol / RANK_SAFETY * sv[0] / sv[r_hat - 1] * math.sqrt(r_hat) / d
            details["certificate"] = _certify(oracle, U, u, v, c, s_a, s_b, eta_u, leak, certificate, rng, rank)

    queries = oracle.queries - start
    dof = lowrank_dof(d, r_hat)
    unknowns = dof + (2 * d + 1 if bias else d)
    planned = (2 * d + 1 if bias else d) + d * k + (details.get("co_range_probes", 0) * (d - k))
    details.update(dof=dof, planned_queries=planned, full_rank_unknowns=AttentionHead.unknowns(d, bias),
                   retry_queries=queries - used - planned - details.get("certificate", {}).get("queries", 0))
    model = AttentionHead(W, v, u, c)
    result = Extraction("lowrank", model, queries, unknowns, 0.0, details=details, notes=notes)
    return finish(result, oracle, rng, check, check_lengths, t0)


def _rank_tolerance(eta: np.ndarray, d: int) -> float:
    """Spectral-norm estimate of the sketch's rounding error: a d×k matrix of independent errors with column
    norms ≤ η has spectral norm ≈ η(1 + √(k/d))."""
    return RANK_SAFETY * float(np.max(eta)) * (1.0 + math.sqrt(len(eta) / d)) + 1e-300


def _numerical_rank(M: np.ndarray, eta: np.ndarray) -> int:
    sv = np.linalg.svd(M, compute_uv=False)
    return int(np.sum(sv > _rank_tolerance(eta, M.shape[0])))


def _certify(oracle, U, u, v, c, s_a, s_b, eta_u, leak, n, rng, rank):
    """Rank certificate: ``n`` queries with random unit ``a ⊥ span(U)`` and random unit ``b``. If
    ``range W ⊆ span U`` their logits are ``s_a aᵀu`` alone; a residual above rounding means the sketch missed
    part of W (rank under-estimated) and raises :class:`RecoveryError`. ``leak`` is the typical ``|aᵀ(I − UUᵀ)W b|`` that
    rounding in the range sketch alone explains (its error times the sketch's condition number, × √r/d)."""
    d = U.shape[0]
    A = rng.standard_normal((n, d))
    A -= (A @ U) @ U.T
    v_perp = v - U @ (U.T @ v)
    n_perp = float(np.linalg.norm(v_perp))
    if n_perp > 1e-8 * float(np.linalg.norm(v)):  # keep aᵀv away from 0 so the sigmoid inverts well
        sign = np.where(A @ v_perp >= 0, 1.0, -1.0)
        A += sign[:, None] * (v_perp / n_perp)[None, :] * np.linalg.norm(A, axis=1, keepdims=True) / math.sqrt(d)
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    B = rng.standard_normal((n, d))
    B /= np.linalg.norm(B, axis=1, keepdims=True)
    before = oracle.queries
    lg = measure_logits(oracle, s_a * A, s_b * B, v, c)
    expected = s_a * (A @ u)
    resid = np.abs(lg.values - expected)
    bound = CERTIFICATE_SAFETY * (lg.noise + s_a * eta_u + s_a * s_b * leak) + 1e-300
    ratio = np.where(lg.saturated, np.inf, resid / bound)
    out = {"queries": oracle.queries - before, "max_ratio": float(np.max(ratio)),
           "max_residual_logit": float(np.max(np.where(lg.saturated, np.inf, resid)))}
    if np.any(ratio > 1.0):
        hint = (f"--rank {rank} is too small: give the true head dimension or omit --rank to detect it"
                if rank is not None else "rerun with a larger --rank or more extra columns")
        raise RecoveryError(
            f"rank certificate failed: {int(np.sum(ratio > 1))} of {n} probes outside the recovered range of W "
            f"(rank {U.shape[1]}) see attention logits up to {out['max_residual_logit']:.3g} (rounding allows "
            f"{float(np.max(bound)):.3g}), so W has directions the sketch missed; {hint}")
    return out
