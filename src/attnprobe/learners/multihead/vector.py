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
from attnprobe.learners.multihead.groups import grouped_numbers, head_groups
from attnprobe.learners.multihead.vector_heads import (DeltaFit, fit_delta, fit_deltas, inverse_mean_index,
                                                       jennrich, rank_distance, theta_from_values)
from attnprobe.learners.multihead.vector_logits import gap_rank, head_attention_errors, learn_logits
from attnprobe.learners.multihead.vector_rows import learn_logits_rows
from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.core.skeleton import Run
from attnprobe.oracles.input_bound import refuse_clipping

METHOD = "multihead-vector"
#: the column spaces split M when their stacked bases are at most this ill-conditioned (else d differences)
SUBSPACE_COND = 1e2
#: the same for differences separated on every row of progressions (their w_h are more accurate: MiniLM layer 2,
#: stacked bases cond 1.6e3, gives V_h to 4e-11 this way; layer 5, cond 7.1e4, gave W_h 7.1e-8: past the 1e-8 goal)
SUBSPACE_COND_ROWS = 1e4
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
#: tokens of the progressions ``[b; b + δ; …]`` of the separation when a bidirectional layer answers every row
PROGRESSION = 6
#: the progressions' step δ is the two-row difference over PROGRESSION_SHRINK·(PROGRESSION − 1) (MiniLM layer 0:
#: with the two-row step the progressions saturated and a difference did not separate, misfit 3.2e-3; at 1/2.5, 818
#: sequences, W_h 4.3e-9)
PROGRESSION_SHRINK = 0.5
#: the design plane's dimension for progressions (2 left a MiniLM difference unseparated: misfit 2.8e-5)
ROWS_Q = 3
#: coarse answers on progressions: design points of δ_0 and each short difference (7 progressions of 6 rows)
ROWS_DESIGN_COARSE = 42
#: the long differences ``β·δ_0 + step·|δ_0|·q_k`` of coarse answers on progressions, on δ_0's design plane widened
#: ``width`` times, as ``(β, step, width)``: V_h = w_h D⁺ divides a fit's error by the step, and the fits' errors
#: fall as the logits spread over the design (MiniLM layer 2 float32, seed 2: V_h 2.9e-4 at (1, 0.5, 1), where
#: the fit's errors per head follow its linearised covariance); the narrow one is taken where the wide one's probes
#: would pass ``max_input_norm``
ROWS_FAR_WIDE, ROWS_FAR_NARROW = (2.0, 1.0, 2.0), (1.0, 0.5, 1.0)
#: progressions of each long difference
ROWS_FAR_PROGRESSIONS = 6
#: coarse answers on progressions: a fit's misfit may be at most this many times its answers' distance from rank H
#: (:func:`rank_distance`). Correct fits: MiniLM layer 2 float32 1.06–1.41×, random float32 layers d = 16–64
#: 1.1–3.1×; wrong minima of MiniLM seeds 3 and 9: 17× (a short difference, misfit 8.9e-6) to 137× and 1.4e3×
#: (δ_0 and every short difference continued from it, misfit 7.7e-4), all below the rounding bound 1e4·eps = 1.2e-3
MISFIT_SPREAD = 6.0
#: coarse answers on progressions: the first difference's fit is started afresh (new Jacobians) up to this many
#: times when it misses its tolerance (MiniLM layer 2 float32, seed 7: misfit 1.6e-3 from the first start)
FIRST_RETRIES = 2
#: coarse answers on progressions: rounds of long differences, each asking fresh directions for the fits of the
#: round before that fell into other minima (MiniLM layer 2 float32: 1 of 384 in seeds 5 and 9)
FAR_ROUNDS = 3
#: directions per sequence of the every-position logits stage, at most, and as a share of K/H (MiniLM: 24, the
#: K × Hm matrix [V_h x_j] 3/4 full; W_h 8.5e-10 where 16 gave 6.8e-10, with 122 sequences instead of 230)
ROWS_MAX_TOKENS, ROWS_TOKEN_SHARE = 24, 0.75
#: the same cap for coarse answers: the value maps' float32 error moves the rows by Σ_h E_h (z_h − z̄), amplified
#: as [V_h x_j] fills (MiniLM layer 2 float32, seeds 0–9: W_h ≤ 6.6e-4, u_h ≤ 7.1e-4 at 20 (780 sequences); at 24
#: (528) seed 1 had W_h 1.0e-3, and 4 of 10 seeds had u_h > 1e-3 before every reading was averaged)
ROWS_MAX_TOKENS_COARSE = 20
#: fresh queries of the per-head attention check (:func:`head_attention_errors`)
HEAD_CHECK_QUERIES = 16


