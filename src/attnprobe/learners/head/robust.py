"""Learning from approximate value queries AVQ(X; τ) (Sec. 6, Thm 6.1).

Two learners:

- :func:`extract_robust_paper` — exactly the algorithm in the proof of Thm 6.1 for the paper's model
  ``f = softmax(X W x_N)ᵀ X v``: ``v̂_i = AVQ([e_i])``; for every entry the probe ``[(b u + a e_j); a e_j]``
  with ``a = ½``, ``b = 1/W`` (W the known bound on ‖W‖_F), ``u = e_i`` or ``e_i + e_p`` where ``v̂_i`` is
  zero (``|v̂_i| ≤ μ/2``); ``α̂`` from eq. (5), clipped to ``[σ(−½), σ(½)]`` before ``σ⁻¹``. ``d + d²`` queries.
  :func:`theorem_guarantee` evaluates the accuracy the theorem guarantees for the given τ.
- :func:`extract_robust` — our estimator: no bound on W; probe scales from the answers (large differing rows
  ``a`` so the attention signal ``α·aᵀv`` towers over an additive τ, a small shared row ``b`` steered so the
  logits sit near ±1.5); orthogonal probes with equal ``|aᵀv|``; a noise-aware saturation test with per-probe
  re-measurement; and when granted more queries, a second value pass at a large scale plus repeated W passes
  in fresh random frames averaged together (least squares over the stacked orthogonal designs).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from scipy.special import expit

from attnprobe._validation import check_float, check_int, check_option
from attnprobe.errors import ConfigError, SaturationError, UnidentifiableError
from attnprobe.learners.core.check import DEFAULT_LENGTHS
from attnprobe.learners.head.probes import equal_projection_orthogonal, paper_bound, random_orthogonal
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.head.scaling import MAX_RETRIES, TARGET_LOGIT
from attnprobe.learners.head.sigmoid import AdditiveError, invert_two_row, sigmoid_inverse, two_row_queries
from attnprobe.learners.core.skeleton import Run
from attnprobe.models.attention import AttentionHead
from attnprobe.models.precision import finfo

#: τ_clip = σ(−½) of Sec. 6 and the Lipschitz constant L = 1/(τ_clip(1 − τ_clip)) of σ⁻¹ on the clip range
TAU_CLIP = float(expit(-0.5))
LIPSCHITZ = 1.0 / (TAU_CLIP * (1.0 - TAU_CLIP))
#: relative error of an attention weight above which a probe's signal counts as drowned in noise
WEAK_SIGNAL = 0.1


def theorem_guarantee(d: int, tau: float, w_bound: float, margin: float, zero_rows: bool = False) -> dict:
    """Accuracy Thm 6.1 guarantees at tolerance τ: the theorem's constants and the proof's own chain.

    Theorem (paper constants): ``τ ≤ μ ε_W / (80 W² d)`` gives ``‖Ŵ − W‖_F ≤ ε_W``, so ``ε_W = 80 W² d τ / μ``
    (doubled when some ``v_i = 0``: "dividing the tolerance values by 2"); ``ε_v = √d τ`` (needs ``τ ≤ μ/2``).
    Proof chain: ``|α̂ − α| ≤ (2W/μ) τ + ((W + 2)/μ) τ``, times ``L/(ab) = 2 W L`` per entry (twice for rows
    with ``v_i = 0``), over d² entries.
    """
    if tau > margin / 2:
        return {"valid": False, "eps_W": math.inf, "eps_v": math.inf, "eps_W_proof": math.inf}
    _refuse_beyond_float64(d, w_bound, margin)
    factor = 2.0 if zero_rows else 1.0
    eps_w = factor * 80.0 * w_bound**2 * d * tau / margin
    alpha_err = (2 * w_bound / margin) * tau + ((w_bound + 2) / margin) * tau
    entry = 2 * w_bound * LIPSCHITZ * alpha_err
    return {"valid": True, "eps_W": eps_w, "eps_v": math.sqrt(d) * tau,
            "eps_W_proof": factor * d * entry, "entry_bound": factor * entry}


def _refuse_beyond_float64(d: int, w_bound: float, margin: float) -> None:
    """Thm 6.1's probes ``b = 1/W`` and its bound ``80 W² d / μ`` must be float64 numbers: refuse bounds beyond."""
    log10 = math.log10(80.0 * d) + 2 * math.log10(w_bound) - math.log10(margin)
    if log10 >= 300:
        raise ConfigError(f"Thm 6.1 at W = {w_bound:g}, μ = {margin:g} works with 80 W² d / μ ≈ 1e{log10:.0f} and "
                          "probes of size 1/W, beyond float64's range: give a tighter 'w_bound' and 'margin' (the "
                          "default probes need neither: extract_robust)", param="w_bound")


