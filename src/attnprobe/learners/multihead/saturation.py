"""Value vectors of every head from the saturated regime (the multi-head learner's first stage).

For a fixed last token ``y`` and probe ``w``, ``F_y(w) = f([y + w; y]) − f([y; y]) = Σ_h σ(wᵀp_h)·wᵀv_h`` with
``p_h = W_h y + u_h`` (App. C's two-row form, with biases). Where every logit ``|wᵀp_h|`` exceeds ~40,
``σ`` is 0 or 1 to float64 rounding, so F is *exactly linear* on each cone of the arrangement of the H
hyperplanes ``p_h^⊥``: ``F_y(w) = wᵀg_S`` with ``g_S = Σ_{h∈S} v_h`` (S: the heads with ``wᵀp_h > 0``).

On the half circle ``w(θ) = T(cos θ z₀ + sin θ z₁)``, θ ∈ [0, π], every hyperplane is crossed exactly once
(``w(π) = −w(0)``), and each crossing changes the gradient by ``±v_h``. The stage

1. raises the radius T until F is homogeneous of degree one at random points (``F(2w) = 2F(w)``: saturated);
2. labels points of the circle by their local cone coefficients ``(z₀ᵀg, z₁ᵀg)`` and bisects between points with
   different labels down to ``resolution`` radians: the crossings;
3. measures the full gradient (2d + 2 queries: two step sizes that must agree, one homogeneity check) at the
   middle of every cone; cones with equal gradients (search artefacts) are merged;
4. differences adjacent cones: the jumps ``J_i = ±v_h``; the signs come from ``g_0 = Σ_{h on at θ=0} v_h``
   written in the basis of the jumps (coefficients in {0, −1}); ``Σ_h v_h`` (length-1 queries) gives the
   gradient of the cone after the last crossing (opposite the first).

H is the number of jumps. Heads with parallel ``p_h`` (equal ``W_h, u_h``: Prop. 7.1) cross together and come
out as one head with the summed value vector, which computes the same function.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnprobe.errors import AttnprobeError, RecoveryError, SaturationError, UnidentifiableError
from attnprobe.oracles.input_bound import refuse_clipping

#: |logit| above which σ is 0 or 1 to float64 rounding (σ(−40) = 4e-18)
SATURATED_LOGIT = 40.0
#: local cone coefficients that differ by more than this (relative) belong to different cones
LABEL_TOL = 1e-7
#: the search radius is this many times the smallest radius found saturated at random points
RADIUS_MARGIN = 1e7
#: adjacent cone gradients closer than this (relative to the largest) are one cone
SAME_CONE = 1e-6
#: the largest probe row is this many times the search radius (the homogeneity and gradient checks double it)
PROBE_GROWTH = 2.5


@dataclass
class ValueStage:
    """What the saturated circle found: value vectors ``v (H, d)``, cone gradients and bookkeeping."""

    v: np.ndarray
    radius: float
    crossings: np.ndarray  # θ of each crossing, in order
    gradients: np.ndarray  # (H + 1, d): cone gradients along the circle
    signs: np.ndarray  # +1: the head switches on at its crossing, −1: off
    queries: int
    details: dict = field(default_factory=dict)
    v_err: np.ndarray | None = None  # (H,): measured bound on ‖v̂_h − v_h‖ (step agreement of both cones)

    @property
    def leak(self) -> float:
        """``Σ_h ‖v̂_h − v_h‖ / ‖Σ_h v_h‖``: the relative size of the other heads' leak into an isolated head."""
        total = float(np.linalg.norm(self.gradients[-1] + self.gradients[0]))  # Σv = g_last + g_0
        return float(np.sum(self.v_err)) / max(total, float(np.max(np.linalg.norm(self.v, axis=1))))