def planned_values(d: int, every_position: bool = False) -> int:
    """Queries of the values stage, the least a run asks: ``[±x]`` for the d rows of an orthogonal matrix (an
    oracle answering every position: ``[x]`` and ``[0]``)."""
    return d + 1 if every_position else 2 * d


def design_dimension(coarse: bool) -> int:
    """q, the design plane's dimension: wider and denser for coarse answers (the fit averages them)."""
    return 8 if coarse else 3


def first_design_points(heads: int | None, coarse: bool) -> int:
    """Design points of δ_0 before its residuals' rank is first read (doubled until the rank shows a gap)."""
    return max(48 if coarse else 24, 2 * (heads or 0) + design_dimension(coarse) + 4)


def progression_points(n: int, length: int, q: int) -> int:
    """Progressions per difference δ when every row is read: n design points in all, and at least q + 2
    distinct points of the plane (each head's logit has q + 1 coefficients on it)."""
    return max(q + 2, -(-n // length))


def far_progressions(q: int) -> int:
    """Progressions of each long difference of coarse answers (:data:`ROWS_FAR_PROGRESSIONS`, at least q + 2)."""
    return max(q + 2, ROWS_FAR_PROGRESSIONS)


def design_points(H: int, coarse: bool) -> int:
    """n, design points per difference δ: H² + Hq unknowns, H numbers per point."""
    return max(48 if coarse else 20, H + design_dimension(coarse) + 6)


def rows_tokens(H: int, K: int, coarse: bool = False) -> int:
    """Directions per sequence of the every-position logits stage: Hm unknowns ≤ ROWS_TOKEN_SHARE·K per row."""
    cap = ROWS_MAX_TOKENS_COARSE if coarse else ROWS_MAX_TOKENS
    return max(1, min(cap, int(ROWS_TOKEN_SHARE * K) // H))


def tokens_per_query(H: int, K: int, coarse: bool) -> int:
    """Probe tokens of the logits stage per query: Hm unknowns ≤ K/2 per query."""
    return max(1, min(8 if coarse else 16, K // (2 * H)))


#: the length-1 answers must move by this many roundings of the answers for ``M`` to be read at all
VALUE_ROUNDINGS = 10


def _values(oracle, rng, rho):
    """``M`` (K, d) and ``c`` (K,) from ``[±x]`` for the rows x of a scaled random orthogonal matrix; when the
    oracle answers every position (its rows then go to the later stages), ``[x]`` and ``[0]``: d + 1 queries.
    Refused (one :class:`ConfigError` naming ``max_input_norm``) when the bound keeps the probes so short that the
    answers do not move beyond their rounding."""
    d = oracle.d
    P = rho * random_orthogonal(d, rng)
    y_plus = oracle(P[:, None, :])
    if getattr(oracle, "every_position", False):
        c = oracle(np.zeros((1, 1, d)))[0]
        y_minus = 2 * c - y_plus  # (the length-1 answers are affine: [−x] answers 2c − [x])
    else:
        y_minus = oracle(-P[:, None, :])
    moved, size = float(np.max(np.abs(y_plus - y_minus))), float(np.max(np.abs(np.concatenate([y_plus, y_minus]))))
    if not moved > VALUE_ROUNDINGS * max(float(oracle.eps), 1e-16) * size or not np.isfinite(rho**-2):
        where = (f"answers of size {size:.1e} move by {moved:.1e} between probes ±x of norm {rho:.3g}, within "
                 f"{VALUE_ROUNDINGS:g} roundings")
        if oracle.max_input_norm is None:
            raise UnidentifiableError(f"the layer's length-1 answers do not depend on the input ({where}): its value "
                                      "maps are zero to the answers' precision")
        raise ConfigError(f"The 'max_input_norm' parameter {oracle.max_input_norm:g} keeps the probes so short that "
                          f"the layer cannot be read ({where}); give a bound of order 1 or more",
                          param="max_input_norm")
    M = ((y_plus - y_minus) / 2).T @ P / rho**2  # P orthogonal·ρ: P⁻¹ = Pᵀ/ρ²
    c = (y_plus + y_minus).mean(axis=0) / 2
    return M, c


class LayerResiduals:
    """The oracle seen through the length-1 part: residuals ``f(X) − M x_N − c`` (K, B)."""

    def __init__(self, oracle, M, c):
        self.oracle, self.M, self.c = oracle, M, c

    def residuals(self, X):
        y = self.oracle(X)
        return (y - X[:, -1, :] @ self.M.T - self.c).T


def _rows_kind(oracle) -> str | None:
    """``"causal"`` or ``"bidirectional"`` when the oracle answers every position and its rows are readable as
    attention at every query token (docs/every-position.md); None otherwise (the last position is read)."""
    if not getattr(oracle, "every_position", False):
        return None
    kind = oracle.positions
    return kind if kind in ("causal", "bidirectional") else None


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
    run.plan(planned_values(d, bool(getattr(oracle, "every_position", False))),
             f"vector multi-head extraction at d={d} (values stage)", at_least=True)
    notes: list[str] = []
    with run.phase("values"):
        M, c = _values(oracle, rng, min(1.0, rho_max))
    K = M.shape[0]
    if K < 2:
        raise ConfigError("the vector multi-head learner needs answers with K ≥ 2 outputs; use the scalar learners "
                          "for one output", param="method")
    layer = LayerResiduals(oracle, M, c)
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
        return _separate_and_learn(oracle, run, layer, rng, rho, ratio=ratio, eps=eps, coarse=coarse, heads=heads,
                                   design=design, tokens=tokens, notes=notes, K=K, d=d)
    except (RecoveryError, UnidentifiableError) as exc:
        if not bounded:
            raise
        raise type(exc)(f"{str(exc).rstrip('.')}; the probes were held to norm {3 * rho:.3g} by the "
                        f"'max_input_norm' parameter ({oracle.max_input_norm:g}), where the answers are only "
                        f"{ratio:.1e} nonlinear (the learner calibrates to {CALIBRATED:g}): a larger bound may let "
                        "the heads separate") from exc


def _separate_and_learn(oracle, run, layer, rng, rho, *, ratio, eps, coarse, heads, design, tokens, notes, K, d):
    """Separation, logits and the head check of :func:`_extract`, once the token norm ``rho`` is calibrated."""
    from attnprobe.models.multihead import MultiHeadAttention

    rows_kind = _rows_kind(oracle)
    # float32 answers read the last row: progressions of 6 (small layer d=32 H=4) left V_h at 6.7e-4 where
    # two-row queries give 2.5e-6; both rows of two-row queries left a MiniLM difference unseparated (misfit 5.9e-3)
    rows = rows_kind == "bidirectional"
    sep = _Separation(layer, rng, rho, eps, coarse, length=PROGRESSION if rows else 2, rows=rows)
    with run.phase("separate"):
        found = sep.detect(heads)
        H = found if heads is None else min(found, int(heads))
        if heads is not None and found != heads:
            notes.append(f"the two-row residuals have rank {found} where heads={heads} was given"
                         + (": heads with equal (W_h, u_h) attend identically (Prop. 7.1) and merge" if found < heads
                            else ""))
        sep.H = H
        sep.n = design or (ROWS_DESIGN_COARSE if rows and coarse else design_points(H, coarse))
        tokens = int(tokens or (tokens_per_query(H, K, coarse) if rows_kind is None else rows_tokens(H, K, coarse)))
        # (a difference whose continuation fails is restarted with 4H more queries: charged beyond this plan)
        rest = (from_scratch_queries(H) + d * sep.n * (2 if coarse else 1) + (d + 1) * -(-d // tokens)
                + HEAD_CHECK_QUERIES)
        planned = run.queries + rest
        run.plan(rest, f"vector multi-head extraction at d={d}, H={H} (at most)")
        V, route = sep.value_maps(run.report)
        if sep.fallback:
            notes.append(f"the rows of progressions along the first difference did not separate ({sep.fallback}): "
                         "the separation read the last row of two-row queries")
    rows = rows_kind
    with run.phase("logits"):  # (causal rows too)
        if rows is None:
            W, u, smallest, w_ranks = learn_logits(layer, V, LOGIT_SCALE * rho, tokens, rng, run.report,
                                                  sketch=not coarse)
        else:  # every position: m² logits of every head per sequence (vector_rows)
            W, u, smallest, w_ranks, _ = learn_logits_rows(oracle, layer.c, V, LOGIT_SCALE * rho, tokens, rng,
                                                           run.report, causal=rows == "causal", sketch=not coarse)
    if coarse:
        W, u, cut = truncate_to_value_ranks(W, V, u)
        if cut:
            notes.append(f"W_h cut to the rank of V_h (heads {', '.join(map(str, cut))}) and u_h projected on its "
                         "column space: coarse answers' noise spreads over every entry, a head's keys span d_h")
    W, V, u, ties = merge_near_ties(W, V, u, eps, notes)
    H = W.shape[0]
    model = MultiHeadAttention(W, V, u, layer.c)
    with run.phase("head check"):
        head_errors = head_attention_errors(layer, model, LOGIT_SCALE * rho, tokens, rng, HEAD_CHECK_QUERIES)
    groups = head_groups(W, V, tol=1e-3 if coarse else 1e-6)
    if len(groups) < H:
        notes.append(f"heads share keys and values in {len(groups)} groups (GQA/MQA): "
                     + ", ".join("{" + ", ".join(map(str, g)) + "}" for g in groups))
    details = {"head_attention_error": head_errors.tolist(), "groups": groups,
               "result_numbers": grouped_numbers(W, V, groups), "value_rank": sep.value_rank,
               "heads": H, "outputs": K, "token_norm": rho,
               "nonlinearity": ratio, "route": route, "W_rank": w_ranks,
               "differences": sep.count, "separation_misfit": sep.worst, "restarts": sep.restarts,
               "dropped": sep.dropped,
               "tokens_per_query": tokens,
               "smallest_attention": smallest, "head_rank": _ranks(V),
               "largest_probe_norm": float(oracle.max_input_norm_used), "check_scale": sep.s,
               "planned": planned, "near_ties": ties, "first_design_points": len(sep.T0), "design_points": sep.n,
               "progressions": sep.length if sep.rows else None,
               "positions": oracle.positions if oracle.every_position else "last", "rows": oracle.rows}
    return run.finish(model, unknowns=MultiHeadAttention.unknowns(d, H, True, K), details=details, notes=notes,
                      check_scale=sep.s, hint=" (the layer is not a sum of softmax heads over whole output rows, or "
                                          "its answers are coarser than their precision says)")


#: W_h is cut to V_h's rank r only where its singular values drop at r by at least this factor
TRUNCATE_GAP = 10.0
#: u_h is projected on W_h's column space when it lies there up to this share of its norm (a u_h drawn at random
#: lies 0.96 outside a 32-dimensional space of R^384; float32 noise ≈ 3e-3)
U_INSIDE = 0.05


def truncate_to_value_ranks(W, V, u):
    """``W_h = K_hᵀQ_h/√d_h`` and ``V_h = W_O,h W_V,h`` both have rank d_h, and ``u_h = K_hᵀb_Q/√d_h`` lies in
    ``W_h``'s column space: where ``W_h``'s singular values drop at ``V_h``'s rank r (by :data:`TRUNCATE_GAP`),
    ``W_h`` is cut to its best rank-r approximation and ``u_h`` projected on its column space (when it lies there
    up to :data:`U_INSIDE`: a layer may have any u_h), dropping most of
    the coarse answers' noise spread over all entries (MiniLM layer 2, float32: W_h 1.8e-3 → 7.3e-4). Returns
    ``W, u`` and the heads cut."""
    W, u, cut = W.copy(), u.copy(), []
    for h, r in enumerate(_ranks(V)):
        if r >= W.shape[1]:
            continue
        U, sv, Vt = np.linalg.svd(W[h])
        if sv[r] * TRUNCATE_GAP > sv[r - 1]:
            continue
        W[h] = (U[:, :r] * sv[:r]) @ Vt[:r]
        inside = U[:, :r] @ (U[:, :r].T @ u[h])
        if np.linalg.norm(u[h] - inside) <= U_INSIDE * np.linalg.norm(u[h]):  # (a general u_h is far outside)
            u[h] = inside
        cut.append(h)
    return W, u, cut


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

    def __init__(self, layer, rng, rho, eps, coarse, *, length=2, rows=False):
        d = layer.M.shape[1]
        self.layer, self.rng, self.eps, self.coarse, self.d = layer, rng, eps, coarse, d
        #: tokens of the progressions ``[b; b + δ; …]`` (2: two-row queries) and whether every row is read (else the
        #: last)
        self.length, self.rows = int(length), bool(rows)
        self.q = ROWS_Q if self.rows else design_dimension(coarse)
        self.s = rho / np.sqrt(d)
        self.b0 = rng.standard_normal(d) * self.s
        self.Z = np.linalg.qr(rng.standard_normal((d, self.q)))[0] * rho
        self.eta = rho * (3e-3 if coarse else 1e-5)  # finite-difference step of the Jacobians
        self.tol = _fit_tolerance(eps)
        self.delta0 = rng.standard_normal(d) * self.s
        self.H = self.n = None
        self.count, self.worst, self.restarts, self.dropped = 0, 0.0, 0, 0
        self.value_rank = d
        self.fallback = None  # why progressions were left for two-row queries

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

    def progression_design(self, count):
        """``count`` design points t of progressions and the design of their rows ``[t; k]`` (t-major)."""
        t = self.rng.standard_normal((count, self.q)) / np.sqrt(self.q)
        return t, self.rows_design(t)

    def rows_design(self, t):
        """The design of the rows ``[t; k]`` (t-major) of progressions at the points ``t``."""
        P = self.length
        return np.concatenate([np.repeat(t, P, axis=0), np.tile(np.arange(P), len(t))[:, None]], axis=1)

    def progression_residuals(self, deltas):
        """Rows of ``[b; b + δ; …; b + (P−1)δ]`` at the progression design, minus ``M b + c``: (F, K, n·P)."""
        P, M, c = self.length, self.layer.M, self.layer.c
        Bs = self.b0 + self.Tp @ self.Z.T  # (n, d)
        X = np.concatenate([Bs[:, None, :] + np.arange(P)[None, :, None] * dl[None, None, :] for dl in deltas])
        Y = self.layer.oracle.answer_rows(X) - (np.tile(Bs, (len(deltas), 1)) @ M.T)[:, None, :] - c
        n = len(Bs)
        return Y.reshape(len(deltas), n, P, -1).transpose(0, 3, 1, 2).reshape(len(deltas), -1, n * P)

    def start_progressions(self, fit0):
        """δ_0 separated on progressions, started from its two-row fit ``fit0``: the same θ on the plane and
        ``e_h = δᵀW_hδ`` read from the rows where the link is not saturated (else from every row's inverted link).
        When neither start separates them, the rows are left unread (``self.rows`` False: two-row queries, the
        last row) and ``fit0`` is returned as it was."""
        M, P = self.layer.M, self.length
        # a progression spans (P − 1)·δ: δ shrunk so that its logits span what the two-row queries' did (θ and w are
        # linear in δ)
        shrink = PROGRESSION_SHRINK * (P - 1)
        self.delta0 = self.delta0 / shrink
        two_row = fit0
        fit0 = DeltaFit(fit0.w / shrink, fit0.theta / shrink, fit0.residual)
        self.Tp, self.T = self.progression_design(progression_points(self.n, P, self.q))
        R0 = self.progression_residuals([self.delta0])[0]
        k = self.T[:, -1]
        S = np.linalg.lstsq(fit0.w, R0, rcond=None)[0]  # μ_h at every row, (H, n·P)
        lam = inverse_mean_index(np.clip(S, 1e-6 * (P - 1), (1 - 1e-6) * (P - 1)), P)
        plane = fit0.theta @ np.concatenate([self.T[:, :-1], np.ones((len(k), 1))], axis=1).T  # θ_h(t)
        live = (S > 0.02 * (P - 1)) & (S < 0.98 * (P - 1)) & (k > 0)
        e = np.array([np.median(((lam[h] - plane[h]) / np.maximum(k, 1))[live[h]]) if live[h].any() else 0.0
                      for h in range(self.H)])
        starts = [np.concatenate([fit0.theta[:, :-1], e[:, None], fit0.theta[:, -1:]], axis=1),
                  theta_from_values(fit0.w, R0, self.T, length=P)]
        tol = float(self.tolerances(R0[None])[0])
        for start in starts:
            fit = fit_delta(R0, self.T, M @ self.delta0, start, length=P)
            if fit.residual <= tol:
                return fit
        if self.coarse:  # both starts fell into other minima: Jennrich's start on the progressions (new queries)
            self.restarts += 1
            fit = self.from_scratch(self.delta0, R0, self.T, P)
            fit = relabel(fit, fit0.w, fit.w)
            if fit.residual <= tol:
                return fit
        self.rows, self.length, self.fallback = False, 2, f"misfit {fit.residual:.1e}"
        self.delta0 = self.delta0 * shrink
        return two_row

    def from_scratch(self, delta, R, T, length=2):
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
        return fit_delta(R, T, M @ delta, theta_from_values(w, R, T, length=length), length=length)

    def fits(self, deltas, thetas=None, values=None, *, spare=False):
        """Separate a batch of differences, each started from its θ, or from guesses of its value vectors
        ``values`` (K, H) each (:func:`theta_from_values`), judged by :meth:`tolerances`; a fit above it is
        restarted from scratch, or, ``spare`` (the difference can be replaced by another), dropped: None in its
        place."""
        n, P = self.n, self.length
        if self.rows:
            Rs = self.progression_residuals(deltas)
        else:
            R = self.layer.residuals(np.concatenate([_two_row(self.b0 + self.T @ self.Z.T, dl) for dl in deltas]))
            Rs = R.reshape(R.shape[0], len(deltas), n).transpose(1, 0, 2)  # (F, K, n): one block per difference
        if thetas is None:
            thetas = [theta_from_values(w, Rj, self.T, length=P) for w, Rj in zip(values, Rs)]
        fitted = fit_deltas(Rs, self.T, np.stack(deltas) @ self.layer.M.T, np.stack(thetas), length=P)
        tols = self.tolerances(Rs)
        out = []
        for dl, th, Rj, fk, tol in zip(deltas, thetas, Rs, fitted, tols):
            if fk.residual > tol and spare:  # another minimum; this δ only helped find the column spaces
                self.dropped += 1
                out.append(None)
                continue
            if fk.residual > tol:  # the continuation fell into another minimum: start this δ afresh
                self.restarts += 1
                fk = relabel(self.from_scratch(dl, Rj, self.T, P), th.T, None)
            if fk.residual > tol:
                raise SeparationError(f"a probe difference did not separate into the {self.H} heads found first "
                                      f"(misfit {fk.residual:.1e} > {tol:.1e}{self.tolerance_why(tol)}): its fit "
                                      "landed in another minimum, also from scratch; retry with another seed",
                                      misfit=fk.residual, tolerance=tol)
            out.append(fk)
        return out

    def tolerances(self, Rs):
        """The largest misfit a correct fit of each residual block ``Rs (F, K, n)`` may have. Coarse answers on
        progressions: :data:`MISFIT_SPREAD` times the block's distance from rank H (``Σ_h w_h s_hᵀ`` has rank H:
        what lies beyond is the answers' rounding, which a correct fit leaves and a wrong minimum exceeds), at most
        the rounding bound ``self.tol``; otherwise ``self.tol``."""
        if not (self.rows and self.coarse):
            return np.full(len(Rs), self.tol)
        return np.minimum(self.tol, MISFIT_SPREAD * rank_distance(np.asarray(Rs), self.H))

    def tolerance_why(self, tol):
        """How a tolerance from :meth:`tolerances` was set, for a refusal."""
        if tol < self.tol:
            return (f", {MISFIT_SPREAD:g}× the answers' distance from rank H={self.H}, their rounding as measured; "
                    "correct fits stay below it")
        return ", the answers' rounding bound"

    def directions(self):
        """The directions q_k of the differences ``δ_k = δ_0 + step·q_k`` (rows): a random orthogonal basis of
        R^d, or of the row space of ``M = Σ_h V_h`` when M has low rank (:func:`value_rank`): every ``V_h`` is
        zero off it (its row space is in M's unless heads cancel, which the functional check would catch), so
        ``rank M + 1`` differences give every ``V_h`` (heads sharing values, GQA/MQA: rank M = groups·d_h)."""
        d, M = self.d, self.layer.M
        r, basis = value_rank(M, self.eps)
        self.value_rank = r
        if r >= d:
            return random_orthogonal(d, self.rng)
        return random_orthogonal(r, self.rng) @ basis

    def value_maps(self, report, batch: int = 16):
        """Every ``V_h`` (route "differences" or "column spaces", :func:`_value_maps`)."""
        d, M, eps = self.d, self.layer.M, self.eps
        rows = self.rows and not self.coarse
        if rows:  # differences cost a few sequences each: try the column spaces after every few
            batch = 8
        tol0 = float(self.tolerances(self.R0[None])[0])
        fit0 = self.from_scratch(self.delta0, self.R0, self.T0)
        for _ in range(FIRST_RETRIES if self.rows and self.coarse else 0):
            if fit0.residual <= tol0:
                break
            self.restarts += 1  # Jennrich's start from other Jacobians (new queries)
            fit0 = self.from_scratch(self.delta0, self.R0, self.T0)
        if fit0.residual > tol0:
            raise SeparationError(f"the heads did not separate along the first probe difference (misfit "
                                  f"{fit0.residual:.1e} > {tol0:.1e}{self.tolerance_why(tol0)}): the layer is not a "
                                  f"sum of H={self.H} softmax heads with independent value maps, or its answers are "
                                  "noisier than their precision", misfit=fit0.residual, tolerance=tol0)
        if self.rows:  # every row of progressions: the same θ, one more coefficient (k: δᵀW_hδ)
            fit0 = self.start_progressions(fit0)
        if not self.rows:
            self.T = self.rng.standard_normal((self.n, self.q)) / np.sqrt(self.q)
        Q = self.directions()  # rows: d of them, or an orthonormal basis of M's row space when M has low rank
        if self.rows and self.coarse:
            return self.far_from_spaces(fit0, Q, report)
        n_dir = len(Q)
        size = np.linalg.norm(self.delta0)
        ws, deltas, self.worst = [fit0.w], [self.delta0], fit0.residual
        split = True  # the column spaces may still split M (False once exhausted spaces did not)
        k0 = 0
        while k0 < n_dir:  # batches of `batch` differences while the column spaces may split M, then larger ones
            ks = range(k0, min(n_dir, k0 + (batch if split else LATE_BATCH)))
            k0 = ks.stop
            dk = [self.delta0 + SMALL_STEP * size * Q[k] for k in ks]
            fits = [relabel(f, fit0.w, f.w) for f in self.fits(dk, [fit0.theta] * len(dk))]
            if self.coarse:  # θ is linear in δ: extrapolate the short difference's θ to the long one, fit there
                dk = [self.delta0 + FAR_STEP * size * Q[k] for k in ks]
                guess = [fit0.theta + FAR_STEP / SMALL_STEP * (f.theta - fit0.theta) for f in fits]
                fits = [relabel(f, g.T, f.theta.T) for f, g in zip(self.fits(dk, guess), guess)]
            for dl, fk in zip(dk, fits):
                self.worst = max(self.worst, fk.residual)
                ws.append(fk.w)
                deltas.append(dl)
            self.count = len(deltas)
            report()
            final = len(deltas) == n_dir + 1
            if final or (split and not self.coarse and len(ws) >= 16 and (rows or (len(ws) - 1) % 32 == 0)):
                D = np.stack(deltas, axis=1)
                V, route = _value_maps(np.stack(ws, axis=2), D if n_dir == d else Q.T @ (Q @ D), M, eps,
                                       final=final, max_cond=SUBSPACE_COND_ROWS if rows else SUBSPACE_COND)
                if V is not None:
                    return V, route
                split = route != "no split"  # more differences span the same spaces: they cannot split M either
        raise RecoveryError("the value maps could not be assembled")  # pragma: no cover - final always returns


    def far_from_spaces(self, fit0, Q, report):
        """Every ``V_h`` from coarse answers on progressions: short differences ``δ_0 + SMALL_STEP·q_k`` (they keep
        δ_0's labels) until every head's column space ``C_h`` is exhausted, then a long difference
        ``δ_0 + FAR_STEP·q_k`` along every direction, each started from value vectors guessed in the column spaces
        (``Σ_h w_h = M δ`` split over the bases of the ``C_h``: well enough to start a fit, where the split itself is
        too inaccurate in float32), and ``V_h = w_h D⁺`` over every difference: the long ones span every direction,
        so no fit's error is divided by the short step (the short ones still add their rows: MiniLM layer 2 float32,
        V_h 1.1e-4 with them, 1.7e-4 without). Short fits only until the spaces are found: ≈ rank + 9 of them
        instead of d."""
        M, size = self.layer.M, np.linalg.norm(self.delta0)
        ws, deltas, self.worst = [fit0.w], [self.delta0], fit0.residual
        bases, k0 = None, 0
        while bases is None and k0 < len(Q):
            dk = [self.delta0 + SMALL_STEP * size * Q[k] for k in range(k0, min(len(Q), k0 + 8))]
            k0 += len(dk)
            for dl, fk in zip(dk, self.fits(dk, [fit0.theta] * len(dk), spare=True)):
                if fk is None:  # a wrong minimum would add a noise direction to a column space: the next q_k
                    continue
                fk = relabel(fk, fit0.w, fk.w)
                self.worst = max(self.worst, fk.residual)
                ws.append(fk.w)
                deltas.append(dl)
            self.count = len(deltas)
            report()
            if len(ws) >= 16:
                bases = column_bases(np.stack(ws, axis=2), self.eps)
        if bases is not None:
            E = np.concatenate(bases, axis=1)
            spans = np.cumsum([0] + [b.shape[1] for b in bases])
            base, step, wide = self.far_design(Q)
            if wide:  # the short fits found the spaces; V_h is read from δ_0 and the long ones (module constants)
                ws, deltas = ws[:1], deltas[:1]
            directions = Q
            for rnd in range(FAR_ROUNDS):
                dropped = []
                for k0 in range(0, len(directions), LATE_BATCH):
                    dk = [base + step * q for q in directions[k0:k0 + LATE_BATCH]]
                    coef = np.linalg.lstsq(E, M @ np.stack(dk, axis=1), rcond=None)[0]  # (Σ r_h, F)
                    guesses = [np.stack([bases[h] @ coef[spans[h]:spans[h + 1], f] for h in range(self.H)],
                                        axis=1) for f in range(len(dk))]
                    for k, dl, fk in zip(range(k0, len(directions)), dk, self.fits(dk, values=guesses, spare=True)):
                        if fk is None:
                            dropped.append(k)
                            continue
                        self.worst = max(self.worst, fk.residual)
                        ws.append(fk.w)
                        deltas.append(dl)
                    self.count = len(deltas)
                    report()
                if not dropped:
                    break
                directions = self.replacements(directions[dropped], rnd, Q)
            else:
                raise SeparationError(f"{len(dropped)} long probe difference(s) did not separate into the {self.H} "
                                      f"heads found first, along {FAR_ROUNDS - 1} rounds of fresh directions too "
                                      "(each fit's misfit above its tolerance: another minimum); retry with another "
                                      "seed")
        D = np.stack(deltas, axis=1)
        return _value_maps(np.stack(ws, axis=2), D if len(Q) == self.d else Q.T @ (Q @ D), M, self.eps,
                           final=True)


    def replacements(self, directions, rnd, Q):
        """Directions of long differences replacing ``directions`` whose fits fell into other minima, in round
        ``rnd`` (0, 1, …): the opposite direction, then the direction turned 45° towards a random one of Q's span.
        Each keeps most of its direction: D stays as well conditioned as the orthonormal Q made it (a random
        direction of R^d has 1/√d of it: MiniLM seed 6, V_h 1.7e-4 → 3.2e-4)."""
        if rnd % 2 == 0:
            return -directions
        turn = self.rng.standard_normal((len(directions), len(Q))) @ Q
        turn -= np.sum(turn * directions, axis=1, keepdims=True) * directions
        out = directions + turn / np.linalg.norm(turn, axis=1, keepdims=True)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def far_design(self, Q):
        """The long differences' design (:data:`ROWS_FAR_WIDE`, else :data:`ROWS_FAR_NARROW`): sets the
        progressions' points (the first :data:`ROWS_FAR_PROGRESSIONS` of δ_0's, widened) and returns the base
        ``β·δ_0``, the step ``step·|δ_0|`` of the differences along the rows of ``Q`` and whether it is the wide
        design."""
        size, bound = np.linalg.norm(self.delta0), self.layer.oracle.max_input_norm
        points = self.Tp[:far_progressions(self.q)]
        for beta, step, width in (ROWS_FAR_WIDE, ROWS_FAR_NARROW):
            base, t = beta * self.delta0, points * width
            if bound is None or self.largest_token(t, base, step * size, Q) <= bound:
                break
        self.Tp, self.T = t, self.rows_design(t)
        return base, step * size, (beta, step, width) == ROWS_FAR_WIDE

    def largest_token(self, t, base, step, Q):
        """The largest token norm of the progressions ``b + j·δ`` (b on the plane at the points ``t``, j < length)
        along the differences ``δ = base + step·q`` for the rows q of ``Q``."""
        B = self.b0 + t @ self.Z.T  # (n, d)
        deltas = base + step * Q  # (F, d)
        j = np.arange(self.length)[:, None, None]
        sq = (np.sum(B * B, axis=1)[None, :, None] + 2 * j * (B @ deltas.T)[None]
              + j**2 * np.sum(deltas * deltas, axis=1)[None, None, :])
        return float(np.sqrt(max(float(sq.max()), 0.0)))


def column_bases(Wv, eps):
    """Orthonormal bases of the heads' column spaces ``C_h = span{w_h(δ_j)}`` from ``Wv (K, H, m)``, or None while
    a space may still grow (its numerical rank within 8 of the m differences)."""
    bases = []
    for h in range(Wv.shape[1]):
        Uh, sh, _ = np.linalg.svd(Wv[:, h, :], full_matrices=False)
        r = int(np.sum(sh > max(1e3 * eps, 1e-11) * sh[0]))
        if r >= Wv.shape[2] - 8:
            return None
        bases.append(Uh[:, :r])
    return bases


def value_rank(M, eps):
    """The rank of ``M`` (K × d) when its singular values drop by a gap no rounding explains (≥ 1e6, and at
    least 1/(1e3·eps)), and an orthonormal basis of its row space (rows); ``(d, None)`` when there is no such gap."""
    d = M.shape[1]
    _, sv, Vt = np.linalg.svd(M, full_matrices=False)
    r = gap_rank(sv, d, gap=max(1e6, 1.0 / (1e3 * eps)))
    return (r, Vt[:r]) if r < min(M.shape) else (d, None)


def relabel(fit, ref, got):
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


def _value_maps(Wv, D, M, eps, final, max_cond=None):
    """The value maps ``V_h`` from the separated ``w_h(δ_j) = V_h δ_j`` (``Wv (K, H, m)``, ``D (d, m)``): the
    heads' column spaces split ``M`` when well-conditioned; with d + 1 differences, ``V_h = w_h D⁺`` directly.
    Returns ``(V, route)``, or ``(None, why)``: ``"not exhausted"`` (a column space may still grow) or ``"no
    split"`` (every space is exhausted, and together they are too ill-conditioned or do not span M)."""
    K, H, m = Wv.shape
    if final:
        return np.matmul(Wv.transpose(1, 0, 2), np.linalg.pinv(D)), "differences"
    bases = column_bases(Wv, eps)
    if bases is None:  # a column space is not exhausted yet
        return None, "not exhausted"
    E = np.concatenate(bases, axis=1)
    if E.shape[1] > K or np.linalg.cond(E) > (SUBSPACE_COND if max_cond is None else max_cond):
        return None, "no split"
    coef, *_ = np.linalg.lstsq(E, M, rcond=None)
    if np.linalg.norm(M - E @ coef) > 1e3 * eps * np.linalg.norm(M):
        return None, "no split"
    out, i = [], 0
    for Eh in bases:
        out.append(Eh @ coef[i:i + Eh.shape[1]])
        i += Eh.shape[1]
    return np.stack(out), "column spaces"