def extract_robust_paper(oracle, *, w_bound: float, margin: float, tolerance: float, check: bool = True,
                         seed: int = 0, check_lengths=DEFAULT_LENGTHS, progress=None,
                         block_floats: int = 2**22) -> Extraction:
    """Thm 6.1's algorithm verbatim (paper model, no biases): ``d + d²`` approximate value queries.

    ``w_bound`` is the known ``W ≥ 2`` with ``‖W‖_F ≤ W``; ``margin`` the known ``μ ≤ min_{v_i ≠ 0} |v_i|``;
    ``tolerance`` the oracle's τ (only used to report the guaranteed accuracy and to refuse ``τ > μ/2``).
    """
    w_bound = check_float(w_bound, "w_bound", min_value=2.0)
    margin = check_float(margin, "margin", min_value=0.0, max_value=1.0, strict_min=True)
    tolerance = check_float(tolerance, "tolerance", min_value=0.0)
    _refuse_beyond_float64(oracle.d, w_bound, margin)
    if tolerance > margin / 2:
        raise UnidentifiableError(
            f"the tolerance τ = {tolerance:g} exceeds μ/2 = {margin / 2:g}: answers within ±τ cannot tell a value "
            "entry of size μ from 0, so Thm 6.1 gives no guarantee; lower the noise or use the default probes "
            "(extract_robust), which scale their probes above the noise")
    d = oracle.d
    run = Run(oracle, "robust", scalar=True, seed=seed, check=check, check_lengths=check_lengths, progress=progress,
              tolerance=tolerance)
    run.plan(paper_bound(d), f"Thm 6.1 at d={d} (d + d² = {paper_bound(d)} queries)")
    with run.phase("values"):
        v = oracle(np.eye(d)[:, None, :])  # v̂_i = AVQ([e_i])
    nonzero = np.abs(v) > margin / 2
    if not nonzero.any():
        raise UnidentifiableError(
            f"every value answer |AVQ([e_i])| is ≤ μ/2 = {margin / 2:g}: the answers carry no usable signal "
            "(v = 0 or τ above the signal), so W cannot be identified")
    p = int(np.argmax(np.abs(v)))
    a, b = 0.5, 1.0 / w_bound
    U = np.eye(d)
    U[~nonzero, p] += 1.0  # u = e_i + e_p for the zero entries of v
    denom = b * np.where(nonzero, v, v[p])
    W = np.empty((d, d))
    block = max(1, min(d, block_floats // (2 * d * d)))
    for j0 in range(0, d, block):
        J = np.arange(j0, min(d, j0 + block))
        # X = [(b u_i + a e_j); a e_j] for every i (rows) and j in J
        X = np.zeros((d, len(J), 2, d))
        X[:, :, 0, :] = b * U[:, None, :]
        X[:, np.arange(len(J)), 0, J] += a
        X[:, np.arange(len(J)), 1, J] = a
        with run.phase("weights"):
            f = oracle(X.reshape(-1, 2, d)).reshape(d, len(J))
        alpha = (f - a * v[J][None, :]) / denom[:, None]  # eq. (5)
        W[:, J] = sigmoid_inverse(np.clip(alpha, TAU_CLIP, 1.0 - TAU_CLIP)) / (a * b)
        run.report()
    W[~nonzero] -= W[p][None, :]  # W_ij = σ⁻¹(α)/(ab) − W_pj for zero entries
    zero_rows = bool((~nonzero).any())
    guarantee = theorem_guarantee(d, tolerance, w_bound, margin, zero_rows)
    notes = [f"Thm 6.1 guarantees ‖Ŵ − W‖_F ≤ {guarantee['eps_W']:.3e} and ‖v̂ − v‖ ≤ {guarantee['eps_v']:.3e} "
             f"at τ = {tolerance:g}, W = {w_bound:g}, μ = {margin:g}, if the target meets those bounds"]
    if zero_rows:
        notes.append(f"{int((~nonzero).sum())} entries of v̂ are ≤ μ/2 and treated as zero (probes e_i + e_p)")
    details = {"probes": "paper", "bias": False, "w_bound": w_bound, "margin": margin, "tolerance": tolerance,
               "a": a, "b": b, "reference_p": p, "zero_entries": int((~nonzero).sum()),
               "guarantee": guarantee, "paper_bound": paper_bound(d)}
    return run.finish(AttentionHead(W, v), unknowns=AttentionHead.unknowns(d, False), details=details, notes=notes)


# ------------------------------------------------------------------------------------------- our estimator
def _scale_cap(oracle, vnorm: float) -> float:
    """Largest probe scale whose answers stay far inside the answer dtype's range."""
    try:
        big = float(finfo(oracle.precision).max)
    except Exception:  # ml_dtypes' bfloat16 has finfo too; anything exotic falls back to float32's range
        big = float(np.finfo(np.float32).max)
    return big ** 0.25 / max(vnorm, 1e-300)


def _value_pass(oracle, Q, scale, c):
    """``[s q_ℓ] ↦ s q_ℓᵀv + c``: returns the projections ``Q v`` and the raw answers."""
    y = oracle(scale * Q[:, None, :])
    return (y - c) / scale, y


@dataclass(frozen=True)
class _Measured:
    """Normalised logits ``Z[ℓ, j] ≈ q_ℓᵀ W p_j`` of a probe block and the RMS logit of its first pass."""

    Z: np.ndarray
    rms: float


@dataclass(frozen=True)
class _NoisyProbe:
    """What the length-2 measurements of the robust estimator share: the oracle, the estimates ``v, c``, the
    answers' error model (:class:`~attnprobe.learners.head.sigmoid.AdditiveError`, inverted by the one
    :func:`~attnprobe.learners.head.sigmoid.invert_two_row`), the target logit, the re-measurement limit and a counter
    of clipped weights."""

    oracle: object
    v: np.ndarray
    c: float
    noise: AdditiveError
    target: float = TARGET_LOGIT
    retries: int = MAX_RETRIES
    stats: dict = field(default_factory=lambda: {"clipped": 0})

    def logits(self, A, Bs, clip=False):
        """Two-row queries ``[(a+b); b]`` for rows of A against rows of Bs; logits with a noise-aware
        saturation mask: α or 1 − α within 2 noise units of 0 *and* a logit past twice the target (a weight
        that is merely noisy near the target is kept: re-measuring it at a smaller b only amplifies its
        noise), or α outside (0, 1). ``clip``: last resort for probes whose weight the noise keeps unresolved:
        α is clipped into ``[e, 1 − e]`` (e its own noise level, as the paper clips into ``[σ(−½), σ(½)]``),
        which bounds the damage instead of failing. Returns ``(logits, bad, relative error of α)``."""
        y = self.oracle(two_row_queries(A, Bs))
        y0 = self.c + np.einsum("kd,d->k", np.broadcast_to(Bs, A.shape), self.v)
        y1 = self.c + (A + Bs) @ self.v
        inv = invert_two_row(y, y0, y1, self.noise, clip=clip)
        with np.errstate(invalid="ignore"):
            inside = (inv.p > 0) & (inv.q > 0)
            bad = ~inside | (inv.saturated & ~(np.abs(inv.raw) <= 2 * self.target))
        return inv.raw, bad, inv.err

    def measure(self, Q, P, s_a, s_b, u_proj, what, *, a_cap=math.inf) -> _Measured:
        """``Z[ℓ, j] ≈ q_ℓᵀ W p_j`` for probes ``a = s_a q_ℓ``, ``b = s_b p_j``. A saturated probe is asked
        again alone (phase ``"retries"``) with its ``b`` at a quarter of the scale (the logit shrinks, the
        signal ``aᵀv`` does not), and its ``a`` too where the bias part ``aᵀu`` alone is past the target.
        Probes still unresolved after ``retries`` are kept with a clipped weight and counted in
        ``stats["clipped"]``."""
        d, k = Q.shape[0], P.shape[0]
        ell, j = np.divmod(np.arange(d * k), k)
        Sa, Sb = np.full(d * k, float(s_a)), np.full(d * k, float(s_b))
        Z = np.empty(d * k)
        idx = np.arange(d * k)
        rms = None
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            with self.oracle.phase("retries") if attempt else nullcontext():
                lg, bad, err = self.logits(Q[ell[idx]] * Sa[idx, None], Sb[idx, None] * P[j[idx]], clip=last)
            if last:  # last resort: keep every weight, clipped inside (0, 1), and count them
                self.stats["clipped"] += int(np.sum(bad & np.isfinite(lg)))
                bad = ~np.isfinite(lg)
            ok = ~bad
            sel = idx[ok]
            Z[sel] = (lg[ok] - Sa[sel] * u_proj[ell[sel]]) / (Sa[sel] * (Sb[sel] if s_b > 0 else 1.0))
            if rms is None:
                rms = float(np.sqrt(np.mean(lg[ok] ** 2))) if ok.any() else math.inf
            if not bad.any():
                return _Measured(Z.reshape(d, k), rms)
            weak = err[bad] > WEAK_SIGNAL  # the signal aᵀv drowns in the noise: grow a instead
            idx = idx[bad]
            if last:
                break
            self.oracle.require(len(idx), f"re-measuring {len(idx)} saturated or noise-drowned probes of {what}")
            strong = idx[~weak]
            if s_b > 0:
                Sb[strong] /= 4.0
            steep = (np.abs(Sa[strong] * u_proj[ell[strong]]) > self.target / 2 if s_b > 0
                     else np.ones(len(strong), bool))
            Sa[strong[steep]] /= 4.0
            Sa[idx[weak]] = np.minimum(Sa[idx[weak]] * 4.0, a_cap)
        raise SaturationError(
            f"{len(idx)} attention weights of {what} stay within the noise of 0 or 1 after shrinking their probes "
            f"{4**self.retries}x; the answers' noise is too large for the attention signal")


@dataclass(frozen=True)
class RobustOptions:
    """The robust estimator's options, validated once (see :func:`extract_robust` for their meaning)."""

    bias: bool = True
    tolerance: float | None = None
    queries: int | None = None
    value_scale: float = 1.0
    max_scale: float | None = None
    target_logit: float = TARGET_LOGIT
    retries: int = MAX_RETRIES
    block_floats: int = 2**22

    def __post_init__(self) -> None:
        check_option(self.bias, "bias", (True, False))
        check_float(self.tolerance, "tolerance", min_value=0.0, allow_none=True)
        check_int(self.queries, "queries", min_value=1, allow_none=True)
        check_float(self.value_scale, "value_scale", min_value=0.0, strict_min=True)
        check_float(self.max_scale, "max_scale", min_value=self.value_scale, allow_none=True)
        check_float(self.target_logit, "target_logit", min_value=0.0, strict_min=True)
        check_int(self.retries, "retries", min_value=0)
        check_int(self.block_floats, "block_floats", min_value=1)


@dataclass
class _Values:
    """What the value phase learned: ``v``, ``c``, the value-pass scales and the probe-scale cap."""

    v: np.ndarray
    c: float
    scale: float  # scale of the (last) first-order value pass
    s_v: float  # scale of the extra value passes
    passes: int  # extra value passes
    cap: float


def extract_robust(oracle, *, bias: bool = True, tolerance: float | None = None, queries: int | None = None,
                   seed: int = 0, value_scale: float = 1.0, max_scale: float | None = None,
                   target_logit: float = TARGET_LOGIT, retries: int = MAX_RETRIES,
                   check: bool = True, check_lengths=DEFAULT_LENGTHS, progress=None,
                   block_floats: int = 2**22) -> Extraction:
    """Recover ``(W, v[, u, c])`` from noisy answers without a bound on W (our estimator; see module doc).

    ``tolerance``: the answers' additive error bound τ if known; by default the τ (plus 3σ of fresh noise)
    that the oracle declares (``oracle.noise``), else 0 (answers only rounded, at ``oracle.eps``).
    ``queries``: how many queries the extraction may plan for (default: the number of unknowns, ``d² + d``
    bias-free); queries beyond that buy a large-scale value pass and repeated W passes in fresh frames.
    Re-measured saturated probes come on top (``retries=0``: none; unresolved weights are clipped instead, so
    the extraction spends exactly ``queries`` unless the value answers are too weak and get re-asked).
    ``max_scale`` caps the norm of every probe row (an API may only accept inputs of bounded size; additive
    noise that ignores the input's size is otherwise beaten by scaling the probes up, which this estimator
    does). The options are checked once (:class:`RobustOptions`).
    """
    opts = RobustOptions(bias, tolerance, queries, value_scale, max_scale, target_logit, retries, block_floats)
    d = oracle.d
    declared = oracle.noise
    if declared.membership:
        raise ConfigError("the oracle answers only 0/1 (membership); use the membership learner "
                          "(extract_membership)", param="oracle")
    tau = float(tolerance) if tolerance is not None else declared.tolerance + 3.0 * declared.sigma
    noise = AdditiveError(float(tau), float(oracle.eps))  # per answer: τ + eps·|y| (eps a machine epsilon)
    unknowns = AttentionHead.unknowns(d, bias)
    plan = unknowns if queries is None else queries
    if plan < unknowns:
        raise ConfigError(f"The 'queries' parameter ({plan}) is below the {unknowns} unknowns; give at least "
                          f"{unknowns}", param="queries")
    run = Run(oracle, "robust", scalar=True, seed=seed, check=check, check_lengths=check_lengths, progress=progress,
              tolerance=tolerance)
    run.plan(plan, f"robust extraction at d={d}")

    vals = _learn_values(run, opts, noise, plan - unknowns)
    probe = _NoisyProbe(oracle, vals.v, vals.c, noise, target_logit, retries)
    Q, u_proj, s_a, a_max = _learn_query_bias(run, probe, vals, opts)
    n_pass = 1 + (plan - unknowns - d) // (d * d) if plan - unknowns >= d else 1
    W, s_a, s_b = _learn_weights(run, probe, (Q, u_proj, s_a, a_max), vals.cap, n_pass, opts)

    by_phase = run.queries_by_phase()
    details = {"probes": "orthogonal", "bias": bias, "tolerance": tau, "declared_noise": asdict(declared),
               "value_scales": [vals.scale, vals.s_v], "scale_a": s_a, "scale_b": s_b, "w_passes": n_pass,
               "planned_queries": plan, "value_passes": 1 + vals.passes, "clipped_probes": probe.stats["clipped"],
               "u_rescaled_queries": by_phase.get("query_bias_rescale", 0),
               "v_rescaled_queries": by_phase.get("value_rescale", 0),
               "retry_queries": by_phase.get("retries", 0), "paper_bound": paper_bound(d)}
    notes = []
    if probe.stats["clipped"]:
        notes.append(f"{probe.stats['clipped']} probes stayed within the noise of 0 or 1 after re-measuring; their "
                     "weights were clipped (their entries carry the noise's error)")
    if n_pass > 1 or vals.s_v != vals.scale:
        notes.append(f"spent extra queries: value pass at scale {vals.s_v:.3g}, {n_pass} W passes averaged")
    u = Q.T @ u_proj if bias else None
    return run.finish(AttentionHead(W, vals.v, u, vals.c), unknowns=unknowns, details=details, notes=notes)


def _learn_values(run, opts: RobustOptions, noise: AdditiveError, extra: int) -> _Values:
    """``c`` from ``[0]`` and ``v`` from ``[s q_ℓ] ↦ s q_ℓᵀv + c`` in a random orthogonal frame; weak answers
    are asked again at a larger scale, and ``extra ≥ d`` planned queries buy value passes at the largest
    scale the noise model rewards."""
    oracle, rng, d = run.oracle, run.rng, run.oracle.d
    tau, value_scale = noise.tau, opts.value_scale
    with run.phase("values"):
        c = float(oracle(np.zeros((1, 1, d)))[0]) if opts.bias else 0.0
        Q0 = random_orthogonal(d, rng)
        proj, y = _value_pass(oracle, Q0, value_scale, c)
    floor = float(np.max(noise(y))) + (float(noise(np.array([c]))[0]) if opts.bias else 0.0)
    if not np.any(np.abs(proj) * value_scale > 3 * floor):
        raise UnidentifiableError(
            f"the value answers |f([x]) − f([0])| ≤ {np.max(np.abs(proj)) * value_scale:.3g} never exceed 3x the "
            f"noise floor {floor:.3g} (τ = {tau:g}): the answers carry no usable signal (v = 0 or the noise is "
            "above the signal); raise the 'value_scale' parameter or lower the noise")
    v = Q0.T @ proj
    cap = _scale_cap(oracle, float(np.linalg.norm(v)))
    if opts.max_scale is not None:
        cap = min(cap, opts.max_scale)
    rms_answer = float(np.sqrt(np.mean(proj**2))) * value_scale
    if tau > 0 and rms_answer < 50 * tau and cap > value_scale:  # weak value answers: ask again, larger
        s_new = min(cap, value_scale * 50 * tau / rms_answer)
        Qr = random_orthogonal(d, rng)
        with run.phase("value_rescale"):
            proj_r, _ = _value_pass(oracle, Qr, s_new, c)
        v = (value_scale**2 * v + s_new**2 * (Qr.T @ proj_r)) / (value_scale**2 + s_new**2)
        value_scale = s_new
    s_v, n_vpass = value_scale, 0
    if extra >= d:  # more value passes, at the largest scale the noise model rewards, and more W passes
        if tau > 0:
            vnorm = float(np.linalg.norm(v))
            s_v = max(value_scale, min(tau / (8 * max(oracle.eps, 1e-300) * vnorm), cap, 1e12 * value_scale))
            s_v = max(value_scale, min(s_v, cap))
        n_pass = 1 + (extra - d) // (d * d)
        n_vpass = max(1, min(n_pass, (extra - (n_pass - 1) * d * d) // d))
        w0, w1 = (1.0, 1.0) if tau == 0 else (value_scale**2, s_v**2)
        acc, wsum = w0 * v, w0
        for _ in range(n_vpass):
            Q1 = random_orthogonal(d, rng)
            with run.phase("value_passes"):
                proj2, _ = _value_pass(oracle, Q1, s_v, c)
            acc, wsum = acc + w1 * (Q1.T @ proj2), wsum + w1
        v = acc / wsum
    run.report()
    return _Values(v, c, value_scale, s_v, n_vpass, cap)


def _learn_query_bias(run, probe: _NoisyProbe, vals: _Values, opts: RobustOptions):
    """``[s q; 0]`` has logit ``s qᵀu`` (biased model only), once more at the target scale when the logits came
    out too small. Returns the frame Q, ``Q u``, the first probe scale ``s_a`` and the largest one ``a_max``."""
    d, cap, target = run.oracle.d, vals.cap, probe.target  # target: the caller's target_logit
    Q = equal_projection_orthogonal(vals.v, run.rng)
    u_proj = np.zeros(d)  # q_ℓᵀu in the frame Q
    a_max = cap
    s_a = max(min(4.0 * vals.s_v, cap), min(vals.scale, cap))
    if not opts.bias:
        return Q, u_proj, s_a, a_max
    s_u = min(4 * vals.scale, cap)
    # the u pass always re-measures (up to MAX_RETRIES) at the default target, and its clipped weights are not
    # counted: as before the move onto the skeleton (retries=0 limits the W passes only)
    probe = replace(probe, target=TARGET_LOGIT, retries=MAX_RETRIES, stats={"clipped": 0})
    with run.phase("query_bias"):
        u_proj = probe.measure(Q, np.zeros((1, d)), s_u, 0.0, np.zeros(d), "the query-bias pass [a; 0]",
                               a_cap=cap).Z[:, 0]  # b = 0: the logit is s qᵀu
    rms_u = float(np.sqrt(np.mean(u_proj**2))) * s_u
    if 0 < rms_u < target / 4:  # logits too small to resolve u well: once more at the target scale
        with run.phase("query_bias_rescale"):
            u_proj = probe.measure(Q, np.zeros((1, d)), min(cap, s_u * target / rms_u), 0.0, np.zeros(d),
                                   "the query-bias pass [a; 0] (rescaled)", a_cap=cap).Z[:, 0]
    big = float(np.max(np.abs(u_proj)))
    if big > 0:  # relative noise rewards a large aᵀv: go as far as the bias logit aᵀu allows
        a_max = min(cap, target / big)
        s_a = min(a_max, max(s_a, a_max / 2))
    return Q, u_proj, s_a, a_max


def _learn_weights(run, probe: _NoisyProbe, frame, cap: float, n_pass: int, opts: RobustOptions):
    """W from ``n_pass`` passes in fresh frames (averaged), each column block steered to the target logit.
    ``frame`` is the query-bias phase's ``(Q, Q u, s_a, a_max)``. Returns ``(W, s_a, s_b)``."""
    Q, u_proj, s_a, a_max = frame
    d, target = run.oracle.d, probe.target
    u = Q.T @ u_proj
    a_min = s_a
    s_b = 1.0 / s_a  # first block: unit product scale; steered from its logits
    block = max(1, min(d, opts.block_floats // (2 * d * d)))
    W_sum = np.zeros((d, d))
    for r in range(n_pass):
        if r > 0:
            Q = equal_projection_orthogonal(probe.v, run.rng)
            u_proj = Q @ u
        P = random_orthogonal(d, run.rng)
        M = np.empty((d, d))
        j0 = 0
        while j0 < d:
            J = np.arange(j0, min(d, j0 + (1 if (r == 0 and j0 == 0) else block)))
            with run.phase("weights"):
                m = probe.measure(Q, P[J], s_a, s_b, u_proj, f"columns {J[0]}..{J[-1]} of W", a_cap=a_max)
            M[:, J] = Q.T @ m.Z
            if np.isfinite(m.rms) and m.rms > 0:  # steer s_a s_b; keep s_b ≤ s_a (v̂'s error enters via b)
                prod = s_a * s_b * float(np.clip(target / m.rms, 1e-3, 1e3))
                s_a = min(a_max, max(a_min, math.sqrt(prod)))
                s_b = min(prod / s_a, cap)
            j0 = J[-1] + 1
            run.report()
        W_sum += M @ P
    return W_sum / n_pass, s_a, s_b