class Circle:
    """``F_y`` on the half circle ``T(cos θ z₀ + sin θ z₁)``: counted queries, answers minus ``f([y; y])`` (plus a
    known linear term ``wᵀshift`` when given: then no cone has a zero gradient); the interface
    :func:`find_crossings` and :func:`cone_gradients` read."""

    def __init__(self, oracle, y, z0, z1, base, gain, *, tol: float | None = None, shift=None):
        self.oracle, self.y, self.z0, self.z1, self.base = oracle, y, z0, z1, base
        self.gain = gain  # a bound on ‖g‖ for the rounding tolerances (‖Σ_h v_h‖ until the heads are known)
        self.given_tol, self.shift = tol, shift

    @property
    def tol(self) -> float:
        """Relative agreement of answers on one cone, at the answers' precision as known now (an ``auto`` oracle
        may only read it from the answers of this stage), unless given."""
        return self.given_tol if self.given_tol is not None else max(LABEL_TOL, 1e5 * self.oracle.eps)

    def point(self, theta, T):
        th = np.atleast_1d(theta)
        return T * (np.cos(th)[:, None] * self.z0 + np.sin(th)[:, None] * self.z1)

    def F(self, W):
        W = np.atleast_2d(W)
        X = np.empty((W.shape[0], 2, W.shape[1]))
        X[:, 0] = self.y + W
        X[:, 1] = self.y
        out = self.oracle(X) - self.base
        return out if self.shift is None else out + W @ self.shift


def _homogeneous(F1, F2, eps, mag):
    """``F(2w) = 2F(w)`` to rounding: every head's weight is 0 or 1 at w. ``mag`` bounds ``|F(w)|``
    (``‖w‖·‖g‖``): the rounding of the probe ``y + w`` makes an error of ``eps·mag`` even where F cancels."""
    return np.abs(F2 - 2 * F1) <= 64 * eps * (np.abs(F2) + mag)


def input_norm_limit(oracle, *, precision: bool = True) -> float:
    """The largest input row norm the oracle accepts (``oracle.max_input_norm``, inf when unset); refuses when it
    leaves no room for saturated probes (``RADIUS_MARGIN`` times a saturation radius of at least 1), or when the
    answers' ``precision`` overflows first (reading it may ask an ``auto`` oracle a few queries)."""
    limit = oracle.max_input_norm
    limit = float("inf") if limit is None else float(limit)
    need = PROBE_GROWTH * RADIUS_MARGIN
    top = _largest_finite(oracle.precision) if precision else float("inf")
    if top ** 0.5 < need:  # logits are products of two rows: they overflow at the square root
        err = SaturationError(f"{oracle.precision} answers overflow for inputs of norm above about {top ** 0.5:.3g} "
                              f"(logits are products of two rows, the largest {oracle.precision} is {top:.6g}), but "
                              f"the generic multi-head learner's saturated probes need norms of at least {need:.1e}: "
                              "the answers are too coarse for it")
        err.cause_named = True  # already the cause: not to be reworded as a failed stage
        raise err
    if limit < need:
        err = SaturationError(f"the oracle accepts input rows of norm at most {limit:.3g}, but the generic multi-head "
                              f"learner's saturated probes need norms of at least {need:.1e} (typically 1e10 … 1e13) "
                              "to tell the heads apart from scalar answers; raise the oracle's input-norm bound, use "
                              "a learner for vector answers if the oracle returns whole output rows, or method "
                              "'orthogonal' (small probes) if the heads live in orthogonal subspaces")
        err.cause_named = True  # refused before any query: no other learner is tried behind the user's back
        raise err
    return limit


def _largest_finite(precision: str) -> float:
    """The largest finite number of a binary precision (inf for decimal rounding and unknown names)."""
    from attnprobe.models.precision import resolve_dtype

    try:
        return float(np.finfo(resolve_dtype(precision)).max)
    except (AttnprobeError, TypeError, ValueError):
        return float("inf")


def _relative_residual(F1, F2, mag):
    return np.abs(F2 - 2 * F1) / (np.abs(F2) + mag)


def confirm_radius(circle, rng, T, eps, n_points=6):
    """The search radius (``RADIUS_MARGIN`` beyond the first saturated one) must still be homogeneous: an oracle
    that clips its rows is refused by :func:`refuse_clipping` (its length-1 answers, ~15 queries), one that changes
    large inputs otherwise (normalises, overflows) here (2·n_points queries)."""
    refuse_clipping(circle.oracle, PROBE_GROWTH * T)
    P = circle.point(rng.uniform(0, np.pi, n_points), T)
    F = circle.F(np.concatenate([P, 2 * P]))
    F1, F2 = F[:n_points], F[n_points:]
    if not np.all(_homogeneous(F1, F2, eps, 2 * T * circle.gain)):
        res = float(np.max(_relative_residual(F1, F2, 2 * T * circle.gain)))
        raise SaturationError(f"the answers were homogeneous in the probe at a smaller norm but not at {T:.1e} "
                              f"(F(2w) − 2F(w) at {res:.1e} of the answers): the oracle changes large inputs (clips, "
                              "normalises or overflows them); declare its max_input_norm")


