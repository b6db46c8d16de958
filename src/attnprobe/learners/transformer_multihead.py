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
4. **maps** — with every attention weight known, TF is linear in the maps ``GᵀṼ_h`` inside each region:
   least squares in regions whose ``G`` span the neurons' row space gives ``Ṽ_h`` (``C Ṽ_h = AᵀV_h``), and the
   residual ``R₀ = I − Σ_h Ṽ_h`` (zero on that row space without a residual).

The representative returned: ``A = Cᵀ`` and ``V_h = Ṽ_h`` (no residual), or ``Aᵀ = C R₀`` and ``V_h = R₀⁻¹Ṽ_h``.
What remains free: neuron order and positive scale, head order, ``V_h ↦ M V_h, A ↦ M⁻ᵀA`` (no residual) and heads
whose ``(W_h, u_h)`` coincide (Prop. 7.1: they come back as one head).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from attnprobe._validation import check_seed
from attnprobe.errors import RecoveryError, UnidentifiableError
from attnprobe.learners.ffn import extract_ffn, require_fine_answers
from attnprobe.learners.skeleton import Run
from attnprobe.learners.transformer_frames import (KnownFFN, frame_oracle, frame_values, heads_sum,
                                                   saturated_radius, set_scale)
from attnprobe.learners.transformer_heads import (combine_rows, head_scores, isolating_basis,
                                                  scores_to_parameters, token_bases)
from attnprobe.models.softmax import softmax_last
from attnprobe.models.transformer import MultiHeadTransformer

METHOD = "transformer"
#: the issue's check: fresh random sequences of every length 1..16
CHECK_LENGTHS = tuple(range(1, 17))
#: base of the far frames (every logit ≈ 10⁸·‖W_h β‖·‖w‖: saturated except next to a head's hyperplane)
FAR = 1e8
#: smallest base of the near frames (the bigger, the more the frame's answers cancel; measured 20–50 best)
NEAR = 20.0
#: the residual counts as present when the last-token term exceeds this share of g
RESIDUAL_TOL = 1e-6
#: a region is usable when its base is at least this share of the distance to the nearest neuron hyperplane
CANDIDATES = 4096


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

    def next(self) -> tuple[np.ndarray, float, np.ndarray]:
        """The unused region with the widest margin among those whose g is not small: (β, margin, pattern)."""
        ok = self.gnorm >= 0.1 * self.gnorm.max()
        order = np.argsort(-np.where(ok, self.margin, -1.0))
        for i in order:
            key = self.patterns[i].tobytes()
            if key not in self.used and ok[i]:
                self.used.append(key)
                return self.B[i], float(self.margin[i]), self.patterns[i]
        raise RecoveryError("no further FFN region with a usable margin: the neurons leave no room to probe in")

    def near_base(self, beta, pattern) -> np.ndarray:
        """The near frame's base ``Rβ`` (R ≥ NEAR, the region's pattern reached with half its asymptotic margin)."""
        R = NEAR
        for _ in range(200):
            z = R * beta
            if np.array_equal(self.ffn.pattern(z)[0], pattern) and self.ffn.margin(z)[0] >= 0.25 * R * \
                    float(np.min(np.abs(self.ffn.C @ beta) / np.linalg.norm(self.ffn.C, axis=1))):
                return z
            R *= 1.25
        raise RecoveryError("no point of the FFN region is far enough from its neuron hyperplanes")


def _far_values(oracle, ffn, beta, margin, r, rng, plane):
    """Value vectors in the far frame along β (stage 2)."""
    frame = frame_oracle(oracle, ffn, FAR * beta, 1.0, r, 1.0)
    T = saturated_radius(frame, rng, top=FAR * margin / 4)
    v_heads = heads_sum(frame, T)
    set_scale(frame, T * max(np.linalg.norm(v_heads), 1e-300))
    if np.linalg.norm(v_heads) <= 1e5 * frame.eps * np.linalg.norm(frame.fn.g):
        raise UnidentifiableError("the attention output does not reach this FFN region's output (Σ_h Ṽ_hᵀg = 0)")
    vals = frame_values(frame, v_heads, rng, T=T, plane=plane)
    return frame, vals, v_heads


def _near_scores(oracle, ffn, z, r, v, rng):
    """``(N_h, N_hᵀW_h, N_hᵀu_h)`` of every head in the near frame at z (stage 3)."""
    frame = frame_oracle(oracle, ffn, z, 1.0, r, 1.0)
    dist = float(ffn.margin(z)[0])
    rho = dist / 2
    d = z.size
    tokens = np.concatenate([np.zeros((1, d)), rho * np.eye(d)])
    bases = token_bases(frame, tokens)
    set_scale(frame, max(float(np.max(np.abs(bases))), 1e-300) * 1e-2)
    out = []
    for h in range(v.shape[0]):
        N, sc = head_scores(frame, v, h, tokens, bases, max_probe=dist / 10)
        NW, Nu = scores_to_parameters(N, sc, z, rho)
        out.append((N, NW, Nu))
    return out


