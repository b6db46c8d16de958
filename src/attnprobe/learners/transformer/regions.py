"""Multi-head one-layer transformers with a biased ReLU FFN and K outputs, from value queries.

``TF(X) = w_oᵀReLU(Aᵀa(X) + b) + c``, ``a(X) = Σ_h V_h Xᵀsoftmax(X W_h x_N + X u_h)`` (+ ``x_N`` with a residual).
The route (docs/transformer.md):

1. **ffn** — length-1 queries ``[x] ↦ FFN((Σ_h V_h) x)`` (``(I + Σ_h V_h) x`` with the residual) are a biased
   K-output ReLU network: :func:`extract_ffn` gives its neurons ``C = Aᵀ(Σ_h V_h)`` up to scale and order.
2. **values** — inside one FFN region TF is linear in the attention output, so a base point z deep in a region
   turns TF into a multi-head attention oracle (:mod:`.transformer_frames`, Sec. 7's form with value vectors
   ``Ṽ_hᵀg``); far from the origin (z = 10⁸β) every logit is huge and one saturated half circle gives every
   head's value vector and H (the generic multi-head learner's first stage).
3. **scores** — back near the origin (z = Rβ, R ≈ 20–50) each head alone is probed along ``{v_g : g ≠ h}^⊥``
   (:mod:`.transformer_heads`): exact linear measurements of ``W_h``, ``u_h`` on that subspace. Regions with other
   value vectors see other subspaces; heads are matched across regions by where they cross a saturated circle
   drawn inside ``{v_g}^⊥``. Needs ``d ≥ H + 2`` when one region does not suffice (H ≥ 2).
4. **maps** — region j's maps are ``Ṽ_hᵀG_j = R_hᵀP_j`` with ``R_h = CṼ_h = AᵀV_h`` (m × d, what TF depends on)
   and ``P_j`` its active output weights: least squares over regions chosen where the ones seen so far cover
   least, until those equations are well conditioned (about rank C regions for K = 1).
5. **polish** — Gauss–Newton on every head's scores, then on every parameter if needed
   (:mod:`.polish`).

The representative returned: ``A = Cᵀ`` and ``V_h = C⁺R_h`` (no residual), or ``Aᵀ = C − Σ_h R_h`` (``C R₀``,
``R₀ = I − Σ_h Ṽ_h`` the last token's map in the length-1 frame) and ``V_h = (Aᵀ)⁺R_h``.
What remains free: neuron order and positive scale, head order, ``V_h ↦ M V_h, A ↦ M⁻ᵀA`` (no residual) and heads
whose ``(W_h, u_h)`` coincide (Prop. 7.1: they come back as one head).
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from attnprobe._validation import check_seed
from attnprobe.errors import BudgetExceededError, ConfigError, RecoveryError, SaturationError, UnidentifiableError
from attnprobe.learners.ffn import extract_ffn, require_fine_answers
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.transformer.frames import (KnownFFN, frame_maps, frame_oracle, frame_values, heads_sum,
                                                   saturated_radius, set_scale)
from attnprobe.learners.transformer.heads import combine_rows, head_scores, scores_to_parameters, token_bases
from attnprobe.learners.transformer.polish import check_how, refine
from attnprobe.models.transformer import MultiHeadTransformer
from attnprobe.oracles.base import Oracle

METHOD = "transformer-regions"  # the learner "transformer", route regions (route paper: "transformer-paper")
#: the functional check: fresh random sequences of every length 1..16 (longer than the regions' length-2 queries)
CHECK_LENGTHS = tuple(range(1, 17))
#: base of the far frames (every logit ≈ 10⁸·‖W_h β‖·‖w‖: saturated except next to a head's hyperplane)
FAR = 1e8
#: default cap on the FFN stage's length-1 queries per input dimension (a 32-64-10 FFN needs ~300 per dimension)
FFN_QUERIES_PER_INPUT = 2000
#: regions are added until the stacked bases of every head's scores, and the stacked region maps G, have a
#: smallest singular value (relative) of at least this: least squares through them amplifies errors by its inverse
WELL_SEEN = 0.2
WELL_SPANNED = 0.05
#: coarsest answer rounding the far frames stand (float64's 2.2e-16; float32's 1.2e-7 leaves ~1e1 of 1e8); the
#: FFN learner itself stands float32 (:data:`attnprobe.learners.ffn.FINEST_EPS`)
FAR_FRAME_EPS = 1e-12
#: the residual counts as present when the last-token term exceeds this share of g
RESIDUAL_TOL = 1e-6
#: what a refusal of rank-1 value maps says about them
RANK_ONE = ("this learner needs every head's value map V_h to have rank ≥ 2 (head dimension ≥ 2); rank-1 value maps "
            "need a switch-off stage it does not have")
#: singular values of the neuron rows C below this (relative) are the FFN learner's noise: C's rank is that of
#: A^T Σ_h V_h, below d when the heads' value maps together do not span R^d (6 heads of dimension 5 at d = 32)
RANK_TOL = 1e-8
#: regions chosen for the maps: the most informative among those with at least this share of the widest margin
MARGIN_SHARE = 0.25
#: a region is usable when its base is at least this share of the distance to the nearest neuron hyperplane
CANDIDATES = 4096
#: last tokens of the near frames reach this share of the distance to the nearest neuron hyperplane
NEAR_TOKENS = 0.8


class _Regions:
    """Candidate directions β, each with its asymptotic FFN region (far along β)."""

    def __init__(self, ffn: KnownFFN, rng, r):
        d = ffn.C.shape[1]
        B = rng.standard_normal((CANDIDATES, d))
        self.B = B / np.linalg.norm(B, axis=1, keepdims=True)
        pre = self.B @ ffn.C.T
        self.margin = np.min(np.abs(pre) / np.linalg.norm(ffn.C, axis=1), axis=1)
        self.patterns = pre > 0
        self.ffn, self.r = ffn, r
        gs = np.array([ffn.linear(p)[0] @ r for p in self.patterns])
        self.gnorm = np.linalg.norm(gs, axis=1)
        self.used: list[bytes] = []

    def next(self, prefer=None) -> tuple[np.ndarray, float, np.ndarray]:
        """The unused region with the widest margin among those whose g is not small: (β, margin, pattern).
        ``prefer``: scores of the candidates' patterns; then the best-scoring region among those with at least
        ``MARGIN_SHARE`` of the widest unused margin."""
        ok = self.gnorm >= 0.1 * self.gnorm.max()
        keys = [p.tobytes() for p in self.patterns]
        unused = ok & np.array([k not in self.used for k in keys])
        if not np.any(unused):
            raise RecoveryError("no further FFN region with a usable margin: the neurons leave no room to probe in")
        if prefer is None:
            i = int(np.argmax(np.where(unused, self.margin, -1.0)))
        else:
            wide = unused & (self.margin >= MARGIN_SHARE * self.margin[unused].max())
            i = int(np.argmax(np.where(wide, prefer(self.patterns), -np.inf)))
        self.used.append(keys[i])
        return self.B[i], float(self.margin[i]), self.patterns[i]

    def near_base(self, beta, pattern) -> np.ndarray:
        """The near frame's base ``Rβ``: the R with the least predicted error of ``u_h = p_h(z) − W_h z``,
        ``(R + 1)²/(γ²·dist)`` — the answers round with ‖TF(z)‖ ∝ R + 1, probes ``γ = min(2/(R + 1), dist/10)``
        (logits of order one, inside the region), last tokens within ``dist/2`` (differences over them)."""
        R = np.geomspace(0.5, 5e3, 400)
        Z = R[:, None] * beta
        ok = np.all(self.ffn.pattern(Z) == pattern, axis=1)
        if not np.any(ok):
            raise RecoveryError("no point of the FFN region is far enough from its neuron hyperplanes")
        dist = np.maximum(self.ffn.margin(Z), 1e-300)
        gamma = np.minimum(2.0 / (R + 1.0), dist / 10)
        cost = np.where(ok, (R + 1.0) ** 2 / (gamma**2 * dist), np.inf)
        return Z[int(np.argmin(cost))]


def _far_values(oracle, ffn, beta, margin, r, rng, plane):
    """Value vectors (scalar mix r) and every head's map ``Ṽ_hᵀG`` (all K outputs) in the far frame along β
    (stage 2). Returns ``(values, maps (H, d, K), last-token part of G (d, K))``."""
    z = FAR * beta
    frame = frame_oracle(oracle, ffn, z, 1.0, r, 1.0)
    T = saturated_radius(frame, rng, top=FAR * margin / 4)
    v_heads = heads_sum(frame, T)
    set_scale(frame, T * max(np.linalg.norm(v_heads), 1e-300))
    if np.linalg.norm(v_heads) <= 1e5 * frame.eps * np.linalg.norm(frame.fn.g):
        raise UnidentifiableError("the attention output does not reach this FFN region's output (Σ_h Ṽ_hᵀg = 0)")
    if plane is not None:
        X = np.zeros((8, 2, z.size))
        X[:, 0] = T * (plane @ rng.standard_normal((plane.shape[1], 8))).T
        if np.max(np.abs(frame(X) - frame(np.zeros((1, 2, z.size))))) <= 1e3 * frame.fn.rounding:
            raise UnidentifiableError("the heads' value vectors lie in the same subspace in every FFN region (value "
                                      "maps of rank 1?): the directions of each head's scores along the other "
                                      f"heads' values are not visible; {RANK_ONE}")
    vals = _read_values(frame, v_heads, rng, T=T)
    K = ffn.w.shape[1]
    vec = frame_oracle(oracle, ffn, z, 1.0, np.eye(K), 1.0)
    total = heads_sum(vec, T)  # (d, K): Σ_h Ṽ_hᵀG
    set_scale(vec, T * max(np.linalg.norm(total), 1e-300))
    maps = frame_maps(vec, vals, total, rng)
    if plane is not None:  # the crossings inside the plane match heads across regions; values from the full circle
        flat = _read_values(frame, v_heads, rng, T=T, plane=plane, sign_tol=1e-3)  # only its crossings are used
        if flat.v.shape != vals.v.shape:
            raise RecoveryError(f"two saturated circles of one FFN region show {vals.v.shape[0]} and "
                                f"{flat.v.shape[0]} heads: the target is not a transformer of this form")
        from scipy.optimize import linear_sum_assignment  # here: scipy.optimize costs ~0.2 s to import

        D = np.linalg.norm(vals.v[:, None] - flat.v[None], axis=2)
        rows, cols = linear_sum_assignment(D)
        if np.max(D[rows, cols]) > 1e-5 * np.linalg.norm(vals.v):
            raise RecoveryError("two saturated circles of one FFN region disagree on the heads' value vectors")
        vals.z0, vals.z1, vals.crossings = flat.z0, flat.z1, flat.crossings[cols]
    return vals, maps, vec.fn.g - total


def _read_values(frame, v_heads, rng, **kw):
    """:func:`frame_values`, its refusal of a circle without crossings naming rank-1 value maps as a cause."""
    try:
        return frame_values(frame, v_heads, rng, **kw)
    except UnidentifiableError as exc:
        raise UnidentifiableError(f"{exc} (or the heads' value maps have rank 1, which can leave their value vectors "
                                  f"orthogonal to an FFN region's output: {RANK_ONE})") from None


def _near_scores(oracle, ffn, z, r, v, rng):
    """``(N_h, N_hᵀW_h, N_hᵀu_h)`` of every head in the near frame at z (stage 3): last tokens ``z ± ρe_i``."""
    frame = frame_oracle(oracle, ffn, z, 1.0, r, 1.0)
    dist = float(ffn.margin(z)[0])
    rho = NEAR_TOKENS * dist
    d = z.size
    tokens = np.concatenate([np.zeros((1, d)), rho * np.eye(d), -rho * np.eye(d)])
    bases = token_bases(frame, tokens)
    set_scale(frame, max(float(np.max(np.abs(bases))), 1e-300) * 1e-2)
    out = []
    for h in range(v.shape[0]):
        N, sc = head_scores(frame, v, h, tokens, bases, max_probe=dist / 10)
        out.append((N, *scores_to_parameters(N, sc, z, rho)))
    return out


def _match(predict, vals, z_far):
    """Heads of a new region matched to the known ones by where they cross its saturated circle: head h crosses
    where ``wᵀp_h(z_far) = 0``; ``predict(z_far)`` gives the scores (H, d) as far as the circle's plane sees them."""
    from scipy.optimize import linear_sum_assignment

    q = predict(z_far)
    pred = np.arctan2(-(q @ vals.z0), q @ vals.z1) % np.pi
    got = np.asarray(vals.crossings) % np.pi
    D = np.abs(pred[:, None] - got[None, :])
    D = np.minimum(D, np.pi - D)
    rows, cols = linear_sum_assignment(D)
    worst = float(np.max(D[rows, cols]))
    if worst > 1e-4:
        raise RecoveryError(f"the heads of two FFN regions do not match (crossing angles off by {worst:.1e} rad): "
                            "the target is not a multi-head transformer of this form, or two heads cross together")
    return cols, worst  # cols[h]: the new region's index of head h