def saturate_radius(circle, rng, eps, n_points=6, start=1.0, grow=100.0, max_radius=1e15):
    """Smallest radius ``start·grow^k`` at which F is homogeneous at ``n_points`` random circle points.

    Returns ``(T, noise)``. When ``F(2w) − 2F(w)`` stops shrinking as T grows (a plateau of relative size
    ``noise`` ≥ 64 eps, below 1e-6), the answers carry noise or rounding of that size: the radius is accepted and
    the caller raises its rounding floor to ``noise`` (otherwise noise is ``None``). When no radius works, an
    oracle that clips its rows is named as the cause (:func:`refuse_clipping`) before anything else.
    """
    thetas = rng.uniform(0, np.pi, n_points)
    T = start
    last = None
    while T <= max_radius:
        P = circle.point(thetas, T)
        F = circle.F(np.concatenate([P, 2 * P]))
        F1, F2 = F[:n_points], F[n_points:]
        if np.all(_homogeneous(F1, F2, eps, 2 * T * circle.gain)):
            return T, None
        res = float(np.max(_relative_residual(F1, F2, 2 * T * circle.gain)))
        if last is not None and 64 * eps < res < 1e-6 and last < 1e-6 and res > last / 30:
            return T, 4 * max(res, last)  # a plateau: what is left is the answers' noise, not the sigmoids' tails
        last = res
        T *= grow
    refuse_clipping(circle.oracle, 2 * T / grow)
    bound = circle.oracle.max_input_norm
    if max_radius < 1e15 and bound is not None:
        raise SaturationError(f"the oracle's max_input_norm = {bound:.3g} lets the saturated probes search radii up to "
                              f"{max_radius:.1e} only (they need {RADIUS_MARGIN:.0e}× the first saturated radius), "
                              f"and up to radius {T / grow:.0e} the answers were not yet saturated (F(2w) − 2F(w) at "
                              f"{last:.1e} of the answers); raise the bound to about "
                              f"{PROBE_GROWTH * RADIUS_MARGIN * T:.0e}")
    if last is not None and last < 1e-6:
        raise SaturationError(f"the answers are not homogeneous in the probe up to radius {T / grow:.0e}: "
                              f"F(2w) − 2F(w) stays at {last:.1e} of the answers, above the {eps:.1e} rounding of "
                              "their precision: noise or rounding of that relative size hides the saturated regime")
    raise SaturationError(f"the answers never became homogeneous in the probe up to radius {T / grow:.0e} "
                          f"(F(2w) − 2F(w) at {last:.1e} of the answers): some head's logits do not grow with the "
                          "probe (W_h y + u_h = 0?), so the saturated regime that separates the heads cannot be "
                          "reached")


def _labels(circle, thetas, T, step):
    """Local cone coefficients ``(a, b)`` with ``F/T = a cos θ + b sin θ`` from F at θ − step, θ, θ + step.

    Returns the labels and a mask of valid ones (the three points lie on one cone: the third point agrees).
    """
    th = np.asarray(thetas, dtype=float)
    step = np.broadcast_to(np.asarray(step, dtype=float), th.shape)
    n = th.size
    F = circle.F(np.concatenate([circle.point(th, T), circle.point(th + step, T), circle.point(th - step, T)])) / T
    c0, s0, c1, s1 = np.cos(th), np.sin(th), np.cos(th + step), np.sin(th + step)
    det = c0 * s1 - s0 * c1  # = sin(step)
    a = (F[:n] * s1 - F[n:2 * n] * s0) / det
    b = (c0 * F[n:2 * n] - c1 * F[:n]) / det
    pred = a * np.cos(th - step) + b * np.sin(th - step)
    scale = np.abs(F[:n]) + np.abs(F[n:2 * n]) + np.abs(F[2 * n:]) + 1e-6 * circle.gain  # rounding: eps·‖g‖
    valid = np.abs(pred - F[2 * n:]) <= circle.tol * scale
    return np.stack([a, b], axis=1), valid