def _match(parts0, vals, z_far):
    """Heads of a new region (crossings of a circle inside ``{v_g}^⊥`` of region 0) matched to region 0's."""
    pred = []
    for N, NW, Nu in parts0:
        q = N @ (NW @ z_far + Nu)  # the part of p_h(z_far) the circle sees
        pred.append(np.arctan2(-(vals.z0 @ q), vals.z1 @ q) % np.pi)
    pred = np.array(pred)
    got = np.asarray(vals.crossings) % np.pi
    D = np.abs(pred[:, None] - got[None, :])
    D = np.minimum(D, np.pi - D)
    rows, cols = linear_sum_assignment(D)
    worst = float(np.max(D[rows, cols]))
    if worst > 1e-4:
        raise RecoveryError(f"the heads of two FFN regions do not match (crossing angles off by {worst:.1e} rad): "
                            "the target is not a multi-head transformer of this form, or two heads cross together")
    return cols, worst  # cols[h]: the new region's index of head h


def _maps(oracle, ffn, regions, W, u, rng, rank_C, first):
    """Least squares for ``GᵀṼ_h`` in regions whose G span the row space of C, then Ṽ_h (stage 4)."""
    H, d = u.shape
    Gs, Bs = [], []
    bases = list(first)
    while True:
        if bases:
            z = bases.pop(0)
        else:
            beta, _, pattern = regions.next()
            z = regions.near_base(beta, pattern)
        active = ffn.pattern(z)[0]
        G, _ = ffn.linear(active)
        dist = float(ffn.margin(z)[0])
        n_tok = d + 2
        Bt = rng.standard_normal((n_tok, d))
        Bt *= (dist / 2) / np.linalg.norm(Bt, axis=1, keepdims=True) * rng.uniform(0.2, 1.0, (n_tok, 1))
        last = z + Bt
        P = np.einsum("hij,tj->thi", W, last) + u[None]  # (n_tok, H, d) scores p_h
        n_a = H + 1
        Adir = rng.standard_normal((n_tok, n_a, d))
        Adir /= np.linalg.norm(Adir, axis=2, keepdims=True)
        gam = 2.0 / np.max(np.linalg.norm(P, axis=2), axis=1)  # logits of order 1
        A = gam[:, None, None] * Adir
        X = np.empty((n_tok * (n_a + 1), 2, d))
        X[:n_tok] = last[:, None, :]
        X[n_tok:, 0] = (last[:, None, :] + A).reshape(-1, d)
        X[n_tok:, 1] = np.repeat(last, n_a, axis=0)
        y = np.asarray(oracle(X), dtype=np.float64).reshape(len(X), -1)
        base, yy = y[:n_tok], y[n_tok:].reshape(n_tok, n_a, -1)
        Y = (yy - base[:, None, :]).reshape(n_tok * n_a, -1)
        logits = np.einsum("tad,thd->tah", A, P)
        sig = softmax_last(np.stack([logits, np.zeros_like(logits)], axis=-1))[..., 0]  # σ(ℓ)
        Phi = (sig[..., :, None] * A[:, :, None, :]).reshape(n_tok * n_a, H * d)
        Bm, *_ = np.linalg.lstsq(Phi, Y, rcond=None)  # (H d, K): block h = Ṽ_hᵀG
        Gs.append(G)
        Bs.append(Bm.reshape(H, d, -1))
        Gall = np.concatenate(Gs, axis=1)
        if np.linalg.matrix_rank(Gall, tol=1e-8 * np.linalg.norm(Gall, 2)) >= rank_C:
            break
        if len(Gs) > 4 * d:
            raise RecoveryError("the FFN regions' output maps do not span the neurons' row space")
    Gpinv = np.linalg.pinv(Gall, rcond=1e-10)
    Ball = np.concatenate(Bs, axis=2)  # (H, d, ΣK)
    Vt = np.einsum("hik,kj->hji", Ball, Gpinv)  # Ṽ_h = (B_h G⁺)ᵀ
    return Vt, len(Gs)


