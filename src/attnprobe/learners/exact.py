"""Exact single-head extraction with value queries (Thm 4.1), extended to the biases of real layers.

Phases (all queries batched):
1. length-1 queries ``[x] ↦ xᵀv + c``: ``c`` from ``x = 0`` and ``v`` from ``x = e_i`` (d + 1 queries);
2. the query bias ``u``: length-2 queries ``[a; 0]`` have logit ``aᵀu`` (d queries);
3. ``W`` column by column: ``[(a+b); b]`` has logit ``aᵀW b + aᵀu`` (eq. 1), d probes ``a`` per column ``b``.
The paper's model (``bias=False``) skips ``c`` and ``u``: exactly ``d + d²`` queries with the paper's probes.
"""

from __future__ import annotations

import math
import time

import numpy as np
import scipy.linalg

from attnprobe.errors import ConfigError, SaturationError, UnidentifiableError
from attnprobe.learners.check import DEFAULT_LENGTHS, check_queries, functional_check
from attnprobe.learners.probes import basis_probes, equal_projection_orthogonal, random_orthogonal
from attnprobe.learners.result import Extraction
from attnprobe.learners.sigmoid import Logits, measure_logits
from attnprobe.models.attention import AttentionHead

PROBES = ("orthogonal", "basis", "gaussian")
#: RMS attention logit the orthogonal probes aim for: near ±1.5 the sigmoid loses least precision.
TARGET_LOGIT = 1.5
CALIBRATION_SHARE = 0.02
MAX_RETRIES = 6


def learn_value(oracle, bias: bool = True) -> tuple[np.ndarray, float, np.ndarray]:
    """Phase (i) of Thm 4.1: ``[e_i] ↦ v_i + c`` and ``[0] ↦ c``. Returns ``v, c`` and the noise floor of v.

    Raises :class:`UnidentifiableError` when ``v = 0`` (then ``f`` is constant and W is invisible).
    """
    d = oracle.d
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


