"""Low-rank recovery by compressed sensing (Thm 5.1, App. A): rank-one measurements + nuclear-norm minimisation.

Each two-row query ``[(a+b); b]`` with Gaussian ``a, b`` gives, after the sigmoid inversion of eq. (1), one
rank-one projection ``t = aᵀW b = ⟨a bᵀ, W⟩`` (the query bias ``aᵀu`` is measured first and subtracted).
With ``m = O(rd)`` of them, program (2) ``min ‖W‖_* s.t. ⟨a_k b_kᵀ, W⟩ = t_k`` recovers a rank-≤r ``W``
exactly w.h.p. (Thm A.2, Cai & Zhang 2015). The program is solved with cvxpy (optional extra ``cvxpy``);
an optional polish (Gauss–Newton on the rank-r̂ factorisation, fitted to the same measurements)
takes the solver's ~1e-8 answer to the answers' own precision.

The dense measurement operator has ``m·d²`` entries and the SDP behind ``‖·‖_*`` has a ``2d × 2d`` PSD block,
so this route is practical up to about d = 64 (SCS: ~1–2 min there); the low-rank sketch
(:func:`~attnprobe.learners.head.lowrank.extract_lowrank`) scales to d in the thousands with fewer queries.
"""

from __future__ import annotations

import math
import signal
from contextlib import nullcontext

import numpy as np

from attnprobe._validation import check_int, check_option
from attnprobe.errors import ConfigError, RecoveryError, SaturationError
from attnprobe.learners.core.check import DEFAULT_LENGTHS
from attnprobe.learners.head.exact import learn_value
from attnprobe.learners.head.scaling import (MAX_RETRIES, TARGET_LOGIT, LogitProbe, calibrate, max_probe_scale,
                                       probe_scales)
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.head.lowrank import MIN_CALIBRATION
from attnprobe.learners.head.probes import equal_projection_orthogonal, first_order_queries, random_orthogonal
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.head.sigmoid import measure_logits
from attnprobe.models.attention import AttentionHead

#: default m = ⌈2d · (PHASE_SLOPE · r + PHASE_OFFSET)⌉: just above the measured transition to 100 % exact
#: recovery at d = 16, 32, 64 and r = 1, 2, 4 (docs/benchmarks/lowrank.md; the paper only says m = O(rd))
PHASE_SLOPE = 2.0
PHASE_OFFSET = 2.0
#: solvers tried for ``solver="auto"``, fastest accurate first (measured, docs/benchmarks/lowrank.md)
AUTO_SOLVERS = ("SCS", "CLARABEL")
#: refuse dense operators above this many floats (m·d²): 2e8 floats = 1.6 GB
MAX_OPERATOR_FLOATS = 2 * 10**8


#: SCS time model t ≈ SCS_SECONDS · (m·d²)^SCS_EXPONENT, fitted to solves at d = 16..48, r = 2, default m on this
#: project's 2-core machine (d = 32: 2.7 s, d = 48: 10.7 s; benchmarks/ nuclear timing in docs/benchmarks/lowrank.md)
SCS_SECONDS, SCS_EXPONENT = 9.7e-7, 1.15
#: bytes per operator entry while cvxpy builds and SCS solves the program (the dense operator and its copies)
SOLVER_BYTES_PER_ENTRY = 4 * 8
#: refuse up front when the solver is estimated to need longer than this (seconds; ``solver_time_limit``)
SOLVER_TIME_LIMIT = 300.0


def solver_cost(d: int, m: int) -> tuple[float, float]:
    """Estimated seconds and bytes the nuclear-norm program takes at width d with m measurements."""
    entries = float(m) * d * d
    return SCS_SECONDS * entries**SCS_EXPONENT, SOLVER_BYTES_PER_ENTRY * entries


def default_measurements(d: int, r: int) -> int:
    """``m = 2d (2 r + 2) = 4d(r + 1)`` (measured convex phase transition, see ``PHASE_SLOPE``), capped at d²."""
    return min(d * d, math.ceil(2 * d * (PHASE_SLOPE * r + PHASE_OFFSET)))