def extract_transformer_multihead(oracle, *, seed: int = 0, check: bool = True, check_lengths=CHECK_LENGTHS,
                                  progress=None, max_regions: int | None = None, **ffn_options):
    """Recover a multi-head transformer with a biased ReLU FFN and K outputs (module docstring).

    Heads, biases, outputs and the residual are detected. Phases: ``ffn``, ``values``, ``scores``, ``maps``.
    Raises :class:`UnidentifiableError` for targets whose attention never reaches the output (or is affine: a
    plain head has no kinks) and :class:`RecoveryError` when the answers contradict the model's form.
    """
    require_fine_answers(oracle, "the transformer learner")
    d = oracle.d
    run = Run(oracle, METHOD, seed=[check_seed(seed), 19], check=check, check_lengths=check_lengths,
              progress=progress)
    run.plan(4 * d + 16, f"the transformer learner at d={d} (FFN kinks, saturated circles, head scores; adaptive)",
             at_least=True)
    rng = run.rng
    notes: list[str] = []
    with run.phase("ffn", absorb=True):
        net = extract_ffn(oracle, seed=seed, check=False, progress=progress, **ffn_options).model
    ffn = KnownFFN.from_net(net)
    K = ffn.w.shape[1]
    r = rng.standard_normal(K)
    r /= np.linalg.norm(r)
    regions = _Regions(ffn, rng, r)
    parts: list[list] = []
    near: list[np.ndarray] = []
    residual_part = 0.0
    info: dict = {"regions": []}
    with run.phase("values"):
        beta, margin, pattern = regions.next()
        _, vals0, v_heads = _far_values(oracle, ffn, beta, margin, r, rng, None)
    H = vals0.v.shape[0]
    sum_check = float(np.linalg.norm(vals0.v.sum(axis=0) - v_heads) / max(np.linalg.norm(v_heads), 1e-300))
    residual_part = max(residual_part, float(np.linalg.norm(_frame_g(ffn, pattern, r) - v_heads)
                                             / np.linalg.norm(_frame_g(ffn, pattern, r))))
    z = regions.near_base(beta, pattern)
    with run.phase("scores"):
        parts0 = _near_scores(oracle, ffn, z, r, vals0.v, rng)
    parts = [[p] for p in parts0]
    near.append(z)
    info["regions"].append({"margin": margin, "near_base": float(np.linalg.norm(z)), "radius": vals0.radius})
    plane = None
    if H > 1:
        _, _, Vt = np.linalg.svd(vals0.v)
        plane = Vt[H:].T
    limit = max_regions or (d + 2)
    while min(combine_rows(p)[2] for p in parts) < 1e-3:
        if plane is None or plane.shape[1] < 2:
            raise UnidentifiableError(f"{H} heads at width d = {d}: one FFN region shows only {d - H + 1} of the d "
                                      "directions of each head's scores, and matching heads across regions needs "
                                      "d ≥ H + 2")
        if len(near) >= limit:
            raise RecoveryError(f"{len(near)} FFN regions do not show every direction of the heads' scores")
        with run.phase("values"):
            beta, margin, pattern = regions.next()
            _, vals, v_heads = _far_values(oracle, ffn, beta, margin, r, rng, plane)
        if vals.v.shape[0] != H:
            raise RecoveryError(f"one FFN region shows {H} heads and another {vals.v.shape[0]}: the target is not "
                                "a multi-head transformer of this form")
        g = _frame_g(ffn, pattern, r)
        residual_part = max(residual_part, float(np.linalg.norm(g - v_heads) / np.linalg.norm(g)))
        cols, worst = _match(parts0, vals, FAR * beta)
        z = regions.near_base(beta, pattern)
        with run.phase("scores"):
            new = _near_scores(oracle, ffn, z, r, vals.v[cols], rng)
        for h in range(H):
            parts[h].append(new[h])
        near.append(z)
        info["regions"].append({"margin": margin, "near_base": float(np.linalg.norm(z)), "radius": vals.radius,
                                "match_angle": worst})
    W = np.empty((H, d, d))
    u = np.empty((H, d))
    for h in range(H):
        W[h], u[h], _ = combine_rows(parts[h])
    rank_C = np.linalg.matrix_rank(ffn.C, tol=1e-8 * np.linalg.norm(ffn.C, 2))
    with run.phase("maps"):
        Vt, n_map = _maps(oracle, ffn, regions, W, u, rng, rank_C, near)
    residual = residual_part > RESIDUAL_TOL
    A = ffn.C.T
    v = Vt
    if residual:
        R0 = np.eye(d) - Vt.sum(axis=0)
        if np.linalg.cond(R0) > 1e12:
            raise RecoveryError("the residual's last-token map I − Σ_h Ṽ_h is singular: not a residual block")
        A = R0.T @ ffn.C.T
        v = np.linalg.solve(R0, Vt)
    c = ffn.c
    model = MultiHeadTransformer(W, u, v, A, ffn.b, ffn.w, c, residual)
    if H == 1:
        notes.append("one head found")
    notes.append("identifiable up to: neuron order and positive scale, head order"
                 + ("" if residual else ", and V_h ↦ M V_h with A ↦ M⁻ᵀA for any invertible M")
                 + "; heads with equal (W_h, u_h) would come back as one (Prop. 7.1)")
    details = {"heads": H, "neurons": int(ffn.C.shape[0]), "outputs": K, "residual": residual,
               "residual_part": residual_part, "attention_regions": len(near), "map_regions": n_map,
               "value_sum_check": sum_check,
               **info}
    return run.finish(model, unknowns=MultiHeadTransformer.unknowns(d, H, int(ffn.C.shape[0]), K, residual),
                      details=details, notes=notes, hint=" (a one-layer multi-head transformer of this form)")


def _frame_g(ffn: KnownFFN, pattern, r) -> np.ndarray:
    return ffn.linear(pattern)[0] @ r