def extract_transformer_multihead(oracle, *, seed: int = 0, check: bool = True, check_lengths=CHECK_LENGTHS,
                                  progress=None, max_regions: int | None = None, ffn_queries: int | None = None,
                                  polish: str = "auto", asked_before=None, **ffn_options):
    """Recover a multi-head transformer with a biased ReLU FFN and K outputs (module docstring).

    Heads, biases, outputs and the residual are detected. Phases: ``ffn``, ``values`` (saturated circles far
    out), ``scores`` (isolated heads near the origin), ``polish`` (Gauss–Newton on W_h, u_h and, when ``polish`` is
    ``"auto"`` and that leaves a residual, on every parameter: :mod:`.polish`; ``"none"`` skips it). Raises
    :class:`UnidentifiableError` for targets whose
    attention never reaches the output (or is affine: a plain head has no kinks) and :class:`RecoveryError`
    when the answers contradict the model's form. ``ffn_options`` go to :func:`extract_ffn`; ``ffn_queries`` caps
    its length-1 queries (default ``FFN_QUERIES_PER_INPUT·(d + 1)``: a smooth FFN would never stop finding kinks).
    ``asked_before``: queries this extraction asked before this route, by phase (:class:`Run`).
    """
    require_fine_answers(oracle, "the transformer learner")
    check_how(polish)
    if oracle.eps > FAR_FRAME_EPS:
        raise ConfigError(f"the transformer learner needs float64 answers (its far frames subtract answers of size "
                          f"~10⁸); these are rounded at {oracle.eps:.2g} ({oracle.precision}). "
                          "For one head, a bias-free "
                          "FFN and one output use the Sec. 4.1 route (extract_transformer)", param="precision")
    d = oracle.d
    limit_norm = oracle.max_input_norm
    if limit_norm is not None and limit_norm < 2 * FAR:
        raise ConfigError(f"the transformer learner saturates every head with tokens of norm up to {2 * FAR:.0e}; "
                          f"this oracle accepts inputs of norm at most {limit_norm:.3g}", param="max_input_norm")
    run = Run(oracle, METHOD, seed=[check_seed(seed), 19], check=check, check_lengths=check_lengths,
              progress=progress, asked_before=asked_before)
    run.plan(regions_plan(d), f"the transformer learner at d={d} (FFN kinks, saturated circles, head scores; adaptive)",
             at_least=True)
    ffn = _learn_ffn(run, seed, ffn_queries, ffn_options)
    K = ffn.w.shape[1]
    r = run.rng.standard_normal(K)
    r /= np.linalg.norm(r)
    seen = _Seen(run, ffn, _Regions(ffn, run.rng, r), r, max_regions or (2 * d + 2))
    with _budget_in_terms_of(oracle):
        seen.attention()
        H = seen.H
        W = np.empty((H, d, d))
        u = np.empty((H, d))
        conditioning = np.empty(H)  # smallest singular value of each head's stacked score bases
        for h in range(H):
            W[h], u[h], conditioning[h] = combine_rows(seen.parts[h])
        n_map = seen.maps_spanned(W, u)
        model, residual_part = _assemble(ffn, W, u, seen)
        with run.phase("polish"):
            model, polished = refine(oracle, model, run.rng, polish, reserve=run.check_queries)
    notes = ["identifiable up to: neuron order and positive scale, head order"
             + ("" if model.residual else ", and V_h ↦ M V_h with A ↦ M⁻ᵀA for any invertible M")
             + "; heads with equal (W_h, u_h) would come back as one (Prop. 7.1)"]
    if polish != "none" and not polished:
        notes.append("the polish was skipped: the budget left too few queries for its sequences (raise the budget "
                     "for errors ~1e-10 instead of ~1e-8)")
    details = {"heads": H, "neurons": int(ffn.C.shape[0]), "outputs": K, "residual": model.residual,
               "residual_part": residual_part, "attention_regions": len(seen.info), "map_regions": n_map,
               "polish": polished, "regions_skipped": seen.skipped, "scores_seen": float(conditioning.min()),
               "regions": seen.info}
    return run.finish(model, unknowns=MultiHeadTransformer.unknowns(d, H, int(ffn.C.shape[0]), K, model.residual),
                      details=details, notes=notes, hint=" (a one-layer multi-head transformer of this form)")


