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
from dataclasses import dataclass

import numpy as np

from attnprobe._validation import check_int
from attnprobe.errors import RecoveryError
from attnprobe.learners.core.check import DEFAULT_LENGTHS
from attnprobe.learners.head.exact import learn_value
from attnprobe.learners.head.scaling import TARGET_LOGIT, LogitProbe, calibrate, max_probe_scale, probe_scales
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.head.probes import equal_projection_orthogonal, first_order_queries, random_orthogonal
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.head.sigmoid import measure_logits
from attnprobe.models.attention import AttentionHead

#: a singular value of the range sketch counts when it exceeds this multiple of the sketch's rounding error
RANK_SAFETY = 10.0
#: a certificate residual counts as signal above this multiple of its rounding error
CERTIFICATE_SAFETY = 30.0
CERTIFICATE_PROBES = 8
#: calibration allowance MIN_CALIBRATION + d/8 queries: fewer than 3 probes per calibration step give scale
#: estimates off by 10x or more (measured); the allowance must not depend on the rank (detection costs ≤ 2d more)
MIN_CALIBRATION = 48
#: default oversample for answers coarser than float64 (measured on MiniLM heads, docs/benchmarks/lowrank.md)
FLOAT32_OVERSAMPLE = 4


def lowrank_dof(d: int, r: int) -> int:
    """Degrees of freedom of a rank-r d×d matrix: ``2dr − r²``."""
    return 2 * d * r - r * r


def lowrank_queries(d: int, r: int, oversample: int = 0, extra: int = 0, bias: bool = True) -> int:
    """Planned sketch queries (before calibration, retries and certificate): ``2d+1`` for v, u, c, then
    ``d(r+P+e)`` range measurements and ``(r+P)(d−r−P−e)`` co-range measurements."""
    k = min(d, r + oversample + extra)
    n_probe = min(d, r + oversample)
    return first_order_queries(d, bias) + d * k + (n_probe * (d - k) if k < d else 0)


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


@dataclass
class _Sketch:
    """State the sketch phases share: the probe (oracle, v, c), the range-pass probes ``Q`` and directions
    ``Pdir`` (rows; the first k form B, the rest C), ``u`` with its rounding error, the probe scales (``s_a``
    is steered block by block) and the progress total."""

    probe: LogitProbe
    Q: np.ndarray
    Pdir: np.ndarray
    u: np.ndarray
    eta_u: float
    s_a: float
    s_b: float
    bias: bool
    calibration: int
    total: int

    def steer_a(self, rms: float) -> None:
        if np.isfinite(rms) and rms > 0:
            self.s_a *= float(np.clip(self.probe.target / rms, 0.5, 2.0))


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
    try:
        return _extract_lowrank(oracle, rank=rank, oversample=oversample, bias=bias, seed=seed,
                                extra_columns=extra_columns, target_logit=target_logit, certificate=certificate,
                                check=check, check_lengths=check_lengths, progress=progress, block_floats=block_floats)
    except RecoveryError as exc:
        declared = declared_noise(oracle)
        if not declared or declared in str(exc):
            raise
        raise type(exc)(f"{str(exc).rstrip('.')}; {declared}") from exc


