"""Multi-head attention from whole output rows (vector answers; docs/multihead-vector.md).

The attention sublayer of a real model answers, at the query position, the K-vector
``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ X V_hᵀ + c`` (App. C's concatenate-then-project layer, ``V_h = W_O[:, h]
W_V[h]``). One query shows every head's attention at once; no saturation is needed and probes stay moderate.

1. **values** — length-1 queries ``[x] ↦ M x + c`` with ``M = Σ_h V_h`` (2d queries, ±x).
2. **calibrate** — a token norm ρ at which the heads' logits are of order one (``max_input_norm`` respected).
3. **separate** — for a probe difference δ, ``r(b) = f([b + δ; b]) − M b − c = Σ_h σ(δᵀ(W_h b + u_h)) V_h δ`` is a
   sigmoid network in ``b`` (:mod:`vector_heads`): its rank is H; Jennrich's method on two finite-difference
   Jacobians and variable projection give every ``V_h δ`` exactly. Nearby δ's keep the labels. Either the heads'
   column spaces ``C_h = span{V_h δ}`` split ``M`` (when they are well-conditioned), or d differences
   ``δ_k`` give ``V_h`` directly.
4. **logits** — with every ``V_h`` known, ``[b + p_1; …; b + p_m; b]`` measures ``p_iᵀ(W_h b + u_h)`` for every
   head and token (:mod:`vector_logits`): ``u_h`` at ``b = 0`` and ``W_h`` column block by column block.

Identifiable (and returned): ``W_h``, ``u_h``, ``V_h`` (the product ``W_O[:, h] W_V[h]``, not its factors) and
``c``, heads up to permutation. Heads with equal ``(W_h, u_h)`` (Prop. 7.1) attend identically and come back as
one head holding the sum of their ``V_h``.
"""

from __future__ import annotations

import numpy as np

from attnprobe._validation import check_int
from attnprobe.errors import (ConfigError, InputNormError, OracleAnswerError, OracleError, RecoveryError,
                              SeparationError, UnidentifiableError)
from attnprobe.learners.multihead.vector_heads import fit_delta, fit_deltas, jennrich, theta_from_values
from attnprobe.learners.multihead.vector_logits import gap_rank, head_attention_errors, learn_logits
from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.core.skeleton import Run
from attnprobe.oracles.input_bound import refuse_clipping

METHOD = "multihead-vector"
#: the column spaces split M when their stacked bases are at most this ill-conditioned (else d differences)
SUBSPACE_COND = 1e2
#: target size of the nonlinear part of a two-row answer, relative to its linear part (logits of order one)
TARGET_NONLINEARITY = 0.5
#: token norm of the logits stage relative to the calibrated one (m + 1 tokens spread the logits further)
LOGIT_SCALE = 0.5
#: differences δ_k = δ_0 + step·q_k, relative to |δ_0|: short ones inherit δ_0's head labels; long ones (coarse
#: answers) give V_h without dividing the fits' errors by a short step
SMALL_STEP, FAR_STEP = 0.05, 1.0
#: answers coarser than this unit roundoff (float32's is 6e-8) that fail to separate are refused naming it
COARSEST_EPS = 1e-6
#: differences asked and fitted together once only the route "differences" remains (one oracle call, one batch of
#: fits: the fits' shared work is paid once)
LATE_BATCH = 128
#: fresh queries of the per-head attention check (:func:`head_attention_errors`)
HEAD_CHECK_QUERIES = 16


def planned_values(d: int) -> int:
    """Queries of the values stage, the least a run asks: ``[±x]`` for the d rows of an orthogonal matrix."""
    return 2 * d


def design_dimension(coarse: bool) -> int:
    """q, the design plane's dimension: wider and denser for coarse answers (the fit averages them)."""
    return 8 if coarse else 3


def first_design_points(heads: int | None, coarse: bool) -> int:
    """Design points of δ_0 before its residuals' rank is first read (doubled until the rank shows a gap)."""
    return max(48 if coarse else 24, 2 * (heads or 0) + design_dimension(coarse) + 4)