def regions_plan(d: int) -> int:
    """The queries the regions route plans up front (more follow, adaptively): its first stages at width d."""
    return 4 * d + 16


@contextmanager
def _budget_in_terms_of(oracle):
    """A frame's budget error (frames are oracles over what the budget leaves) restated for the user's oracle."""
    try:
        yield
    except BudgetExceededError:
        raise BudgetExceededError(f"the transformer learner ran out of the budget of {oracle.budget} queries (it "
                                  "needs 2–30 per unknown: saturated circles and isolated probes in several FFN "
                                  "regions); raise the budget") from None


def _learn_ffn(run, seed, ffn_queries, ffn_options) -> KnownFFN:
    """Stage 1 on length-1 queries, through an oracle capped at ``ffn_queries``."""
    oracle = run.oracle
    d = oracle.d
    cap = FFN_QUERIES_PER_INPUT * (d + 1) if ffn_queries is None else int(ffn_queries)
    limit_ffn = cap if oracle.budget is None else min(cap, int(oracle.remaining))
    capped = Oracle(oracle, d, budget=limit_ffn, precision=oracle.precision, name=f"{oracle.name}[length 1]")
    capped.eps_floor = oracle.eps
    with run.phase("ffn", absorb=True):
        try:
            net = extract_ffn(capped, seed=seed, check=False, progress=run.progress, **ffn_options).model
        except BudgetExceededError:
            if limit_ffn < cap:
                raise BudgetExceededError(f"the FFN stage (length-1 queries) needs more than the {limit_ffn} "
                                          "queries the "
                                          f"budget of {oracle.budget} leaves; raise the budget (the whole extraction "
                                          "needs 2–30 queries per unknown)") from None
            raise RecoveryError(f"the length-1 answers did not settle into a ReLU network within {cap} queries "
                                f"({oracle.queries} spent): the FFN is not piecewise linear (GELU?) or wider than "
                                "expected (raise ffn_queries)") from None
    return KnownFFN.from_net(net)