def rop_measurements(probe: LogitProbe, Ga, Gb, s_a, s_b, u):
    """Rank-one projections ``t_k = a_kᵀ W b_k`` for ``a_k = Ga[k]/√d``, ``b_k = Gb[k]/√d`` (paper: Gaussian
    rows), from queries ``[(s_a a + s_b b); s_b b]`` (eq. 1) minus the query bias. A saturated weight is
    asked again with ``s_a`` quartered (its own scale; one query each, charged to phase ``"retries"``).
    Returns ``A, B, t`` and the rounding error of ``t``."""
    d = Ga.shape[1]
    A, B = Ga / math.sqrt(d), Gb / math.sqrt(d)
    m = A.shape[0]
    t, noise = np.empty(m), np.empty(m)
    sa = np.full(m, float(s_a))
    idx = np.arange(m)
    for attempt in range(MAX_RETRIES + 1):
        with probe.oracle.phase("retries") if attempt else nullcontext():
            lg = measure_logits(probe.oracle, A[idx] * sa[idx, None], s_b * B[idx], probe.v, probe.c)
        ok = ~lg.saturated
        k = idx[ok]
        t[k] = (lg.values[ok] / sa[k] - A[k] @ u) / s_b
        noise[k] = lg.noise[ok] / (sa[k] * s_b)
        idx = idx[~ok]
        if idx.size == 0:
            return A, B, t, noise
        probe.oracle.require(idx.size, f"re-measuring {idx.size} saturated rank-one measurements")
        sa[idx] /= 4.0
    raise SaturationError(f"{idx.size} rank-one measurements stay saturated after shrinking their probes "
                          f"{4**MAX_RETRIES}x; the target's logits are too steep for the answer precision")