def calibrate(oracle, Q, P, v, c, bias, allowance):
    """Estimate ``ν_u ≈ RMS qᵀu`` and ``ν_W ≈ RMS qᵀW p`` (unit q, p) from a few probes, shrinking the probes
    when they saturate and growing them when the logit drowns in rounding. Uses at most ``allowance``
    queries; an estimate it could not afford is None. Returns ``(ν_u, ν_W, queries used)``."""
    used = 0
    k = max(1, min(16, allowance // 8))
    d = Q.shape[1]

    def search(measure, power):
        nonlocal used
        s, bound = 1.0, None
        while used + k <= allowance:
            lg: Logits = measure(s)
            used += k
            if lg.saturated.any():
                s /= 16.0 ** (1.0 / power)
            elif np.all(np.abs(lg.values) < 100 * lg.noise):  # below rounding: only an upper bound
                bound = float(np.max(np.abs(lg.values) + 100 * lg.noise)) / s**power
                s *= 64.0 ** (1.0 / power)
            else:
                return float(np.sqrt(np.mean(lg.values**2))) / s**power, lg.values / s**power
            if not 1e-8 < s < 1e8:
                break
        return bound, None

    nu_u, qu = None, None
    if bias:
        nu_u, qu = search(lambda s: measure_logits(oracle, s * Q[:k], np.zeros(d), v, c), 1)
    qu = np.zeros(k) if qu is None else qu

    def w_part(s):  # [(a+b); b] at a = s q, b = s p has logit s² qᵀW p + s qᵀu
        lg = measure_logits(oracle, s * Q[:k], s * P[:k], v, c)
        return Logits(lg.values - s * qu, lg.saturated, lg.noise)

    nu_w, _ = search(w_part, 2)
    return nu_u, nu_w, used


def probe_scales(nu_u, nu_w, target):
    """Probe scales ``s_u`` (u pass), ``s_a``, ``s_b`` (W pass) that put the RMS logit at ``target``.

    Balanced ``s_a = s_b`` when the query bias is small; a large bias would swamp ``aᵀW b``, so b is lifted
    (at most 8x) until both parts weigh the same. Unknown estimates (no calibration budget) give unit scales.
    """
    if nu_w is None:
        s_a = s_b = 1.0
    else:
        nu_w = max(nu_w, 1e-300)
        nu_b = nu_u or 0.0
        s_b = math.sqrt(target / nu_w)
        if nu_b > s_b * nu_w:
            s_b = min(nu_b / nu_w, 8.0 * s_b)
        s_a = target / math.sqrt((s_b * nu_w) ** 2 + nu_b**2)
    s_u = target / nu_u if nu_u else s_a
    clip = lambda x: float(np.clip(x, 1e-8, 1e8))  # noqa: E731
    return clip(s_u), clip(s_a), clip(s_b)


def extract_exact(oracle, *, probes: str = "orthogonal", bias: bool = True, seed: int = 0,
                  target_logit: float = TARGET_LOGIT, check: bool = True, check_lengths=DEFAULT_LENGTHS,
                  progress=None, block_floats: int = 2**22) -> Extraction:
    """Recover ``(W, v[, u, c])`` exactly from value queries (Thm 4.1).

    ``probes``: ``basis`` (paper: ``e_ℓ`` or ``e_ℓ + e_p``), ``gaussian`` (paper: ``a ~ N(0, I)``) or
    ``orthogonal`` (default: orthogonal probes with equal ``|aᵀv|``, scaled from the oracle's own answers so the
    logits sit where the sigmoid inverts best; calibration costs at most 2 % extra queries, and a column whose
    probes saturate is re-measured at a smaller scale). ``bias=False`` learns the paper's model with exactly
    ``d + d²`` queries (basis/gaussian probes). ``progress(done, total)`` is called after each block.
    """
    if probes not in PROBES:
        raise ConfigError(f"unknown probe design {probes!r}; choose one of {', '.join(PROBES)}")
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    d = oracle.d
    start = oracle.queries
    unknowns = AttentionHead.unknowns(d, bias)
    allowance = int(CALIBRATION_SHARE * unknowns) if probes == "orthogonal" else 0
    n_check = check_queries(check_lengths) if check else 0
    oracle.require(unknowns + n_check, f"exact extraction at d={d} ({unknowns} unknowns + {n_check} check queries)")
    report = progress or (lambda done, total: None)

    v, c, zero = learn_value(oracle, bias)
    notes = []
    details: dict = {"probes": probes, "bias": bias, "seed": seed}

    if probes == "orthogonal":
        Q = equal_projection_orthogonal(v, rng)
        P = random_orthogonal(d, rng)
        nu_u, nu_w, used = calibrate(oracle, Q, P, v, c, bias, allowance)
        s_u, s_a, s_b = probe_scales(nu_u, nu_w, target_logit)
        cols = _OrthogonalColumns(Q, P)
        details.update(calibration_queries=used, scale_u=s_u, scale_a=s_a, scale_b=s_b,
                       estimated_rms_qu=nu_u, estimated_rms_qWp=nu_w)
    else:
        if probes == "basis":
            A = basis_probes(v, zero)
            if zero.any():
                notes.append(f"{int(zero.sum())} zero entries of v: probes e_l + e_p used there (Thm 4.1)")
        else:
            A = rng.standard_normal((d, d))
        cols = _Columns(A, np.eye(d))
        s_u = s_a = s_b = 1.0

    total = unknowns + details.get("calibration_queries", 0)
    u = np.zeros(d)
    if bias:
        Z, _ = measure_block(oracle, cols.A, np.zeros((1, d)), s_u, v, c, probes, "the query-bias pass [a; 0]")
        u = cols.solve_a(Z)[:, 0]
        report(oracle.queries - start, total)

    M = np.empty((d, d))  # M[:, j] = W b̂_j with b̂_j the unit column direction
    block = max(1, min(d, block_floats // (2 * d * d)))
    for j0 in range(0, d, block):
        J = np.arange(j0, min(d, j0 + block))
        Bdir = cols.B[J]
        Z, rms = measure_block(oracle, cols.A, s_b * Bdir, s_a, v, c, probes, f"columns {J[0]}..{J[-1]} of W")
        M[:, J] = (cols.solve_a(Z) - u[:, None]) / s_b
        if probes == "orthogonal" and np.isfinite(rms) and rms > 0:  # steer the next block to the target logit
            s_a *= float(np.clip(target_logit / rms, 0.5, 2.0))
        report(oracle.queries - start, total)
    W = M @ cols.B if probes == "orthogonal" else M  # M = W Bᵀ for orthonormal rows B

    retries = oracle.queries - start - unknowns - details.get("calibration_queries", 0)
    details["retry_queries"] = retries
    model = AttentionHead(W, v, u, c)
    queries = oracle.queries - start
    details.update(paper_bound=d * d + d, calibration_share=details.get("calibration_queries", 0) / unknowns)
    result = Extraction("exact", model, queries, unknowns, 0.0, details=details, notes=notes)
    if check:
        result.check = functional_check(oracle, model, rng, check_lengths)
    result.seconds = time.perf_counter() - t0
    return result


#: a probe whose logit noise exceeds this multiple of its block's median is re-measured at a smaller scale
NOISY_FACTOR = 30.0
#: ...unless its noise is below this fraction of the RMS logit anyway (float64 answers)
NEGLIGIBLE_NOISE = 1e-9


def measure_block(oracle, A, Bs, scale, v, c, probes, what, with_noise=False):
    """Normalised logits ``Z[ℓ, j] = a_ℓᵀ(W b_j + u)`` for probes ``scale·a_ℓ`` against each row ``b_j`` of
    ``Bs``. With orthogonal probes every saturated or unusually noisy probe is asked again alone at a quarter
    of its scale (one query each: each equation may have its own scale); the paper's fixed probes raise
    instead. Returns ``(Z, rms logit of the first pass)``, and with ``with_noise`` also the first-order
    rounding error of each entry of Z (same normalisation as Z)."""
    d, k = A.shape[0], Bs.shape[0]
    Z = np.empty((d, k))
    N = np.full((d, k), np.inf)
    S = np.full((d, k), float(scale))
    ell, j = np.divmod(np.arange(d * k), k)  # ℓ-major, matching Z's C order
    rms, median_noise = None, None
    for attempt in range(MAX_RETRIES + 1):
        lg = measure_logits(oracle, A[ell] * S[ell, j][:, None], Bs[j], v, c)
        ok = ~lg.saturated
        Z[ell[ok], j[ok]] = lg.values[ok] / S[ell[ok], j[ok]]
        N[ell[ok], j[ok]] = lg.noise[ok] / S[ell[ok], j[ok]]
        if rms is None:
            rms = float(np.sqrt(np.mean(lg.values[ok] ** 2))) if ok.any() else np.inf
            median_noise = float(np.median(lg.noise[ok])) if ok.any() else 0.0
        if probes != "orthogonal":
            if not lg.saturated.any():
                return (Z, rms, N) if with_noise else (Z, rms)
            raise SaturationError(
                f"{int(lg.saturated.sum())} attention weights of {what} are numerically 0 or 1 with the paper's "
                f"{probes} probes, so the sigmoid cannot be inverted; use --probes orthogonal, which scales the "
                "probes to the target")
        noisy = lg.noise > max(NOISY_FACTOR * median_noise, NEGLIGIBLE_NOISE * rms)
        redo = lg.saturated | noisy if attempt < MAX_RETRIES else lg.saturated
        if not redo.any():
            return (Z, rms, N) if with_noise else (Z, rms)
        if attempt == MAX_RETRIES:
            break
        ell, j = ell[redo], j[redo]
        oracle.require(len(ell), f"re-measuring {len(ell)} saturated probes of {what}")
        S[ell, j] /= 4.0
    raise SaturationError(
        f"{int(lg.saturated.sum())} attention weights of {what} stay saturated after shrinking their probes "
        f"{4**MAX_RETRIES}x; the target's logits are too steep for the answer precision")
