"""Exact single-head extraction with value queries (Thm 4.1), extended to the biases of real layers.

Phases (all queries batched):
1. length-1 queries ``[x] ↦ xᵀv + c``: ``c`` from ``x = 0`` and ``v`` from ``x = e_i`` (d + 1 queries);
2. the query bias ``u``: length-2 queries ``[a; 0]`` have logit ``aᵀu`` (d queries);
3. ``W`` column by column: ``[(a+b); b]`` has logit ``aᵀW b + aᵀu`` (eq. 1), d probes ``a`` per column ``b``.
The paper's model (``bias=False``) skips ``c`` and ``u``: exactly ``d + d²`` queries with the paper's probes.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from attnprobe._validation import check_option
from attnprobe.errors import UnidentifiableError
from attnprobe.learners.core.check import DEFAULT_LENGTHS
from attnprobe.learners.head.probes import basis_probes, equal_projection_orthogonal, paper_bound, random_orthogonal
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.head.scaling import (CALIBRATION_SHARE, TARGET_LOGIT, LogitProbe, calibrate, lead_probes,
                                       max_probe_scale, probe_scales)
from attnprobe.models.attention import AttentionHead

PROBES = ("orthogonal", "basis", "gaussian")


def probe_design(probes: str) -> str:
    """``paper`` is the paper's probe design, the basis probes of Thm 4.1."""
    return "basis" if probes == "paper" else probes


def learn_value(oracle, bias: bool = True, learner: str = "single-head") -> tuple[np.ndarray, float, np.ndarray]:
    """Phase (i) of Thm 4.1: ``[e_i] ↦ v_i + c`` and ``[0] ↦ c``. Returns ``v, c`` and the noise floor of v.

    The first queries of every scalar learner: answers of shape (B, 1) are read as (B,) from here on (K > 1
    outputs are refused). Raises :class:`UnidentifiableError` when ``v = 0`` (then ``f`` is constant).
    """
    d = oracle.d
    oracle.expect_scalar(learner)
    X = np.eye(d)[:, None, :]
    if bias:
        X = np.concatenate([np.zeros((1, 1, d)), X])
    y = oracle(X)
    c = float(y[0]) if bias else 0.0
    v = y[1:] - c if bias else y.copy()
    floor = 16 * oracle.eps * float(np.max(np.abs(y)))
    if not np.any(np.abs(v) > floor):
        raise UnidentifiableError(
            "the length-1 answers do not depend on the input (v = 0 up to answer precision), so the attention "
            "weights never reach the output and W cannot be identified (Thm 4.1 needs v ≠ 0)")
    return v, c, np.abs(v) <= floor


class _Columns:
    """Maps logits of a probe block back to ``W b + u`` (one column per probe direction b)."""

    def __init__(self, A: np.ndarray, B: np.ndarray):
        self.A, self.B = A, B  # rows of A are probes a_ℓ; rows of B are column directions b_j
        self._lu = None

    def solve_a(self, T: np.ndarray) -> np.ndarray:
        """Solve ``A z = t`` for each column of T."""
        if self._lu is None:
            self._lu = scipy.linalg.lu_factor(self.A)
        return scipy.linalg.lu_solve(self._lu, T)


class _OrthogonalColumns(_Columns):
    def solve_a(self, T):
        return self.A.T @ T  # A orthogonal


def _rebalanced(column, u, nu_w, target, s_max):
    """Probe scales ``(s_a, s_b)`` for W when the calibration's ``ν_W`` (from as little as one probe) is off by
    more than 8x from the RMS of the first column ``W b̂``, measured with d probes; None otherwise. A ``b``
    scaled for a wrong ``ν_W`` stays wrong in every column (steering corrects ``s_a`` only), and a huge ``b``
    against a small ``a`` buries the logits in the rounding of ``bᵀv``."""
    d = column.shape[0]
    nu_obs = float(np.linalg.norm(column)) / np.sqrt(d)
    if nu_w is None or not nu_obs > 0 or 0.125 <= nu_obs / nu_w <= 8.0:
        return None
    nu_u = float(np.linalg.norm(u)) / np.sqrt(d) if np.any(u) else None
    return probe_scales(nu_u, nu_obs, target, s_max)[1:]