def design_points(H: int, coarse: bool) -> int:
    """n, design points per difference δ: H² + Hq unknowns, H numbers per point."""
    return max(48 if coarse else 20, H + design_dimension(coarse) + 6)


def tokens_per_query(H: int, K: int, coarse: bool) -> int:
    """Probe tokens of the logits stage per query: Hm unknowns ≤ K/2 per query."""
    return max(1, min(8 if coarse else 16, K // (2 * H)))


#: the length-1 answers must move by this many roundings of the answers for ``M`` to be read at all
VALUE_ROUNDINGS = 10


def _values(oracle, rng, rho):
    """``M`` (K, d) and ``c`` (K,) from ``[±x]`` for the rows x of a scaled random orthogonal matrix. Refused (one
    :class:`ConfigError` naming ``max_input_norm``) when the bound keeps the probes so short that the answers do not
    move beyond their rounding."""
    d = oracle.d
    P = rho * random_orthogonal(d, rng)
    y = oracle(np.concatenate([P, -P])[:, None, :])
    moved, size = float(np.max(np.abs(y[:d] - y[d:]))), float(np.max(np.abs(y)))
    if not moved > VALUE_ROUNDINGS * max(float(oracle.eps), 1e-16) * size or not np.isfinite(rho**-2):
        where = (f"answers of size {size:.1e} move by {moved:.1e} between probes ±x of norm {rho:.3g}, within "
                 f"{VALUE_ROUNDINGS:g} roundings")
        if oracle.max_input_norm is None:
            raise UnidentifiableError(f"the layer's length-1 answers do not depend on the input ({where}): its value "
                                      "maps are zero to the answers' precision")
        raise ConfigError(f"The 'max_input_norm' parameter {oracle.max_input_norm:g} keeps the probes so short that "
                          f"the layer cannot be read ({where}); give a bound of order 1 or more",
                          param="max_input_norm")
    M = ((y[:d] - y[d:]) / 2).T @ P / rho**2  # P orthogonal·ρ: P⁻¹ = Pᵀ/ρ²
    c = (y[:d] + y[d:]).mean(axis=0) / 2
    return M, c


class _Layer:
    """The oracle seen through the length-1 part: residuals ``f(X) − M x_N − c`` (K, B)."""

    def __init__(self, oracle, M, c):
        self.oracle, self.M, self.c = oracle, M, c

    def residuals(self, X):
        y = self.oracle(X)
        return (y - X[:, -1, :] @ self.M.T - self.c).T


#: the nonlinear share of two-row answers the calibration looks for (at least; at most 1)
CALIBRATED = 0.25


def _calibrate(layer, rng, d, rho_max):
    """Token norm ρ at which two-row answers are about half nonlinear (logits of order one)."""
    rho = min(1.0, rho_max)
    for _ in range(12):
        b = rng.standard_normal((4, d)) * rho / np.sqrt(d)
        delta = rng.standard_normal((4, d)) * rho / np.sqrt(d)
        R = layer.residuals(np.stack([b + delta, b], axis=1))
        lin = (delta @ layer.M.T).T / 2
        ratio = float(np.median(np.linalg.norm(R - lin, axis=0) / np.maximum(np.linalg.norm(lin, axis=0), 1e-300)))
        if CALIBRATED <= ratio <= 1.0 or (ratio < CALIBRATED and rho >= rho_max):
            break
        rho = min(rho_max, rho * float(np.clip(np.sqrt(TARGET_NONLINEARITY / max(ratio, 1e-6)), 0.25, 4.0)))
    return rho, ratio


def extract_vector(oracle, *, heads=None, seed=0, check=True, progress=None, tokens=None, design=None,
                   asked_before=None):
    """Recover every head ``(W_h, u_h, V_h)`` and ``c`` of a layer answering K-vectors (module docstring).

    ``heads``: H if known (detected from the rank of the two-row residuals otherwise); ``tokens``: probe tokens
    per query in the logits stage (default 16, or 8 for answers coarser than float64); ``design``: design points
    per difference δ (default max(20, H + q + 6), 48 for coarse answers); ``asked_before``: queries this extraction
    asked before this learner, by phase (:class:`~attnprobe.learners.core.skeleton.Run`). Returns an
    :class:`~attnprobe.learners.core.result.Extraction` whose model is a
    :class:`~attnprobe.models.multihead.MultiHeadAttention` in the vector layout.
    """
    noise = oracle.noise  # a declared relative rounding up to float32's is rounding; anything else is refused
    if noise.tolerance or noise.sigma or noise.membership:
        raise RecoveryError(f"the answers carry declared noise (absolute {noise.tolerance:.1e}, random σ = "
                            f"{noise.sigma:.1e}{', sign only' if noise.membership else ''}): the vector learner "
                            "separates heads from answers exact up to their rounding (float64 or float32; a relative "
                            "noise of 1e-6 left heads 2.7e-2 wrong); ask for unperturbed answers")
    if noise.rel_eps > COARSEST_EPS:
        raise RecoveryError(f"the answers are rounded to a relative {noise.rel_eps:.1e} (coarser than float32): too "
                            "coarse to separate the heads of a whole output row; ask for float32 or finer answers")
    try:
        return _extract(oracle, heads=heads, seed=seed, check=check, progress=progress, tokens=tokens,
                        design=design, asked_before=asked_before)
    except RecoveryError as exc:
        eps = float(oracle.eps)
        if eps <= COARSEST_EPS:
            raise
        raise RecoveryError(f"answers in {oracle.precision} (unit roundoff {eps:.1e}, coarser than float32) are too "
                            f"coarse to separate the heads of a whole output row ({exc}); ask for float32 or finer "
                            "answers") from exc


def _extract(oracle, *, heads, seed, check, progress, tokens, design, asked_before):

    d = oracle.d
    heads, tokens, design = (check_int(v, name, min_value=1, allow_none=True)
                             for v, name in ((heads, "heads"), (tokens, "tokens"), (design, "design")))
    run = Run(oracle, METHOD, seed=seed, check=check, progress=progress, asked_before=asked_before)
    rng = run.rng
    eps = max(float(oracle.eps), 1e-16)
    coarse = eps > 1e-10

    max_norm = oracle.max_input_norm
    rho_max = np.inf if max_norm is None else float(max_norm) / 3.0
    run.plan(planned_values(d), f"vector multi-head extraction at d={d} (values stage)", at_least=True)
    notes: list[str] = []
    with run.phase("values"):
        M, c = _values(oracle, rng, min(1.0, rho_max))
    K = M.shape[0]
    if K < 2:
        raise ConfigError("the vector multi-head learner needs answers with K ≥ 2 outputs; use the scalar learners "
                          "for one output", param="method")
    layer = _Layer(oracle, M, c)
    with run.phase("calibrate"):
        try:
            rho, ratio = _calibrate(layer, rng, d, rho_max)
        except (OracleAnswerError, InputNormError):
            raise
        except OracleError as exc:  # e.g. a ReLU network: it answers length-1 queries only
            raise OracleAnswerError(f"the oracle {oracle.name!r} answers {K} outputs per sequence but failed on "
                                    f"two-row sequences ({exc}); the vector multi-head learner reads attention layers "
                                    "— for a ReLU network with K outputs use the ffn learner") from exc
    with run.phase("input bound"):
        refuse_clipping(oracle, 3 * rho, seed=int(rng.integers(2**31)))
    bounded = rho >= rho_max and not ratio >= CALIBRATED  # the bound stopped the calibration short
    if bounded and not (np.isfinite(ratio) and ratio < 1 / CALIBRATED):
        raise ConfigError(f"The 'max_input_norm' parameter {oracle.max_input_norm:g} keeps the probes at norm "
                          f"{rho:.3g}, where the two-row answers cannot be read (nonlinear part {ratio:.1e} of the "
                          "linear one); give a bound of order 1 or more", param="max_input_norm")
    if ratio < 30 * eps:
        if bounded:
            raise ConfigError(f"The 'max_input_norm' parameter {oracle.max_input_norm:g} keeps the probes at norm "
                              f"{rho:.3g}, where the two-row answers are affine to their precision (nonlinear part "
                              f"{ratio:.1e} of the linear one): no head's attention can be seen; give a larger "
                              "bound", param="max_input_norm")
        raise UnidentifiableError(f"two-row answers are affine in the input (nonlinear part {ratio:.1e} of the "
                                  "linear one at the largest probe norm): no head's attention depends on the input")
    try:
        return _separate_and_learn(oracle, run, layer, rng, rho, ratio, eps, coarse, heads, design, tokens, notes,
                                   K, d)
    except (RecoveryError, UnidentifiableError) as exc:
        if not bounded:
            raise
        raise type(exc)(f"{str(exc).rstrip('.')}; the probes were held to norm {3 * rho:.3g} by the "
                        f"'max_input_norm' parameter ({oracle.max_input_norm:g}), where the answers are only "
                        f"{ratio:.1e} nonlinear (the learner calibrates to {CALIBRATED:g}): a larger bound may let "
                        "the heads separate") from exc


def _separate_and_learn(oracle, run, layer, rng, rho, ratio, eps, coarse, heads, design, tokens, notes, K, d):
    """Separation, logits and the head check of :func:`_extract`, once the token norm ``rho`` is calibrated."""
    from attnprobe.models.multihead import MultiHeadAttention

    sep = _Separation(layer, rng, rho, eps, coarse)
    with run.phase("separate"):
        found = sep.detect(heads)
        H = found if heads is None else min(found, int(heads))
        if heads is not None and found != heads:
            notes.append(f"the two-row residuals have rank {found} where heads={heads} was given"
                         + (": heads with equal (W_h, u_h) attend identically (Prop. 7.1) and merge" if found < heads
                            else ""))
        sep.H = H
        sep.n = design or design_points(H, coarse)
        tokens = int(tokens or tokens_per_query(H, K, coarse))
        # (a difference whose continuation fails is restarted with 4H more queries: charged beyond this plan)
        rest = (from_scratch_queries(H) + d * sep.n * (2 if coarse else 1) + (d + 1) * -(-d // tokens)
                + HEAD_CHECK_QUERIES)
        planned = run.queries + rest
        run.plan(rest, f"vector multi-head extraction at d={d}, H={H} (at most)")
        V, route = sep.value_maps(run.report)
    with run.phase("logits"):
        W, u, smallest, w_ranks = learn_logits(layer, V, LOGIT_SCALE * rho, tokens, rng, run.report,
                                              sketch=not coarse)
    W, V, u, ties = merge_near_ties(W, V, u, eps, notes)
    H = W.shape[0]
    model = MultiHeadAttention(W, V, u, layer.c)
    with run.phase("head check"):
        head_errors = head_attention_errors(layer, model, LOGIT_SCALE * rho, tokens, rng, HEAD_CHECK_QUERIES)
    details = {"head_attention_error": head_errors.tolist(), "heads": H, "outputs": K, "token_norm": rho,
               "nonlinearity": ratio, "route": route, "W_rank": w_ranks,
               "differences": sep.count, "separation_misfit": sep.worst, "restarts": sep.restarts,
               "tokens_per_query": tokens,
               "smallest_attention": smallest, "head_rank": _ranks(V),
               "largest_probe_norm": float(oracle.max_input_norm_used), "check_scale": sep.s,
               "planned": planned, "near_ties": ties, "first_design_points": len(sep.T0), "design_points": sep.n}
    return run.finish(model, unknowns=MultiHeadAttention.unknowns(d, H, True, K), details=details, notes=notes,
                      check_scale=sep.s, hint=" (the layer is not a sum of softmax heads over whole output rows, or "
                                          "its answers are coarser than their precision says)")


def from_scratch_queries(H: int) -> int:
    """Queries of one separation from scratch (the first difference, and each restart): two finite-difference
    Jacobians, each ``±η`` along H directions, 4H."""
    return 4 * H


def tie_distance(eps: float) -> float:
    """Heads whose ``(W_h, u_h)`` lie closer than this (relative) are a near tie at unit roundoff ``eps``: their
    value maps separate with errors growing like ``1 / distance²`` (float64 heads 6.5e-3 apart come back with V_h
    1e-9 to 1.5e-8 off, 7e-4 apart 2e-7 to 8e-7; float32 heads 0.65 apart ≤ 6e-6, 6.4e-2 apart 1.6e-4: python
    benchmarks/near_ties.py, docs/benchmarks/verdicts.md; before this merge, float64 heads 6e-8 apart came back
    100-190 % off with exit 0), so the answers tell only their sum (Prop. 7.1, as for an exact tie):
    ``eps^(1/4)`` (1.2e-4 at float64, 1.9e-2 at float32)."""
    return float(eps) ** 0.25


def merge_near_ties(W, V, u, eps, notes):
    """Merge every pair of heads closer than :func:`tie_distance` into one head (their mean ``W, u`` and the sum
    of their ``V_h``: what the answers determine, Prop. 7.1) and name each merge in ``notes``. Returns ``W, V,
    u`` and the merges as ``[(head, head, distance)]`` (indices into the heads as found)."""
    limit = tie_distance(eps)
    groups = [[h] for h in range(W.shape[0])]
    merges = []
    merged = True
    while merged and len(groups) > 1:
        merged = False
        P = [np.concatenate([W[g].mean(0).ravel(), u[g].mean(0)]) for g in groups]
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                dist = float(np.linalg.norm(P[a] - P[b]) / max(np.linalg.norm(P[a]), np.linalg.norm(P[b]), 1e-300))
                if dist < limit:
                    merges.append((groups[a][0], groups[b][0], dist))
                    groups[a] = groups[a] + groups.pop(b)
                    merged = True
                    break
            if merged:
                break
    for a, b, dist in merges:
        notes.append(f"heads {a} and {b} attend nearly identically ((W_h, u_h) {dist:.1e} apart, relative, below "
                     f"{limit:.1e} at these answers' precision): their separate value maps cannot be told from the "
                     "answers, so they are merged into one head holding the sum of their V_h (Prop. 7.1)")
    if not merges:
        return W, V, u, []
    return (np.stack([W[g].mean(0) for g in groups]), np.stack([V[g].sum(0) for g in groups]),
            np.stack([u[g].mean(0) for g in groups]), merges)


class _Separation:
    """Stage 3: the heads' value vectors ``w_h = V_h δ`` along many differences δ, on the design plane
    ``b = b_0 + Z t`` (module docstring); ``H`` and ``n`` (design points per δ) are set after :meth:`detect`."""

    def __init__(self, layer, rng, rho, eps, coarse):
        d = layer.M.shape[1]
        self.layer, self.rng, self.eps, self.coarse, self.d = layer, rng, eps, coarse, d
        self.q = design_dimension(coarse)
        self.s = rho / np.sqrt(d)
        self.b0 = rng.standard_normal(d) * self.s
        self.Z = np.linalg.qr(rng.standard_normal((d, self.q)))[0] * rho
        self.eta = rho * (3e-3 if coarse else 1e-5)  # finite-difference step of the Jacobians
        self.tol = _fit_tolerance(eps)
        self.delta0 = rng.standard_normal(d) * self.s
        self.H = self.n = None
        self.count, self.worst, self.restarts = 0, 0.0, 0

    def residuals(self, T, delta):
        return self.layer.residuals(_two_row(self.b0 + T @ self.Z.T, delta))

    def detect(self, heads):
        """The number of heads: the rank of δ_0's residuals (design points added until it shows a gap)."""
        K = self.layer.M.shape[0]
        n0 = first_design_points(heads, self.coarse)
        self.T0, self.R0 = np.zeros((0, self.q)), np.zeros((K, 0))
        while True:
            T_new = self.rng.standard_normal((n0 - len(self.T0), self.q)) / np.sqrt(self.q)
            self.R0 = np.concatenate([self.R0, self.residuals(T_new, self.delta0)], axis=1)
            self.T0 = np.concatenate([self.T0, T_new])
            sv = np.linalg.svd(self.R0, compute_uv=False)
            found = int(np.sum(sv > 100 * self.eps * sv[0] * np.sqrt(self.R0.shape[1])))
            if found == 0:
                raise RecoveryError("the two-row residuals are all below the answers' rounding: no head's "
                                    "attention is visible at these probes")
            if found < min(self.R0.shape) - 4:
                return found
            if n0 >= K:
                raise RecoveryError(f"the two-row residuals have rank {found} of at most {min(self.R0.shape)}: "
                                    "more heads than K outputs can separate, or answers noisier than their "
                                    "precision says")
            n0 = min(K, 2 * n0)

    def from_scratch(self, delta, R, T):
        """Jennrich on two finite-difference Jacobians (:func:`from_scratch_queries`), then variable projection."""
        H, M = self.H, self.layer.M
        U = np.linalg.svd(R, full_matrices=False)[0][:, :H]
        G = self.rng.standard_normal((self.d, H)) * self.s
        Js = []
        for _ in range(2):
            bb = self.b0 + self.Z @ (self.rng.standard_normal(self.q) / np.sqrt(self.q))
            Js.append((self.layer.residuals(_two_row(bb + self.eta * G.T, delta))
                       - self.layer.residuals(_two_row(bb - self.eta * G.T, delta))) / (2 * self.eta))
        w = jennrich(Js[0], Js[1], U, M @ delta)
        return fit_delta(R, T, M @ delta, theta_from_values(w, R, T))

    def fits(self, deltas, thetas):
        """Separate a batch of differences, each started from its θ (restarted from scratch if that fails)."""
        n = self.n
        R = self.layer.residuals(np.concatenate([_two_row(self.b0 + self.T @ self.Z.T, dl) for dl in deltas]))
        Rs = R.reshape(R.shape[0], len(deltas), n).transpose(1, 0, 2)  # (F, K, n): one block per difference
        fitted = fit_deltas(Rs, self.T, np.stack(deltas) @ self.layer.M.T, np.stack(thetas))
        out = []
        for dl, th, Rj, fk in zip(deltas, thetas, Rs, fitted):
            if fk.residual > self.tol:  # the continuation fell into another minimum: start this δ afresh
                self.restarts += 1
                fk = _relabel(self.from_scratch(dl, Rj, self.T), th.T, None)
            if fk.residual > self.tol:
                raise SeparationError(f"a probe difference did not separate into the {self.H} heads found first "
                                      f"(misfit {fk.residual:.1e} > {self.tol:.1e}); retry with another seed",
                                      misfit=fk.residual, tolerance=self.tol)
            out.append(fk)
        return out

    def value_maps(self, report, batch: int = 16):
        """Every ``V_h`` (route "differences" or "column spaces", :func:`_value_maps`)."""
        d, M, eps = self.d, self.layer.M, self.eps
        fit0 = self.from_scratch(self.delta0, self.R0, self.T0)
        if fit0.residual > self.tol:
            raise SeparationError(f"the heads did not separate along the first probe difference (misfit "
                                  f"{fit0.residual:.1e} > {self.tol:.1e}): the layer is not a sum of H={self.H} "
                                  "softmax heads with independent value maps, or its answers are noisier than their "
                                  "precision", misfit=fit0.residual, tolerance=self.tol)
        self.T = self.rng.standard_normal((self.n, self.q)) / np.sqrt(self.q)
        Q = random_orthogonal(d, self.rng)
        size = np.linalg.norm(self.delta0)
        ws, deltas, self.worst = [fit0.w], [self.delta0], fit0.residual
        split = True  # the column spaces may still split M (False once exhausted spaces did not)
        k0 = 0
        while k0 < d:  # batches of `batch` differences while the column spaces may split M, then larger ones
            ks = range(k0, min(d, k0 + (batch if split else LATE_BATCH)))
            k0 = ks.stop
            dk = [self.delta0 + SMALL_STEP * size * Q[k] for k in ks]
            fits = [_relabel(f, fit0.w, f.w) for f in self.fits(dk, [fit0.theta] * len(dk))]
            if self.coarse:  # θ is linear in δ: extrapolate the short difference's θ to the long one, fit there
                dk = [self.delta0 + FAR_STEP * size * Q[k] for k in ks]
                guess = [fit0.theta + FAR_STEP / SMALL_STEP * (f.theta - fit0.theta) for f in fits]
                fits = [_relabel(f, g.T, f.theta.T) for f, g in zip(self.fits(dk, guess), guess)]
            for dl, fk in zip(dk, fits):
                self.worst = max(self.worst, fk.residual)
                ws.append(fk.w)
                deltas.append(dl)
            self.count = len(deltas)
            report()
            final = len(deltas) == d + 1
            if final or (split and not self.coarse and len(ws) >= 16 and (len(ws) - 1) % 32 == 0):
                V, route = _value_maps(np.stack(ws, axis=2), np.stack(deltas, axis=1), M, eps, final=final)
                if V is not None:
                    return V, route
                split = route != "no split"  # more differences span the same spaces: they cannot split M either
        raise RecoveryError("the value maps could not be assembled")  # pragma: no cover - final always returns


def _relabel(fit, ref, got):
    """The fit with its heads put in the order of the reference: columns of ``got`` (a view of the fit) matched to
    the nearest columns of ``ref`` (the assignment of least total distance: Hungarian, unless every reference
    column has a different nearest one), so every difference keeps δ_0's head labels."""
    got = fit.theta.T if got is None else got
    cost = np.linalg.norm(got[:, :, None] - ref[:, None, :], axis=0)
    order = np.argmin(cost, axis=0)  # each reference head's nearest: optimal whenever they are all different
    if len(np.unique(order)) < len(order):
        from scipy.optimize import linear_sum_assignment

        rows, cols = linear_sum_assignment(cost)
        order = rows[np.argsort(cols)]
    fit.w, fit.theta = fit.w[:, order], fit.theta[order]
    return fit


def _two_row(B, delta):
    """Queries ``[b + δ; b]`` for the rows b of ``B``."""
    B = np.atleast_2d(B)
    return np.stack([B + delta, B], axis=1)


def _fit_tolerance(eps):
    """Largest relative misfit of a correct separation: the answers' rounding, generously amplified."""
    return max(1e4 * eps, 1e-11)


def _ranks(V):
    """Numerical rank of each ``V_h``: at the largest gap of its singular values (:func:`gap_rank`)."""
    return [gap_rank(np.linalg.svd(Vh, compute_uv=False), min(Vh.shape)) for Vh in V]


def _value_maps(Wv, D, M, eps, final):
    """The value maps ``V_h`` from the separated ``w_h(δ_j) = V_h δ_j`` (``Wv (K, H, m)``, ``D (d, m)``): the
    heads' column spaces split ``M`` when well-conditioned; with d + 1 differences, ``V_h = w_h D⁺`` directly.
    Returns ``(V, route)``, or ``(None, why)``: ``"not exhausted"`` (a column space may still grow) or ``"no
    split"`` (every space is exhausted, and together they are too ill-conditioned or do not span M)."""
    K, H, m = Wv.shape
    if final:
        return np.matmul(Wv.transpose(1, 0, 2), np.linalg.pinv(D)), "differences"
    bases = []
    for h in range(H):
        Uh, sh, _ = np.linalg.svd(Wv[:, h, :], full_matrices=False)
        r = int(np.sum(sh > max(1e3 * eps, 1e-11) * sh[0]))
        if r >= m - 8:  # the column space is not exhausted yet
            return None, "not exhausted"
        bases.append(Uh[:, :r])
    E = np.concatenate(bases, axis=1)
    if E.shape[1] > K or np.linalg.cond(E) > SUBSPACE_COND:
        return None, "no split"
    coef, *_ = np.linalg.lstsq(E, M, rcond=None)
    if np.linalg.norm(M - E @ coef) > 1e3 * eps * np.linalg.norm(M):
        return None, "no split"
    out, i = [], 0
    for Eh in bases:
        out.append(Eh @ coef[i:i + Eh.shape[1]])
        i += Eh.shape[1]
    return np.stack(out), "column spaces"