class _Seen:
    """What the regions showed so far: every head's score parts, every region's G, maps and last-token part."""

    def __init__(self, run, ffn, regions, r, limit):
        self.run, self.ffn, self.regions, self.r, self.limit = run, ffn, regions, r, limit
        self.Gs, self.Ps, self.maps, self.lasts, self.info = [], [], [], [], []
        self.parts: list[list] = []
        self.H = 0
        self.skipped = 0

    def _values(self, plane, tries: int = 4, prefer=None):
        """The next region whose saturated circles read cleanly (a region whose cones are too narrow for the
        steps, whose circle leaves it, or whose circle shows another number of heads than the first region's, is
        skipped: at most ``tries`` in a row)."""
        for attempt in range(tries):
            with self.run.phase("values"):
                beta, margin, pattern = self.regions.next(prefer)
                try:
                    vals, maps, last = _far_values(self.run.oracle, self.ffn, beta, margin, self.r, self.run.rng,
                                                   plane)
                    if self.H and vals.v.shape[0] != self.H:
                        raise RecoveryError(f"one FFN region shows {self.H} heads and another {vals.v.shape[0]}: "
                                            "the target is not a multi-head transformer of this form")
                    break
                except (SaturationError, RecoveryError):
                    self.skipped += 1
                    if attempt == tries - 1:
                        raise
        return beta, margin, pattern, vals, maps, last

    def _keep(self, pattern, maps, last):
        self.Gs.append(self.ffn.linear(pattern)[0])
        self.Ps.append(pattern[:, None] * self.ffn.w)  # G = CᵀP: the region's active output weights
        self.maps.append(maps)
        self.lasts.append(last)

    def _scores(self, beta, pattern, v):
        z = self.regions.near_base(beta, pattern)
        with self.run.phase("scores"):
            return z, _near_scores(self.run.oracle, self.ffn, z, self.r, v, self.run.rng)

    def attention(self) -> None:
        """Stages 2 and 3 in the first region, then in more regions until every head's scores are seen well."""
        d = self.run.oracle.d
        beta, margin, pattern, vals0, maps0, last0 = self._values(None)
        self.H = H = vals0.v.shape[0]
        self._keep(pattern, maps0, last0)
        z, parts0 = self._scores(beta, pattern, vals0.v)
        self.parts = [[p] for p in parts0]
        plane = np.linalg.svd(vals0.v)[2][H:].T if H > 1 else None
        self.info.append({"margin": margin, "near_base": float(np.linalg.norm(z)), "radius": vals0.radius})
        while min(combine_rows(p)[2] for p in self.parts) < WELL_SEEN:
            if plane is None or plane.shape[1] < 2:
                raise UnidentifiableError(f"{H} heads at width d = {d}: one FFN region shows only {d - H + 1} of the "
                                          "d directions of each head's scores, and matching heads across regions "
                                          "needs d ≥ H + 2")
            if len(self.info) >= self.limit:
                if min(combine_rows(p)[2] for p in self.parts) > 1e-3:
                    break  # seen, if not well: the check judges the result
                raise RecoveryError(f"{len(self.info)} FFN regions do not show every direction of the heads' scores")
            beta, margin, pattern, vals, m_j, last_j = self._values(plane)
            cols, worst = _match(_partial_predictor(parts0), vals, FAR * beta)
            z, new = self._scores(beta, pattern, vals.v[cols])
            for h in range(H):
                self.parts[h].append(new[h])
            self._keep(pattern, m_j[cols], last_j)
            self.info.append({"margin": margin, "near_base": float(np.linalg.norm(z)), "radius": vals.radius,
                              "match_angle": worst})

    def maps_spanned(self, W, u) -> int:
        """Stage 4: more regions (values only, heads matched by the complete scores) until the regions' active
        output weights, seen from the neurons' column space, are well conditioned. Returns how many were added."""
        C = self.ffn.C
        added = 0
        while (conditioning := _conditioning(C, self.Ps, self.ffn.w)) < WELL_SPANNED:
            if len(self.Gs) >= self.limit + C.shape[1]:
                if conditioning > 0:
                    break  # spanned, if not well: the check judges the result
                raise RecoveryError("the FFN regions' output maps do not span the neurons' row space")
            beta, _, pattern, vals, m_j, last_j = self._values(None, prefer=_informative(C, self.Ps, self.ffn.w))
            cols, _ = _match(lambda zf: W @ zf + u, vals, FAR * beta)
            self._keep(pattern, m_j[cols], last_j)
            added += 1
        return added