def extract_exact(oracle, *, probes: str = "orthogonal", bias: bool = True, seed: int = 0,
                  target_logit: float = TARGET_LOGIT, check: bool = True, check_lengths=DEFAULT_LENGTHS,
                  progress=None, block_floats: int = 2**22) -> Extraction:
    """Recover ``(W, v[, u, c])`` exactly from value queries (Thm 4.1).

    ``probes``: ``basis`` (paper: ``e_ℓ`` or ``e_ℓ + e_p``), ``gaussian`` (paper: ``a ~ N(0, I)``) or
    ``orthogonal`` (default: orthogonal probes with equal ``|aᵀv|``, scaled from the oracle's own answers so the
    logits sit where the sigmoid inverts best; calibration costs at most 2 % extra queries, its readings are
    reused as equations, and a probe that saturates is asked again alone at a smaller scale, see
    :mod:`attnprobe.learners.head.scaling`). ``bias=False`` learns the paper's model with exactly
    ``d + d²`` queries (basis/gaussian probes). ``progress(done, total)`` is called after each block.
    """
    check_option(probes, "probes", PROBES)
    run = Run(oracle, "exact", scalar=True, seed=seed, check=check, check_lengths=check_lengths, progress=progress)
    rng = run.rng
    d = oracle.d
    unknowns = AttentionHead.unknowns(d, bias)
    allowance = int(CALIBRATION_SHARE * unknowns) if probes == "orthogonal" else 0
    run.plan(unknowns, f"exact extraction at d={d} ({unknowns} unknowns; calibration and re-measured probes "
                       f"may add up to {allowance} more)")

    with run.phase("values"):
        v, c, zero = learn_value(oracle, bias)
    notes = []
    details: dict = {"probes": probes, "bias": bias, "seed": seed}

    if probes == "orthogonal":
        Q = equal_projection_orthogonal(v, rng)
        P = random_orthogonal(d, rng)
        with run.phase("calibration"):
            nu_u, nu_w, used, known_u, known_w = calibrate(oracle, Q, P, v, c, bias, allowance)
        s_u, s_a, s_b = probe_scales(nu_u, nu_w, target_logit, max_probe_scale(oracle))
        cols = _OrthogonalColumns(Q, P)
        reused = sum(0 if x is None else len(x) for x in (known_u, known_w))
        details.update(calibration_queries=used - reused, calibration_reused=reused, scale_u=s_u, scale_a=s_a,
                       scale_b=s_b, estimated_rms_qu=nu_u, estimated_rms_qWp=nu_w)
    else:
        if probes == "basis":
            A = basis_probes(v, zero)
            if zero.any():
                notes.append(f"{int(zero.sum())} zero entries of v: probes e_l + e_p used there (Thm 4.1)")
        else:
            A = rng.standard_normal((d, d))
        cols = _Columns(A, np.eye(d))
        s_u = s_a = s_b = 1.0
        known_u = known_w = None

    total = unknowns + details.get("calibration_queries", 0)
    probe = LogitProbe(oracle, v, c, probes, target_logit)
    u = np.zeros(d)
    if bias:
        skip = np.zeros((d, 1), bool)
        if known_u is not None:
            skip[: len(known_u)] = True
        with run.phase("query_bias"):
            Z = probe.measure_steered(cols.A, np.zeros((1, d)), s_u, "the query-bias pass [a; 0]",
                                      lead=lead_probes(d), skip=skip).Z
        if known_u is not None:
            Z[: len(known_u), 0] = known_u
        u = cols.solve_a(Z)[:, 0]
        run.report(total)

    M = np.empty((d, d))  # M[:, j] = W b̂_j with b̂_j the unit column direction
    block = max(1, min(d, block_floats // (2 * d * d)))
    # the first column alone steers the scale for the rest (the calibration may have had a single probe)
    starts = [0, 1] + list(range(1 + block, d, block)) if probes == "orthogonal" else list(range(0, d, block))

    def columns(J, s_a, s_b, phase):
        """``W b̂_j`` for the columns J at probe scales ``s_a``, ``s_b``; returns them and the next ``s_a``."""
        skip = np.zeros((d, len(J)), bool)
        reuse = J[J < (0 if known_w is None else len(known_w))]  # probe i of column i was a calibration probe
        skip[reuse, reuse - J[0]] = True
        with run.phase(phase):
            block_logits = probe.measure_steered(cols.A, s_b * cols.B[J], s_a, f"columns {J[0]}..{J[-1]} of W",
                                                 lead=lead_probes(d) if J[0] == 0 else 0, skip=skip)
        Z = block_logits.Z
        if len(reuse):
            Z[reuse, reuse - J[0]] = s_b * known_w[reuse] + cols.A[reuse] @ u
        return (cols.solve_a(Z) - u[:, None]) / s_b, block_logits.next_scale

    for j0, j1 in zip(starts, starts[1:] + [d]):
        if j0 >= d:
            break
        J = np.arange(j0, j1)
        M[:, J], s_a = columns(J, s_a, s_b, "weights")
        orthogonal_first = probes == "orthogonal" and j0 == 0
        scales = _rebalanced(M[:, 0], u, nu_w, target_logit, max_probe_scale(oracle)) if orthogonal_first else None
        if scales is not None:  # the calibration missed ν_W by more than 8x: column 0 again at sound scales
            s_a, s_b = scales
            M[:, J], s_a = columns(J, s_a, s_b, "retries")
            details["rebalanced_scales"] = [s_a, s_b]
        run.report(total)
    W = M @ cols.B  # M = W Bᵀ with orthonormal rows B (the identity for the paper's probes)

    details["retry_queries"] = run.queries_by_phase().get("retries", 0)
    details.update(paper_bound=paper_bound(d), calibration_share=details.get("calibration_queries", 0) / unknowns)
    hint = " (a single head of this form" + (" without biases: learn with bias=True)" if not bias else ")")
    return run.finish(AttentionHead(W, v, u, c), unknowns=unknowns, details=details, notes=notes, hint=hint)