def _extract_lowrank(oracle, *, rank, oversample, bias, seed, extra_columns, target_logit, certificate, check,
                     check_lengths, progress, block_floats) -> Extraction:
    d = oracle.d
    rank = check_int(rank, "rank", min_value=1, max_value=d, allow_none=True)
    oversample = check_int(oversample, "oversample", min_value=0, allow_none=True)
    extra_columns = check_int(extra_columns, "extra_columns", min_value=1)
    certificate = check_int(certificate, "certificate", min_value=0)
    run = Run(oracle, "lowrank", scalar=True, seed=seed, check=check, check_lengths=check_lengths, progress=progress)
    P = default_oversample(oracle) if oversample is None else oversample
    allowance = MIN_CALIBRATION + d // 8  # the same with and without a given rank
    if rank is not None:  # up front: sketch + the most calibration and certificate can take + the check
        run.plan(lowrank_queries(d, rank, P, 0, bias) + allowance + certificate,
                 f"low-rank extraction at d={d}, rank {rank} (sketch, calibration and certificate)")
    else:  # the rank is detected: the sketch of a rank-1 head (1 + extra_columns range directions, 1 + P
        # co-range probes) is the least it can cost
        k0 = min(d, 1 + extra_columns)
        least = first_order_queries(d, bias) + d * k0 + min(d, 1 + P) * (d - k0)
        run.plan(least, f"low-rank extraction at d={d} (rank detected)", at_least=True)

    with run.phase("values"):
        v, c, _ = learn_value(oracle, bias)
    Q = equal_projection_orthogonal(v, run.rng)  # range-pass probes (rows)
    Pdir = random_orthogonal(d, run.rng)
    with run.phase("calibration"):
        nu_u, nu_w, used, _, _ = calibrate(oracle, Q, Pdir, v, c, bias, allowance,
                                           probes_per_step=max(1, min(16, allowance // 8)))
    s_u, s_a, s_b = probe_scales(nu_u, nu_w, target_logit, max_probe_scale(oracle))
    details: dict = {"bias": bias, "seed": seed, "oversample": P, "calibration_queries": used,
                     "rank_given": rank, "scale_u": s_u, "scale_a": s_a, "scale_b": s_b}
    notes: list[str] = []
    total = lowrank_queries(d, rank or max(1, d // 8), P, 0 if rank else extra_columns, bias) + used
    sk = _Sketch(LogitProbe(oracle, v, c, "orthogonal", target_logit), Q, Pdir, np.zeros(d), 0.0, s_a, s_b, bias,
                 used, total)
    if bias:
        with run.phase("query_bias"):
            bl = sk.probe.measure(Q, np.zeros((1, d)), s_u, "the query-bias pass [a; 0]")
        sk.u, sk.eta_u = Q.T @ bl.Z[:, 0], float(np.linalg.norm(bl.noise[:, 0]))
    run.report(sk.total)

    with run.phase("range"):
        M, eta, k = _range_sketch(run, sk, rank, P, extra_columns, block_floats)
    r_hat, r_num, sv, tol = _choose_rank(M[:, :k], eta[:k], rank, extra_columns, notes)
    details.update(range_directions=k, detected_rank=r_hat, numerical_rank=r_num,
                   singular_values=sv[: min(k, r_hat + 4)].tolist(), rank_tolerance=tol)
    if k >= d:  # the sketch already holds all of W B for an orthonormal basis B
        W = M @ Pdir
        notes.append(f"W is full rank to the answers' precision (rank {r_hat}); the sketch measured every column")
    else:
        U = np.linalg.svd(M[:, :k], full_matrices=False)[0][:, :r_hat]
        with run.phase("co_range"):
            W = _co_range(run, sk, U, M[:, :k], nu_w, min(d, r_hat + P), block_floats=block_floats,
                          details=details)
        if certificate:
            # sin∠(U, range W) ≲ error/σ_r(M), times ‖W‖ ≈ σ_1(M); random unit a ⊥ U, b see ~√r/d of it
            leak = tol / RANK_SAFETY * sv[0] / sv[r_hat - 1] * math.sqrt(r_hat) / d
            with run.phase("certificate"):
                details["certificate"] = _certify(sk, U, leak, n=certificate, rng=run.rng, rank=rank)

    dof = lowrank_dof(d, r_hat)
    planned = first_order_queries(d, bias) + d * k + (details.get("co_range_probes", 0) * (d - k))
    details.update(dof=dof, planned_queries=planned, full_rank_unknowns=AttentionHead.unknowns(d, bias),
                   retry_queries=run.queries_by_phase().get("retries", 0))
    return run.finish(AttentionHead(W, v, sk.u, c), unknowns=dof + first_order_queries(d, bias), details=details,
                      notes=notes)


def _range_sketch(run, sk: _Sketch, rank, P, extra_columns, block_floats):
    """Phase 1: ``M = W B``, one column block at a time (one direction at a time when the rank is detected,
    until ``extra_columns`` directions add nothing above rounding). Returns ``M``, the rounding error bound of
    each column and the number k of directions measured."""
    d = run.oracle.d
    M, eta = np.empty((d, d)), np.empty(d)
    k = 0
    target_k = min(d, rank + P) if rank is not None else None
    block = max(1, min(d, block_floats // (2 * d * d)))
    while target_k is None or k < target_k:
        J = np.arange(k, min(target_k, k + block)) if target_k is not None else np.arange(k, k + 1)
        bl = sk.probe.measure(sk.Q, sk.s_b * sk.Pdir[J], sk.s_a, f"range directions {J[0]}..{J[-1]}")
        M[:, J] = (sk.Q.T @ bl.Z - sk.u[:, None]) / sk.s_b
        eta[J] = (np.linalg.norm(bl.noise, axis=0) + sk.eta_u) / sk.s_b
        sk.steer_a(bl.rms)
        k = J[-1] + 1
        run.report(sk.total)
        if target_k is None:
            if k >= d or _numerical_rank(M[:, :k], eta[:k]) <= k - extra_columns:
                break
            sk.total = max(sk.total, lowrank_queries(d, k + 1, P, extra_columns, sk.bias) + sk.calibration)
    return M, eta, k


def _choose_rank(M, eta, rank, extra_columns, notes):
    """The rank to keep from the range sketch ``M`` (d×k): the detected one, or the given bound (a direction
    too weak to count is measured anyway); refuses a sketch whose rank exceeds the bound or that shows no
    signal. Returns ``(r̂, numerical rank, singular values, rank tolerance)``."""
    d, k = M.shape
    sv = np.linalg.svd(M, compute_uv=False)
    tol = _rank_tolerance(eta, d)
    r_num = int(np.sum(sv > tol))
    if rank is None:
        r_hat = min(r_num, max(k - extra_columns, 1)) if k < d else r_num
    else:
        r_hat = min(rank, k)
        if r_num > rank:
            raise RecoveryError(
                f"the range sketch has numerical rank {r_num} > the given rank {rank}: W has a larger rank than "
                "given. Leave the rank out to detect it, or give the true head dimension")
        if r_num < rank:
            notes.append(f"the range sketch has numerical rank {r_num} < the given rank {rank} at the answers' "
                         "rounding (W may have a smaller rank, or the square sketch is ill-conditioned: oversample)")
    if r_hat == 0:
        raise RecoveryError("the range sketch shows no signal above the answers' rounding: W is 0 to the oracle's "
                            "precision (or the probes are far too small, or the answers too coarse for the sketch, "
                            "as float16 and bfloat16 answers are: the exact learner may read them, to the 10 % its "
                            "check certifies there, or refuse them too); nothing low-rank to recover")
    return r_hat, r_num, sv, tol


def _co_range(run, sk: _Sketch, U, M, nu_w, n_probe, *, block_floats, details):
    """Phases 2-3: the co-range sketch ``UᵀW C`` with ``n_probe`` probes ``a ∈ span(U)`` (+ a part of v outside
    the range), then ``W = U (UᵀW B Bᵀ + UᵀW C Cᵀ)``."""
    d, k = M.shape
    r_hat = U.shape[1]
    Y_B = U.T @ M  # UᵀW B (denoised range part)
    A, G = _frame_probes(U, sk.probe.v, n_probe, run.rng)
    Au = A @ sk.u
    # RMS a_kᵀW c for unit a ∈ span(U), unit c: ‖W‖_F/√(r d) = ν_W √(d/r) (ν_W: RMS qᵀW p of random unit
    # q, p from the calibration); the sketch's own estimate is the fallback (it is poor when B is unlucky)
    nu_w2 = (nu_w * math.sqrt(d / r_hat) if nu_w else float(np.linalg.norm(Y_B)) / math.sqrt(k * n_probe))
    nu_u2 = float(np.sqrt(np.mean(Au**2))) if sk.bias else None
    _, s_a2, s_b2 = probe_scales(nu_u2, nu_w2, sk.probe.target, max_probe_scale(run.oracle))
    Cdir = sk.Pdir[k:]
    Y_C = np.empty((r_hat, d - k))
    block = max(1, min(d - k, block_floats // (2 * d * max(n_probe, 1))))
    for j0 in range(0, d - k, block):
        J = np.arange(j0, min(d - k, j0 + block))
        bl = sk.probe.measure(A, s_b2 * Cdir[J], s_a2, f"co-range directions {J[0]}..{J[-1]}")
        Y_C[:, J] = G.T @ (bl.Z - Au[:, None]) / s_b2
        if np.isfinite(bl.rms) and bl.rms > 0:
            s_a2 *= float(np.clip(sk.probe.target / bl.rms, 0.5, 2.0))
        run.report(sk.total)
    details.update(co_range_probes=n_probe, scale_a2=s_a2, scale_b2=s_b2)
    return U @ (Y_B @ sk.Pdir[:k] + Y_C @ Cdir)


def _rank_tolerance(eta: np.ndarray, d: int) -> float:
    """Spectral-norm estimate of the sketch's rounding error: a d×k matrix of independent errors with column
    norms ≤ η has spectral norm ≈ η(1 + √(k/d))."""
    return RANK_SAFETY * float(np.max(eta)) * (1.0 + math.sqrt(len(eta) / d)) + 1e-300


def _numerical_rank(M: np.ndarray, eta: np.ndarray) -> int:
    sv = np.linalg.svd(M, compute_uv=False)
    return int(np.sum(sv > _rank_tolerance(eta, M.shape[0])))


def _certify(sk: _Sketch, U, leak, *, n: int, rng, rank):
    """Rank certificate: ``n`` queries with random unit ``a ⊥ span(U)`` and random unit ``b``. If
    ``range W ⊆ span U`` their logits are ``s_a aᵀu`` alone; a residual above rounding means the sketch missed
    part of W (rank under-estimated) and raises :class:`RecoveryError`. ``leak`` is the typical
    ``|aᵀ(I − UUᵀ)W b|`` that rounding in the range sketch alone explains (its error times the sketch's
    condition number, × √r/d)."""
    d = U.shape[0]
    v = sk.probe.v
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
    oracle = sk.probe.oracle
    before = oracle.queries
    lg = measure_logits(oracle, sk.s_a * A, sk.s_b * B, v, sk.probe.c)
    resid = np.abs(lg.values - sk.s_a * (A @ sk.u))
    bound = CERTIFICATE_SAFETY * (lg.noise + sk.s_a * sk.eta_u + sk.s_a * sk.s_b * leak) + 1e-300
    ratio = np.where(lg.saturated, np.inf, resid / bound)
    out = {"queries": oracle.queries - before, "max_ratio": float(np.max(ratio)),
           "max_residual_logit": float(np.max(np.where(lg.saturated, np.inf, resid)))}
    if np.any(ratio > 1.0):
        hint = (f"the given rank {rank} is too small: give the true head dimension or leave the rank out to "
                "detect it" if rank is not None else "rerun with a larger rank or more extra columns")
        said = (f"rank certificate failed: {int(np.sum(ratio > 1))} of {n} probes outside the recovered range of W "
                f"(rank {U.shape[1]}) see attention logits up to {out['max_residual_logit']:.3g} (rounding allows "
                f"{float(np.max(bound)):.3g})")
        declared = declared_noise(oracle)
        raise RecoveryError(f"{said}: {declared}" if declared else f"{said}, so W has directions the sketch missed; "
                            f"{hint}")
    return out


def declared_noise(oracle) -> str:
    """``""``, or a clause naming the additive rounding or noise the answers are declared to carry (which this
    learner does not model: its sketch and certificate allow the answers' rounding only) and the learners that
    handle it: a failure under it is that noise, not the rank or the model class."""
    noise = oracle.noise
    if not (noise.tolerance or noise.sigma):
        return ""
    from attnprobe.learners.core.registry import noise_learners

    spec = oracle.chain.spec if oracle.chain is not None else None
    named = f"{spec!r} ({noise.additive()})" if spec else noise.additive()
    fits = ", ".join(noise_learners("head")) or "none installed"
    return (f"the answers carry the declared {named}, which the low-rank learner does not model (it allows their "
            f"rounding only), so this says the noise, not that the rank or the model is wrong; the learners for "
            f"such answers: {fits}")