def _assemble(ffn: KnownFFN, W, u, seen: _Seen):
    """The representative (module docstring) and the residual's share of the maps. Region j's maps are
    ``Ṽ_hᵀG_j = R_hᵀP_j`` with ``R_h = CṼ_h`` (m × d, what TF depends on) and ``P_j`` its active output
    weights; in the metric of the output weights (row k of R_h acts through ‖w_k‖), ``diag(‖w_k‖)R_h = U Y_h``
    with U the column space of ``diag(‖w_k‖)C``, and ``Y_hᵀ = M_h S⁺`` (``S``: :func:`_weighted`)."""
    C = ffn.C
    U, S = _weighted(C, seen.Ps, ffn.w)
    Mall = np.concatenate(seen.maps, axis=2)  # (H, d, ΣK): Ṽ_hᵀ G
    n = np.linalg.norm(ffn.w, axis=1)
    R = np.einsum("mr,hik,kr->hmi", U / n[:, None], Mall, np.linalg.pinv(S, rcond=1e-10))  # R_h = C Ṽ_h
    Gall = np.concatenate(seen.Gs, axis=1)
    last = np.concatenate(seen.lasts, axis=1)
    residual_part = float(np.linalg.norm(last) / max(np.linalg.norm(Gall), 1e-300))
    residual = residual_part > RESIDUAL_TOL
    At = C - R.sum(axis=0) if residual else C  # with the residual Aᵀ = C R₀ = C − Σ_h C Ṽ_h
    sv = np.linalg.svd(At, compute_uv=False)
    if residual and sv[U.shape[1] - 1] <= 1e-12 * sv[0]:
        raise RecoveryError("the last-token map C − Σ_h C Ṽ_h is singular: not a residual block of this form")
    v = np.einsum("im,hmj->hij", np.linalg.pinv(At, rcond=RANK_TOL), R)  # AᵀV_h = R_h (noise directions cut)
    return MultiHeadTransformer(W, u, v, At.T, ffn.b, ffn.w, ffn.c, residual), residual_part