def solve_in_child(prob, variable, solver: str, opts: dict):
    """``prob.solve(solver, **opts)`` in a forked child process; returns (status, value, solve seconds, W).

    SCS installs its own SIGINT handler while it runs and swallows Ctrl-C (the run went on for minutes); in a
    child it cannot: this process keeps its handlers, so SIGINT/SIGTERM interrupt the wait at once and the
    child is killed. A solver failure comes back as the child's :class:`cvxpy.error.SolverError` message."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def work():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it kills this process on a signal
        try:
            prob.solve(solver=solver, **opts)
            send.send(("ok", prob.status, prob.value, prob.solver_stats.solve_time, variable.value))
        except Exception as exc:  # noqa: BLE001 - reported to the parent as text
            send.send(("error", f"{type(exc).__name__}: {exc}"))

    child = ctx.Process(target=work, daemon=True)
    child.start()
    send.close()
    try:
        reply = recv.recv()
    except EOFError:
        reply = ("error", f"the solver process died (exit code {child.join(5) or child.exitcode}; out of memory?)")
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        recv.close()
    if reply[0] == "error":
        raise SolverFailed(reply[1])
    return reply[1:]


class SolverFailed(Exception):
    """The cvxpy solver failed in the child process (its message)."""


def nuclear_solve(A, B, t, solver: str = "auto", eps: float = 1e-9, max_iters: int = 200000):
    """Program (2): ``min ‖W‖_* s.t. a_kᵀ W b_k = t_k`` with cvxpy. Returns ``(W, solver used, info)``."""
    try:
        import cvxpy as cp
    except ImportError as exc:
        raise ConfigError("the nuclear-norm learner needs cvxpy: pip install 'attnprobe[cvxpy]' (or pip install "
                          "cvxpy); the low-rank sketch (method 'lowrank') needs no solver", param="solver") from exc
    m, d = A.shape
    if m * d * d > MAX_OPERATOR_FLOATS:
        raise ConfigError(f"the dense measurement operator would hold m·d² = {m * d * d:.2e} floats (> "
                          f"{MAX_OPERATOR_FLOATS:.0e}); nuclear-norm recovery is practical up to d ≈ 64 here. "
                          "Use the low-rank sketch (method 'lowrank') for large heads", param="measurements")
    Phi = (A[:, :, None] * B[:, None, :]).reshape(m, d * d)  # row k = vec_C(a_k b_kᵀ)
    W = cp.Variable((d, d))
    prob = cp.Problem(cp.Minimize(cp.normNuc(W)), [Phi @ cp.vec(W, order="C") == t])
    names = AUTO_SOLVERS if solver == "auto" else (solver.upper(),)
    installed = set(cp.installed_solvers())
    errors = []
    for name in names:
        if name not in installed:
            errors.append(f"{name} not installed")
            continue
        opts = {"eps_abs": eps, "eps_rel": eps, "max_iters": max_iters} if name == "SCS" else {}
        if name == "CLARABEL":
            opts = {"tol_gap_abs": eps, "tol_gap_rel": eps, "tol_feas": eps}
        try:
            status, value, seconds, W_value = solve_in_child(prob, W, name, opts)
        except SolverFailed as exc:
            errors.append(f"{name}: {exc}")
            continue
        if status in ("optimal", "optimal_inaccurate") and W_value is not None:
            return np.asarray(W_value), name, {"status": status, "objective": float(value),
                                               "solve_seconds": seconds}
        errors.append(f"{name}: status {status}")
    raise RecoveryError(f"the nuclear-norm program could not be solved ({'; '.join(errors)}); installed cvxpy "
                        f"solvers: {', '.join(sorted(installed))}")


def polish(W0, A, B, t, r: int, iters: int = 50, tol: float = 1e-15):
    """Gauss–Newton on ``W = L Rᵀ`` (rank r) fitted to ``a_kᵀ L Rᵀ b_k = t_k``, started from the SVD of ``W0``.
    Each step solves the joint linear least-squares problem in ``(δL, δR)`` (2dr unknowns, minimum-norm for the
    r² gauge directions); near the solution it converges quadratically. Returns ``(L Rᵀ, residual norm)``."""
    U, s, Vt = np.linalg.svd(W0)
    L = U[:, :r] * np.sqrt(s[:r])
    R = Vt[:r].T * np.sqrt(s[:r])
    m, d = A.shape

    def resid(L, R):
        return np.sum((A @ L) * (B @ R), axis=1) - t

    f = resid(L, R)
    res = float(np.linalg.norm(f))
    for _ in range(iters):
        if res <= tol * np.linalg.norm(t):
            break
        JL = (A[:, :, None] * (B @ R)[:, None, :]).reshape(m, d * r)  # ∂/∂L of a_kᵀ L (Rᵀ b_k)
        JR = (B[:, :, None] * (A @ L)[:, None, :]).reshape(m, d * r)  # ∂/∂R of b_kᵀ R (Lᵀ a_k)
        step = np.linalg.lstsq(np.hstack([JL, JR]), -f, rcond=None)[0]
        L2, R2 = L + step[: d * r].reshape(d, r), R + step[d * r:].reshape(d, r)
        f2 = resid(L2, R2)
        res2 = float(np.linalg.norm(f2))
        if res2 >= res * (1 - 1e-6):
            break
        L, R, f, res = L2, R2, f2, res2
    return L @ R.T, res


def numerical_rank(W, noise_level: float) -> int:
    """Singular values above ``noise_level`` (absolute)."""
    return int(np.sum(np.linalg.svd(W, compute_uv=False) > noise_level))


def extract_nuclear(oracle, *, rank: int | None = None, measurements: int | None = None, solver: str = "auto",
                    bias: bool = True, seed: int = 0, refine: bool = True, target_logit: float = TARGET_LOGIT,
                    solver_eps: float = 1e-9, check: bool = True, check_lengths=DEFAULT_LENGTHS,
                    progress=None, solver_time_limit: float | None = SOLVER_TIME_LIMIT) -> Extraction:
    """Thm 5.1: ``v`` (and ``c``, ``u``) from ``2d + 1`` queries, then ``W`` from ``m`` Gaussian rank-one
    measurements by nuclear-norm minimisation. ``measurements`` defaults to ``default_measurements(d, rank)``.
    ``refine`` polishes the convex solution on the rank-r̂ manifold (same measurements, no extra queries).
    ``solver_time_limit``: refuse before any query when the program is estimated (:func:`solver_cost`) to take
    longer (None: no limit)."""
    d = oracle.d
    if rank is None and measurements is None:
        raise ConfigError("the nuclear-norm learner needs the rank bound (the 'rank' parameter, the head "
                          "dimension) or the number of measurements (the 'measurements' parameter); the low-rank "
                          "sketch (method 'lowrank') can detect the rank", param="rank")
    rank = check_int(rank, "rank", min_value=1, max_value=d, allow_none=True)
    m = check_int(measurements, "measurements", min_value=1, allow_none=True) or default_measurements(d, rank)
    check_option(refine, "refine", (True, False))
    run = Run(oracle, "nuclear", scalar=True, seed=seed, check=check, check_lengths=check_lengths, progress=progress)
    base = first_order_queries(d, bias)
    allowance = MIN_CALIBRATION + d // 8
    run.plan(base + m + allowance, f"nuclear-norm extraction at d={d} ({base} queries for v, u, c, {m} rank-one "
                                   f"measurements and at most {allowance} for calibration)")
    if m * d * d > MAX_OPERATOR_FLOATS:  # refuse before spending queries
        nuclear_solve(np.zeros((m, d)), np.zeros((m, d)), np.zeros(m), solver)
    seconds, nbytes = solver_cost(d, m)
    if solver_time_limit is not None and seconds > solver_time_limit:
        raise ConfigError(f"the nuclear-norm program at d = {d} with m = {m} measurements would take about "
                          f"{seconds / 60:.0f} min and {nbytes / 2**30:.1f} GiB (estimated from solve times measured "
                          f"on a 2-core machine) > the limit 'solver_time_limit' = {solver_time_limit:g} s; raise "
                          "'solver_time_limit' or use the lowrank method, which needs no solver",
                          param="solver_time_limit")

    with run.phase("values"):
        v, c, _ = learn_value(oracle, bias)
    probe = LogitProbe(oracle, v, c, "orthogonal", target_logit)
    Q = equal_projection_orthogonal(v, run.rng)
    with run.phase("calibration"):
        nu_u, nu_w, used, _, _ = calibrate(oracle, Q, random_orthogonal(d, run.rng), v, c, bias, allowance,
                                           probes_per_step=max(1, min(16, allowance // 8)))
    s_u, s_a, s_b = probe_scales(nu_u, nu_w, target_logit, max_probe_scale(oracle))
    u = np.zeros(d)
    if bias:
        with run.phase("query_bias"):
            u = Q.T @ probe.measure(Q, np.zeros((1, d)), s_u, "the query-bias pass [a; 0]").Z[:, 0]
    run.report(base + m + used)

    # unit-norm-on-average Gaussian probes: the calibrated scales apply to them as to unit probes
    Ga, Gb = run.rng.standard_normal((m, d)), run.rng.standard_normal((m, d))
    with run.phase("measurements"):
        A, B, t, noise = rop_measurements(probe, Ga, Gb, s_a, s_b, u)
    run.report(base + m + used)

    W0, used_solver, info = nuclear_solve(A, B, t, solver, solver_eps)
    sv = np.linalg.svd(W0, compute_uv=False)
    # singular values the solver's tolerance cannot distinguish from 0
    floor = max(1e3 * solver_eps, 100 * float(np.median(noise))) * float(sv[0]) * math.sqrt(d)
    r_hat = int(np.sum(sv > floor))
    details = {"bias": bias, "seed": seed, "measurements": m, "solver": used_solver, "solver_info": info,
               "calibration_queries": used, "scale_a": s_a, "scale_b": s_b, "rank_given": rank,
               "solution_rank": r_hat, "singular_values": sv[: r_hat + 2].tolist(),
               "m_over_2dr": m / (2 * d * (rank or max(r_hat, 1))),
               "convex_residual": float(np.linalg.norm(np.sum((A @ W0) * B, axis=1) - t) / np.linalg.norm(t))}
    notes: list[str] = []
    W = _fit_rank(W0, (A, B, t, noise), r_hat, rank, refine, details, notes)
    r_eff = rank if rank is not None else max(r_hat, 1)
    details["paper_queries"] = d + m
    return run.finish(AttentionHead(W, v, u, c), unknowns=2 * d * r_eff - r_eff * r_eff + base, details=details,
                      notes=notes)


def _fit_rank(W0, measured, r_hat, rank, refine, details, notes):
    """The convex solution ``W0``, polished on the rank-r manifold when ``refine`` (and m exceeds its degrees of
    freedom); refuses a solution no rank-r matrix fits, or whose rank exceeds the given bound."""
    A, B, t, noise = measured
    m, d = A.shape
    info = details["solver_info"]
    # rounding of the measurements, relative: the level an exact rank-r fit reaches
    fit_tol = max(1e-9, 1e3 * float(np.sqrt(np.mean(noise**2))) / max(float(np.sqrt(np.mean(t**2))), 1e-300))
    r_fit = min(r_hat, rank) if rank is not None else r_hat
    if refine and 0 < r_fit < d and m > 2 * d * r_fit - r_fit * r_fit:
        W, res = polish(W0, A, B, t, r_fit)
        details["polish_residual"] = res / float(np.linalg.norm(t))
        details["polish_change"] = float(np.linalg.norm(W - W0) / max(np.linalg.norm(W0), 1e-300))
        details["polish_rank"] = r_fit
        if details["polish_residual"] > fit_tol:
            raise RecoveryError(
                f"no rank-{r_fit} matrix fits the {m} measurements (relative residual "
                f"{details['polish_residual']:.1e} > {fit_tol:.0e}; the convex solution has numerical rank {r_hat} "
                f"and solver status {info['status']}): m is below the phase transition (default "
                f"{default_measurements(d, r_fit if rank is None else rank)}; raise the 'measurements' parameter), "
                "the solver stopped early, or W has a larger rank than given")
        if r_hat > r_fit:
            notes.append(f"the convex solution had rank {r_hat}; its rank-{r_fit} polish fits all {m} measurements "
                         f"to rounding (residual {details['polish_residual']:.1e}), which determines W since "
                         f"m > 2dr − r² = {2 * d * r_fit - r_fit * r_fit}")
        return W
    if rank is not None and r_hat > rank:
        raise RecoveryError(
            f"the nuclear-norm solution has numerical rank {r_hat} > the given rank {rank}: either {m} measurements "
            f"are below the phase transition (default {default_measurements(d, rank)}; raise the 'measurements' "
            "parameter) or W has a larger rank than given")
    return W0