def _predicts(label, theta, value, scale, tol):
    return label is not None and abs(label[0] * np.cos(theta) + label[1] * np.sin(theta) - value) <= tol * scale


def find_crossings(circle, T, v_sum, grid=8, resolution=1e-7, max_crossings=None):
    """Angles in (0, π) where the cone changes, by bisection between points of different cones.

    A point of the circle is labelled by its local cone coefficients (valid when three nearby answers agree);
    the midpoint of an interval joins the side whose label predicts its answer, otherwise it gets its own
    label (or none, inside a transition). Intervals narrower than ``resolution`` with different sides are
    the crossings (several heads whose crossings are closer than that come out merged). Every open interval
    holds a crossing, so more than ``4·max_crossings + 2·grid`` intervals and crossings (``max_crossings``
    defaults to d/2: more heads cannot be separated anyway) end the search with :class:`RecoveryError` instead of
    bisecting answers that are not piecewise linear.
    """
    d = circle.z0.size
    cap = 4 * (max(1, d // 2) if max_crossings is None else max_crossings) + 2 * grid
    th = np.linspace(0.0, np.pi, grid + 1)[:-1] + np.pi / (2 * grid)
    lab, ok = _labels(circle, th, T, np.pi / (16 * grid))
    pts = [(t, l) for t, l, k in zip(th, lab, ok) if k]
    if len(pts) < 2:
        raise SaturationError("the answers are not piecewise linear on the probe circle: the saturated regime was "
                              "not reached")
    # close the circle: the point θ₀ + π lies in the opposite cone, whose gradient is Σ_h v_h − g
    sum_label = np.array([circle.z0 @ v_sum, circle.z1 @ v_sum])
    pts.append((pts[0][0] + np.pi, sum_label - pts[0][1]))
    # labels are projections of g onto the circle's plane (typically ‖g‖·√(2/d)): a grid that lies in the
    # all-heads-off cone has labels of pure rounding (~1e-28), which must not set the scale that tells cones apart
    scale = max(float(np.max(np.abs(lab[ok]))), 0.1 * circle.gain * np.sqrt(2.0 / circle.z0.size)) or 1.0
    tol = circle.tol
    pending = [(p[0], p[1], q[0], q[1]) for p, q in zip(pts, pts[1:]) if np.linalg.norm(p[1] - q[1]) > tol * scale]
    crossings = []
    while pending:
        tol = circle.tol
        if len(pending) + len(crossings) > cap:
            raise RecoveryError(f"the saturated answers change their linear piece more than {cap} times on the probe "
                                f"circle (at most {(cap - 2 * grid) // 4} heads expected): they are not a sum of "
                                "saturated heads at the answers' precision; stopped after "
                                f"{circle.oracle.queries} queries instead of bisecting noise")
        mids = np.array([(lo + hi) / 2 for lo, _, hi, _ in pending])
        vals = circle.F(circle.point(mids, T)) / T
        nxt, unknown = [], []
        for (lo, L, hi, R), m, f in zip(pending, mids, vals):
            if hi - lo <= resolution:
                crossings.append(0.5 * (lo + hi))
            elif _predicts(L, m, f, scale, tol):
                nxt.append((m, L, hi, R))
            elif _predicts(R, m, f, scale, tol):
                nxt.append((lo, L, m, R))
            else:
                unknown.append((lo, L, hi, R, m))
        if unknown:
            ms = np.array([u[4] for u in unknown])
            steps = np.array([(u[2] - u[0]) / 64 for u in unknown])
            labs, oks = _labels(circle, ms, T, steps)
            for (lo, L, hi, R, m), lm, k in zip(unknown, labs, oks):
                M = lm if k else None
                nxt.append((lo, L, m, M))
                nxt.append((m, M, hi, R))
        pending = [p for p in nxt if p[1] is None or p[3] is None
                   or np.linalg.norm(p[1] - p[3]) > tol * scale]
    cross = np.sort(np.array(crossings) % np.pi)
    if cross.size:  # several search paths can end at one crossing (also across θ = 0 ≡ π)
        cross = cross[np.concatenate([[True], np.diff(cross) > 4 * resolution])]
        if cross.size > 1 and cross[0] + np.pi - cross[-1] <= 4 * resolution:
            cross = cross[:-1]
    return cross, scale


def cone_gradients(circle, lo, hi, T, basis, eps, *, tries: int, refusal: str):
    """The gradient inside each saturated cone ``(lo_k, hi_k)`` of the probe circle of radius ``T``: a step from
    the cone's centre (:func:`cone_gradient`), shrunk 8x, at most ``tries`` times, until it stays inside the cone;
    a cone no step fits raises :class:`SaturationError` ending in ``refusal``. Returns (gradients, their errors)."""
    grads, errs = [], []
    for a, b in zip(lo, hi):
        center = circle.point(0.5 * (a + b), T)[0]
        delta = 0.25 * T * np.sin(0.5 * (b - a))
        for _ in range(tries):
            g, ok, err = cone_gradient(circle, center, delta, basis, eps)
            if ok:
                break
            delta /= 8
        else:
            raise SaturationError(f"no step stays inside a saturated cone of the probe circle; {refusal}")
        grads.append(g)
        errs.append(err)
    return grads, errs


def cone_gradient(circle, center, delta, basis, eps):
    """Gradient of F in the cone around ``center`` from ``F(center + δ q_i)`` (q_i: rows of ``basis``).

    F is linear and homogeneous in a saturated cone, so the gradient from steps δ and δ/4 must agree to
    rounding (a step that left the cone shows as a jump divided by the step), and ``F(2c) = 2F(c)``;
    returns ``(g, ok, err)`` (2d + 2 queries), ``err = ‖g − g₄‖``: the δ/4 step carries four times the rounding
    of g, so this bounds g's error (measured, whatever the answers' precision or noise).
    """
    pts = np.concatenate([center[None], center[None] + delta * basis, center[None] + (delta / 4) * basis,
                          2 * center[None]])
    d = basis.shape[0]
    F = circle.F(pts)
    g = basis.T @ ((F[1:d + 1] - F[0]) / delta)
    g4 = basis.T @ ((F[d + 1:2 * d + 1] - F[0]) / (delta / 4))
    mag = np.abs(F[0]) + np.linalg.norm(center) * (np.linalg.norm(g) + circle.gain)
    agree = np.linalg.norm(g - g4) <= 64 * eps * mag / (delta / 4) * np.sqrt(d)
    ok = agree and _homogeneous(F[0], F[-1], eps, 2 * mag)
    return g, bool(ok), float(np.linalg.norm(g - g4))


def saturated_values(oracle, y, v_sum, base, rng, *, grid=8, resolution=1e-7, min_width=1e-6, max_crossings=None):
    """The first stage: every head's value vector ``v_h`` from one saturated half circle around ``y``.

    ``v_sum`` = ``Σ_h v_h`` and ``base`` = ``f([y; y])`` come from length-1 queries. Raises
    :class:`SaturationError` when the regime is out of reach, :class:`RecoveryError` when the jumps are not
    consistent with a sum of heads (then raise ``grid`` or lower ``resolution``). Probes stay within the
    oracle's ``max_input_norm``; answer noise found on the way (a plateau of ``F(2w) − 2F(w)``) raises the
    oracle's rounding floor (``details["measured_noise"]``).
    """
    d = oracle.d
    start = oracle.queries
    Z = np.linalg.qr(rng.standard_normal((d, 2)))[0]
    circle = Circle(oracle, y, Z[:, 0], Z[:, 1], base, float(np.linalg.norm(v_sum)))
    top = min(1e15, input_norm_limit(oracle) / PROBE_GROWTH / RADIUS_MARGIN)
    T, noise = saturate_radius(circle, rng, oracle.eps, start=max(1.0, float(np.linalg.norm(y))), max_radius=top)
    if noise is not None:
        oracle.eps_floor = max(oracle.eps_floor, float(noise))  # the measured noise is the answers' floor
    T *= RADIUS_MARGIN  # transitions far narrower than the resolution of the search
    confirm_radius(circle, rng, T, oracle.eps)
    cross, scale = find_crossings(circle, T, v_sum, grid, resolution, max_crossings)
    if cross.size == 0:
        raise UnidentifiableError("the saturated answers are linear in the probe: no head's attention depends on it "
                                  "(every W_h y + u_h = 0), so the heads cannot be told apart")
    most = 2 * (max(1, d // 2) if max_crossings is None else max_crossings) + 4
    if cross.size > most:  # each cone's gradient costs 2d + 2 queries: do not pay for search debris
        raise RecoveryError(f"the saturated probe circle shows {cross.size} crossings, more than {most} for the heads "
                            "that can be separated: the answers are not a sum of saturated heads at their precision "
                            f"({oracle.precision}); stopped after {oracle.queries - start} queries")
    # cones between consecutive crossings on the circle (the first wraps around θ = 0); a cone whose centre is
    # not saturated lies inside a transition (search debris): drop it, its neighbours' jump covers it
    lo = np.concatenate([[cross[-1] - np.pi], cross[:-1]])
    hi = cross
    wide = hi - lo > min_width
    lo, hi = lo[wide], hi[wide]
    centers = circle.point(0.5 * (lo + hi), T)
    F = circle.F(np.concatenate([centers, 2 * centers]))
    sat = _homogeneous(F[: len(lo)], F[len(lo):], oracle.eps, 2 * T * max(scale, circle.gain))
    lo, hi = lo[sat], hi[sat]
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0].T
    grads, errs = cone_gradients(circle, lo, hi, T, basis, oracle.eps, tries=20,
                                 refusal="the heads' logits are too close to one another to be separated")
    G, E, spurious = _merge_cones(grads, errs, list(hi - lo), v_sum, max(SAME_CONE, 1e5 * oracle.eps))
    J = np.diff(G, axis=0)  # one jump per crossing
    # signs: g_0 = Σ_{heads on in the first cone} v_h = −Σ_{jumps that switch a head off} J_i
    coef, *_ = np.linalg.lstsq(J.T, G[0], rcond=None)
    off = coef < -0.5
    bad = float(np.max(np.abs(np.where(off, coef + 1, coef))))
    rel_err = float(np.max(E)) / float(np.min(np.linalg.norm(J, axis=1)))
    if bad > max(1e-6, 1e5 * oracle.eps):
        cause = (f"the gradients themselves are only measured to {rel_err:.1e} (relative) at these answers' "
                 "precision" if bad <= 100 * rel_err else "two heads crossed within the search resolution or the "
                 "heads are not generic; retry with another seed")
        raise RecoveryError(f"the cone gradients are not a sum of per-head value vectors (coefficients "
                            f"{np.round(coef, 4).tolist()}, expected 0 or −1): {cause}")
    signs = np.where(off, -1.0, 1.0)
    v = signs[:, None] * J
    v_err = E[1:] + E[:-1]
    return ValueStage(v, T, cross, G, signs, oracle.queries - start,
                      {"radius": T, "cones": len(lo), "crossings_found": int(cross.size), "label_scale": scale,
                       "sign_residual": bad, "spurious_crossings": spurious, "measured_noise": noise,
                       "max_input_norm": PROBE_GROWTH * T,
                       "value_error": float(np.max(v_err / np.linalg.norm(v, axis=1)))}, v_err)


def _merge_cones(grads, errs, widths, v_sum, same):
    """Adjacent cones whose gradients agree to ``same`` (relative) are one cone, keeping the gradient of the widest
    (the most accurate: the largest steps); the cone after the last crossing is opposite the first (gradient
    ``Σv − g₀``). A "crossing" between equal gradients is a search artefact (a label that straddled a crossing
    where the head's value ``z(θ)ᵀv_h`` nearly vanishes). Returns the gradients, their error bounds and the
    number of spurious crossings."""
    floor = same * float(np.max(np.linalg.norm(grads, axis=1)))
    merged, err, best = [grads[0]], [errs[0]], [widths[0]]
    spurious = 0
    for g, e, w in zip(grads[1:], errs[1:], widths[1:]):
        if np.linalg.norm(g - merged[-1]) <= floor:
            spurious += 1
            if w > best[-1]:
                merged[-1], err[-1], best[-1] = g, e, w
        else:
            merged.append(g)
            err.append(e)
            best.append(w)
    # a spurious crossing near θ = π makes the last measured cone the closing one
    if len(merged) > 1 and np.linalg.norm(merged[-1] - (v_sum - merged[0])) <= floor:
        spurious += 1
        merged[-1], err[-1] = v_sum - merged[0], err[0]
    else:
        merged.append(v_sum - merged[0])
        err.append(err[0])
    return np.array(merged), np.array(err), spurious