def _weighted(C, Ps, w):
    """``(U, S)``: U the column space of ``diag(‖w_k‖)C`` and ``S = Uᵀdiag(1/‖w_k‖)P`` for the stacked active
    output weights P (a neuron with small output weights is seen weakly, and matters as weakly)."""
    n = np.maximum(np.linalg.norm(w, axis=1), 1e-300)
    U = _column_space(n[:, None] * C)
    return U, U.T @ (np.concatenate(Ps, axis=1) / n[:, None])


def _informative(C, Ps, w):
    """Scores of candidate patterns for the maps: ``tr(QᵀM Q)`` with ``Q = Uᵀ(pattern ⊙ w/‖w‖)`` and ``M`` the
    regularised inverse of the current ``SSᵀ`` (:func:`_weighted`): large along directions the regions seen so
    far barely cover (a D-optimal design step)."""
    U, S = _weighted(C, Ps, w)
    SS = S @ S.T
    M = np.linalg.inv(SS + 1e-3 * np.trace(SS) / len(SS) * np.eye(len(SS)))
    Uw = np.einsum("mr,mk->mrk", U, w / np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1e-300))

    def score(patterns):
        Q = np.einsum("nm,mrk->nrk", patterns.astype(float), Uw)
        return np.einsum("nrk,rs,nsk->n", Q, M, Q)
    return score


def _column_space(C) -> np.ndarray:
    """Orthonormal basis (m × rank C) of the column space of the neuron rows C (m × d)."""
    Uc, s, _ = np.linalg.svd(C, full_matrices=False)
    return Uc[:, : int(np.sum(s > RANK_TOL * s[0]))]


def _partial_predictor(parts0):
    """``z ↦`` the part of every head's scores ``p_h(z)`` inside its first region's ``S_h``."""
    return lambda zf: np.array([N @ (NW @ zf + Nu) for N, NW, Nu in parts0])


def _conditioning(C, Ps, w) -> float:
    """``σ_r / σ_1`` of ``S`` (:func:`_weighted`, r = rank C): the conditioning of the least squares for
    ``R_h = CṼ_h`` (0 while the regions do not determine it)."""
    U, S = _weighted(C, Ps, w)
    sv = np.linalg.svd(S, compute_uv=False)
    r = U.shape[1]
    return float(sv[r - 1] / sv[0]) if sv.size >= r and sv[0] > 0 else 0.0
