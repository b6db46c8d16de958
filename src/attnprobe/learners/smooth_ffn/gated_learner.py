"""``extract_gated_ffn``: a gated FFN ``y = W2 [σ(Wg x + bg) ⊙ (Wu x + bu)] + b2`` (SwiGLU, GeGLU) from length-1
vector answers.

Phases: ``step`` (the finite-difference step), ``width`` (first derivatives along C directions at n points: their
rank is 2m, two per gated neuron), ``factors`` (second derivatives along C × E direction pairs at the same points,
Richardson-extrapolated from steps h, 2h, 4h: each neuron is a 2-D block, split off by
:func:`.decompose.block_factors`; the pairs' split grows like √(the derivatives' error), so they need the
extrapolation), ``directions`` (second derivatives along every coordinate at a few points, from h and 2h: each
neuron's plane ``span{g, u}``), no queries for the per-neuron fits in the plane (:mod:`.gated_neurons`: gate, up
and the gate activation), and ``answers`` (plain answers: the down projection by least squares, then Gauss–Newton
on all parameters, :func:`.polish.lsmr_step`).

Identifiable: each neuron's gate and the product of its up projection and output column, up to the neuron order
(:mod:`attnprobe.models.gated_ffn`); the result is normalised to unit ``‖(u_i, bu_i)‖``.

Coarse (float32) answers: the pairs split by √(the derivatives' error), so the derivative stages only start the
units and Gauss–Newton on the answers (which hold ~7 digits) finishes them. The start is made reachable by a
better-conditioned grid — points at :data:`COARSE_POINT_SCALE` × ``scale``, :data:`COARSE_POINT_FACTOR` × 2m of
them, :data:`COARSE_SECOND_DIRECTIONS`, the extrapolated step of the plain learner's float32 route — and while the
polish stalls (:data:`COARSE_FIT`) the start is drawn again (:data:`COARSE_ATTEMPTS`). Past :data:`COARSE_MAX_UNITS`
units Jennrich's pencil inverts a slice too ill-conditioned for float32 answers, and the blocks come from the drive
start instead (:mod:`.gated_drive`: the bends of the answers on circles far from the origin); when it does not find
every unit the learner refuses (:class:`UnidentifiableError`). Coarser answers are refused.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe._validation import check_int, check_option
from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.core.descent import keep_if_lower
from attnprobe.learners.core.estimate import QueryCount, Setting
from attnprobe.learners.smooth_ffn.decompose import block_factors
from attnprobe.learners.smooth_ffn.derivatives import (choose_extrapolated_step, coarse_answers, richardson,
                                                       second_derivatives, step_queries)
from attnprobe.learners.smooth_ffn.gated_drive import gated_drive_blocks
from attnprobe.learners.smooth_ffn.gated_neurons import pick_gate, planes
from attnprobe.learners.smooth_ffn.polish import BACKTRACK, lsmr_step
from attnprobe.learners.smooth_ffn.first_stages import search_width, start_run
from attnprobe.models.gated_ffn import GATED_FAMILIES, GatedFFN, family_name
from attnprobe.models.smooth_ffn import ACTIVATIONS

#: the factors' finite differences start at this multiple of the chosen step (Richardson's extrapolation
#: removes the h² and h⁴ terms, so a larger step, with less rounding, is better)
FACTOR_STEP = 3.0
#: second directions E of the factor array
SECOND_DIRECTIONS = 4
#: points at which each neuron's plane is read (each costs 4·C·d queries)
DIRECTION_POINTS = 3
#: n = ⌈POINT_FACTOR·2m⌉ + POINT_EXTRA points (at least POINT_MIN)
POINT_FACTOR, POINT_EXTRA, POINT_MIN = 1.25, 8, 64
#: K·C ≥ DIRECTION_FACTOR·2m (+1 direction)
DIRECTION_FACTOR = 1.3
#: widths tried when the hidden width is not given
FIRST_GUESS, MAX_WIDTH = 32, 4096
#: Gauss–Newton on the answers: rounds and LSMR iterations per round
GN_ROUNDS, GN_ITERATIONS = 10, 400
#: answers for the output layer and Gauss–Newton: this many times the unknowns / K
ANSWER_FACTOR = 4.0
#: fresh length-1 inputs of the functional check
CHECK_QUERIES = 64
#: on coarse (float32) answers the Jordan pairs split by √(the derivatives' error), so the factors stage only
#: starts the units and Gauss–Newton on the answers finishes them; the start needs the point mode of the factor
#: array better conditioned: the grid's points drawn at this multiple of ``scale`` (16-32-16 SwiGLU: the σ'
#: and σ''·s columns' smallest to largest singular value 4.8e-3 at 1, 1.5e-2 at 2) ...
COARSE_POINT_SCALE = 2.0
#: ... this many times 2m points (n = 1.25·2m + 8 on float64 answers; 16-32-16 SwiGLU, seeds 0–5: 4·2m passed 5
#: of 6 after 14 starts, 8·2m all 6 after 10) and this many second directions
COARSE_POINT_FACTOR, COARSE_SECOND_DIRECTIONS = 8.0, 8
#: the extrapolated step: the largest whose disagreement is within this factor of the best (16-32-16 SwiGLU,
#: four seeds: the best alone took 0.16 at two and both failed; at 0.32 all four passed, at 0.64 two failed)
COARSE_STEP_TOLERANCE = 4.0
#: starts tried on coarse answers (fresh step, grid, factors and fits each; the answers are asked once) while the
#: polish leaves the answers' relative residual above :data:`COARSE_FIT` (a right model fits float32 answers to
#: ~1e-7; a start with mismatched units stalls at 1e-2 or more); the lowest residual is kept
COARSE_ATTEMPTS, COARSE_FIT = 3, 1e-4
#: most gated units the coarse route's Jennrich start takes on: it reached the polish at 16-32-16 SwiGLU (seeds 0–5,
#: every one within three starts) but not at 32-64-32 (SwiGLU and GeGLU: three starts each, every one stalled far
#: above the answers' rounding, SwiGLU at 0.76 at best; the factor array's error 1.2e-4 against 4.6e-5 at 16-32-16,
#: 50 of 64 blocks off by more than 1e-2); wider ones take the drive start (:mod:`.gated_drive`)
COARSE_MAX_UNITS = 32
#: the drive start (:mod:`.gated_drive`) for more units on coarse answers: circles in random planes of the span of
#: the C directions and random ones up to DRIVE_DIRECTIONS in all, of radius DRIVE_RADIUS·scale·√d, DRIVE_SAMPLES
#: answers each: DRIVE_CIRCLES first, then DRIVE_MORE at a time while units are missing, at most DRIVE_MOST
DRIVE_DIRECTIONS, DRIVE_RADIUS, DRIVE_SAMPLES = 8, 1e6, 8192
DRIVE_CIRCLES, DRIVE_MORE, DRIVE_MOST = 40, 8, 96
#: points of the width grid the gate and up fits read (at most; the coarse grid has 8·2m: 16 s of 20 at 32-64-32)
FIT_POINTS = 1024
#: answers coarser than this rounding floor (``oracle.eps``) are refused: float16 and bfloat16
COARSEST_EPS = 1e-6


def _directions(K: int, m: int) -> int:
    return max(2, math.ceil(DIRECTION_FACTOR * 2 * m / K) + 1)


def _points(m: int, coarse: bool = False) -> int:
    return max(POINT_MIN, math.ceil((COARSE_POINT_FACTOR if coarse else POINT_FACTOR) * 2 * m) + POINT_EXTRA)


def drives(coarse: bool, m: int) -> bool:
    """Whether the blocks come from the drive start (:mod:`.gated_drive`): coarse answers, more than
    :data:`COARSE_MAX_UNITS` units."""
    return coarse and m > COARSE_MAX_UNITS


def gated_plan(d: int, K: int, m: int, check: int = 0, *, coarse: bool = False) -> dict[str, int]:
    """Queries of each phase at hidden width m (the width search not counted); ``coarse``: float32 answers
    (:data:`COARSE_POINT_FACTOR` times 2m points, :data:`COARSE_SECOND_DIRECTIONS`, the extrapolated step chosen
    too; past :data:`COARSE_MAX_UNITS` units the drive start's first :data:`DRIVE_CIRCLES` circles), one start: each
    further start (:data:`COARSE_ATTEMPTS`) repeats all but ``step``'s first part and ``answers``."""
    C, n = _directions(K, m), _points(m, coarse)
    E = COARSE_SECOND_DIRECTIONS if coarse else SECOND_DIRECTIONS
    answers = max(2 * m + 8, 2 * (d + 1), math.ceil(ANSWER_FACTOR * GatedFFN.unknowns(d, m, K) / K))
    factors = DRIVE_CIRCLES * DRIVE_SAMPLES if drives(coarse, m) else 3 * 4 * C * E * n
    return {"step": step_queries(coarse), "width": 2 * C * n, "factors": factors,
            "directions": 2 * 4 * C * d * DIRECTION_POINTS, "answers": answers, "check": check}


def gated_estimate(s: Setting) -> QueryCount:
    """The gated learner's queries by phase (:func:`gated_plan`), exact when ``hidden`` is given on float64
    answers; answers coarser than float32 are refused (:func:`refuse_coarse`), so they have no estimate."""
    if s.precision not in ("float64", "float32", "auto"):
        refuse_coarse(s.precision)
    m = s.needs("hidden", "a gated FFN estimate needs the number of hidden units m")
    K = s.outputs or 1
    parts = gated_plan(s.d, K, m, check=CHECK_QUERIES if s.check else 0, coarse=s.coarse)
    basis = ", ".join(f"{k} {v}" for k, v in parts.items()) + f" (K = {K} outputs per answer" + (
        "" if s.outputs else ", undeclared: declare the outputs K") + ")"
    total = sum(parts.values())
    if not s.coarse:
        return QueryCount.exactly(total, basis)
    more = (DRIVE_MOST - DRIVE_CIRCLES) * DRIVE_SAMPLES if drives(True, m) else 0
    again = step_queries(True) - step_queries() + parts["width"] + parts["factors"] + more + parts["directions"]
    if more:
        basis += f"; the drive start's circles up to {DRIVE_MOST} ({more} more) while units are missing"
    return QueryCount(total, total, total + more + (COARSE_ATTEMPTS - 1) * again,
                      basis + f"; up to {COARSE_ATTEMPTS - 1} more starts of up to {again} each while the polish "
                      "stalls")


def refuse_coarse(precision: str) -> None:
    """Gated units need float32 answers or finer: each unit's pair of eigenvalues splits by the square root of
    the second derivatives' error (on float32 answers 5e-5 after three-level extrapolation, 16-32-16 SwiGLU), and
    only the coarse route's better-conditioned grid keeps the start within reach of the polish; coarser answers
    (float16, bfloat16) are refused before any query, nothing claimed."""
    raise ConfigError(f"the gated FFN learner (SwiGLU, GeGLU) needs float32 or float64 answers; {precision} answers "
                      "leave its Jordan pairs too coarse to split (docs/smooth-ffn.md): ask for float32 or finer",
                      param="precision")


def gate_candidates(activation: str | None) -> tuple[str, ...]:
    """Gate activations to fit: ``swiglu`` → SiLU, ``geglu`` → GELU (exact and tanh), None → all."""
    if activation is None:
        return tuple(ACTIVATIONS)
    if activation == "geglu":
        return ("gelu", "gelu_tanh")
    return (GATED_FAMILIES[activation],)


def _units(rank: int) -> int:
    """Gated units from the first derivatives' rank: two per unit (span{g_i, u_i})."""
    if rank % 2:
        raise UnidentifiableError(f"the first derivatives have odd rank {rank} (gated units give two per unit): these "
                                  "answers are not a gated FFN, or give the hidden width")
    return rank // 2


def extract_gated_ffn(oracle, *, seed: int = 0, activation: str | None = None, hidden: int | None = None,
                      bias: bool = True, scale: float = 1.0, check: bool = True, progress=None,
                      polish_rounds: int = GN_ROUNDS) -> object:
    """Recover ``y = W2 [σ(Wg x + bg) ⊙ (Wu x + bu)] + b2`` from length-1 queries.

    ``activation``: ``swiglu``, ``geglu``, ``geglu_tanh`` or None (the gate activation with the best fit);
    ``hidden``: the number m of gated units if known (else read off the first derivatives' rank 2m);
    ``bias``: learn ``bg, bu, b2`` (else all 0); ``scale``: the inputs' standard deviation per coordinate."""
    check_option(activation, "activation", (None, *GATED_FAMILIES))
    check_int(hidden, "hidden", min_value=1, allow_none=True)
    check_int(polish_rounds, "polish_rounds", min_value=0)
    coarse = coarse_answers(oracle)
    if float(getattr(oracle, "eps", 0.0)) > COARSEST_EPS:
        refuse_coarse(oracle.precision)
    run, ask, h, fd_error = start_run(oracle, seed=seed, check=check, progress=progress, scale=scale,
                                      check_queries=CHECK_QUERIES)
    d, rng = oracle.d, run.rng
    K = ask.outputs
    grid_scale = COARSE_POINT_SCALE * scale if coarse else scale  # the derivatives' points (the answers: scale)
    E = COARSE_SECOND_DIRECTIONS if coarse else SECOND_DIRECTIONS
    run.plan(sum(gated_plan(d, K, hidden or FIRST_GUESS, coarse=coarse).values()),
             f"the gated FFN learner at d={d}, K={K}, m={hidden or FIRST_GUESS}", at_least=hidden is None or coarse)
    answers = None
    attempts: list[dict] = []
    best = None
    for _ in range(COARSE_ATTEMPTS if coarse else 1):
        if coarse:
            with run.phase("step"):
                h_rich, rich_error = choose_extrapolated_step(ask, d, rng, grid_scale,
                                                              tolerance=COARSE_STEP_TOLERANCE)
        else:
            h_rich, rich_error = FACTOR_STEP * h, None
        with run.phase("width"):
            w = search_width(run, ask, scale=grid_scale, h=h, hidden=hidden, first_guess=FIRST_GUESS,
                             max_width=MAX_WIDTH, grid=lambda g: (_directions(K, g), _points(g, coarse)),
                             units=_units, replan=lambda g: sum(gated_plan(d, K, g, coarse=coarse).values()),
                             what="gated FFN")
        m, drop = w.m, w.drop
        hidden = m  # a later attempt reads one grid of the width found
        C, n = _directions(K, m), _points(m, coarse)
        if K * C < 2 * m or n < 2 * m:
            raise ConfigError(f"hidden width {m} needs K·C ≥ 2m and n ≥ 2m; got K·C = {K * C}, n = {n}",
                              param="hidden")
        plan = gated_plan(d, K, m, coarse=coarse)
        run.report(run.queries + sum(plan.values()) - plan["width"] - plan["step"])
        start, sep, info = _start(run, ask, w, C, n, E=E, h_rich=h_rich, grid_scale=grid_scale, bias=bias,
                                   activation=activation, drive=drives(coarse, m))
        unknowns = GatedFFN.unknowns(d, m, K, bias)
        if answers is None:
            with run.phase("answers"):
                N = max(2 * m + 8, 2 * (d + 1), math.ceil(ANSWER_FACTOR * unknowns / K))
                Xa = scale * rng.standard_normal((N, d))
                answers = (Xa, ask(Xa))
        Xa, Ya = answers
        act = ACTIVATIONS[info["gate"]]
        params = (*start, *_down(Xa, Ya, start, act, bias))
        params, history, used = gated_gauss_newton(Xa, Ya, params, act, bias, rounds=polish_rounds,
                                                   iterations=GN_ITERATIONS)
        attempts.append({"extrapolated_step": h_rich, "worst_separation": sep["worst_separation"],
                         "polish_residual": history[-1]})
        if best is None or history[-1] < best[0]:
            best = (history[-1], params, history, used, sep, info, drop, C, n, h_rich, rich_error)
        if history[-1] < COARSE_FIT:
            break  # the answers are fitted down to their rounding
    _, params, history, used, sep, info, drop, C, n, h_rich, rich_error = best
    gate, fit, scores = info["gate"], info["fit"], info["scores"]
    model = _normalised(GatedFFN(*params, gate))
    details = {"seed": seed, "bias": bool(bias), "outputs": K, "hidden": int(m), "width_drop": drop,
               "activation": family_name(gate), "gate_activation": gate, "activation_detected": activation is None,
               "activation_fit": scores, "step": h, "step_error": fd_error, "coarse_answers": coarse,
               "extrapolated_step": h_rich, "extrapolated_step_error": rich_error, "points_scale": grid_scale,
               "directions_C": C, "second_directions_E": E, "points": n, "answers": len(answers[0]), **sep,
               "attempts": attempts,
               "plane_fit_worst": float(np.max(fit["res"])), "polish_residuals": history,
               "polish_iterations": used, "queries_per_unknown": run.queries / unknowns}
    notes = [f"gated units ({family_name(gate)}) are recovered up to their order and the scale split between each "
             "unit's up projection and its output column (normalised here to unit ‖(u_i, bu_i)‖)"]
    seen = int(details.get("units_found") or 0)
    more = (f"; the drive start found {seen} units where the width was given as {m}: give hidden={seen}, or leave "
            "it out to search the width" if seen > m else "")
    return run.finish(model, unknowns=unknowns, details=details, notes=notes,
                      check_model=model if ask.vector else _Scalar(model),
                      hint=f" (a gated FFN of this form with {family_name(gate)}){more}")


def _drive_blocks(run, ask, U: np.ndarray, m: int, scale: float) -> tuple[list[np.ndarray], dict]:
    """The m best-supported blocks of the drive start (:mod:`.gated_drive`): circles on the C directions and
    random ones up to :data:`DRIVE_DIRECTIONS`, radius :data:`DRIVE_RADIUS`·scale·√d, :data:`DRIVE_SAMPLES` answers
    each. Refuses (:class:`UnidentifiableError`) when it finds fewer than m units."""
    d, C = ask.d, U.shape[0]
    with run.phase("factors"):
        extra = run.rng.standard_normal((max(DRIVE_DIRECTIONS, C + 1) - C, d))
        extra /= np.linalg.norm(extra, axis=1, keepdims=True)
        blocks, support, info = gated_drive_blocks(ask, np.concatenate([U, extra]), C,
                                                   DRIVE_RADIUS * scale * math.sqrt(d), DRIVE_SAMPLES, m,
                                                   first=DRIVE_CIRCLES, more=DRIVE_MORE, most=DRIVE_MOST)
    if len(blocks) < m:
        raise UnidentifiableError(f"the drive start found {len(blocks)} of {m} gated units on its circles "
                                  "(docs/smooth-ffn.md, 'Gated units driven'): nothing is claimed")
    return blocks[:m], {**info, "start": "drive", "worst_support": int(support[m - 1]), "worst_separation": None}


def _start(run, ask, w, C: int, n: int, *, E: int, h_rich: float, grid_scale: float, bias: bool,
           activation: str | None, drive: bool = False):
    """The derivative-based start ``(Wg, bg, Wu, bu)`` on the width grid ``w``: the blocks from the factor array,
    each unit's plane from the coordinate second derivatives, gate and up fitted in the plane. Returns the start,
    the blocks' separations and ``{"gate", "fit", "scores"}`` of the gate fit."""
    d, K, rng = ask.d, ask.outputs, run.rng
    m, U, D1, X = w.m, w.U[:C], w.D1[:, :C, :], w.X
    if drive:
        blocks, sep = _drive_blocks(run, ask, U, m, grid_scale)
    else:
        with run.phase("factors"):
            V = rng.standard_normal((E, d))
            V /= np.linalg.norm(V, axis=1, keepdims=True)
            T = richardson(lambda s: second_derivatives(ask, X[:n], U, V, s), h_rich)
        blocks, sep = block_factors(T.reshape(K * C, E, n), m, rng)
    # each block is w2_i ⊗ (2-D subspace of R^C): its output direction is the top left singular vector
    w2_dirs = np.empty((m, K))
    for i, B in enumerate(blocks):
        R = np.transpose(B.reshape(K, C, 2), (0, 2, 1)).reshape(K, 2 * C)
        w2_dirs[i] = np.linalg.svd(R, full_matrices=False)[0][:, 0]
    Ap = np.linalg.pinv(np.hstack(blocks))
    with run.phase("directions"):
        Xs = grid_scale * rng.standard_normal((DIRECTION_POINTS, d))
        Td = richardson(lambda s: second_derivatives(ask, Xs, U, np.eye(d), s), h_rich, levels=2)
    Z = np.einsum("ra,adp->prd", Ap, Td.reshape(K * C, d, DIRECTION_POINTS)).reshape(DIRECTION_POINTS, m, 2, d)
    Qs = planes(Z)  # (m, d, 2)
    # first derivatives unmixed by the refined blocks w2_i ⊗ U Q_i: κ_i Q_iᵀ ∇φ_i at every point
    Bref = _refined_blocks(w2_dirs, U, Qs)
    pts = np.sort(rng.choice(X.shape[0], size=min(X.shape[0], FIT_POINTS), replace=False))
    coef = (np.linalg.pinv(Bref) @ D1[:, :, pts].reshape(K * C, -1)).reshape(m, 2, -1)
    z = np.einsum("mdk,nd->mkn", Qs, X[pts])
    gate, fit, scores = pick_gate(coef, z, bias, rng, gate_candidates(activation))
    theta = fit["theta"]
    Wg = np.einsum("mdk,mk->md", Qs, theta[:, 0:2])
    bg = theta[:, 2] if bias else np.zeros(m)
    Wu = np.einsum("mdk,mk->md", Qs, theta[:, 3:5])
    bu = theta[:, 5] if bias else np.zeros(m)
    return (Wg, bg, Wu, bu), sep, {"gate": gate, "fit": fit, "scores": scores}


def _refined_blocks(w2_dirs: np.ndarray, U: np.ndarray, Qs: np.ndarray) -> np.ndarray:
    """The blocks ``w2_i ⊗ U Q_i`` as a ``(K·C, 2m)`` matrix (columns 2i, 2i+1 for neuron i)."""
    UQ = np.einsum("cd,mdk->mck", U, Qs)  # (m, C, 2)
    B = np.einsum("mk,mce->kcme", w2_dirs, UQ)  # (K, C, m, 2)
    return B.reshape(w2_dirs.shape[1] * U.shape[0], -1)


def _hidden(X, Wg, bg, Wu, bu, act):
    a = X @ Wg.T + bg
    s = X @ Wu.T + bu
    return a, s


def _down(X, Y, first, act, bias):
    """``(W2, b2)`` by least squares given the gates and ups ``first = (Wg, bg, Wu, bu)``."""
    Wg = first[0]
    a, s = _hidden(X, *first, act)
    H = act.f(a) * s
    if bias:
        H = np.hstack([H, np.ones((H.shape[0], 1))])
    sol = np.linalg.lstsq(H, Y, rcond=None)[0]
    m = Wg.shape[0]
    return sol[:m].T.copy(), (sol[m].copy() if bias else np.zeros(Y.shape[1]))


def _forward(X, params, act):
    Wg, bg, Wu, bu, W2, b2 = params
    a, s = _hidden(X, Wg, bg, Wu, bu, act)
    return (act.f(a) * s) @ W2.T + b2


def gated_gauss_newton(X, Y, params, act, bias: bool, *, rounds: int, iterations: int):
    """Gauss–Newton on ``(Wg, bg, Wu, bu, W2, b2)`` against the answers: the gate and up rows are the 2m
    first-layer rows of :func:`.polish.lsmr_step` (factors ``σ'(a)·s`` and ``σ(a)``, both through ``w2_i``); a
    step that does not halve the residual is compared with its half, quarter and eighth (:data:`.polish.BACKTRACK`)
    and the best is kept only when it lowers the residual. Returns the parameters, the relative residuals, the LSMR
    iterations."""
    scale_y = max(float(np.linalg.norm(Y)), 1e-300)
    R = Y - _forward(X, params, act)
    history = [float(np.linalg.norm(R)) / scale_y]
    used: list[int] = []
    d = X.shape[1]
    for _ in range(rounds):
        Wg, bg, Wu, bu, W2, b2 = params
        m = Wg.shape[0]
        a, s = _hidden(X, Wg, bg, Wu, bu, act)
        f0 = act.f(a)
        dP, dH, it = lsmr_step(X, R, f0 * s, np.hstack([act.d1(a) * s, f0]), np.hstack([W2, W2]), bias=bias,
                               iterations=iterations)
        used.append(it)
        zero = np.zeros(m)
        err = np.inf
        for t in BACKTRACK:  # the full step, and when it does not halve the residual the shorter ones: the best
            candidate = (Wg + t * dP[:m, :d], bg + t * (dP[:m, d] if bias else zero), Wu + t * dP[m:, :d],
                         bu + t * (dP[m:, d] if bias else zero), W2 + t * dH[:m].T, b2 + t * (dH[m] if bias else 0.0))
            R_t = Y - _forward(X, candidate, act)
            err_t = float(np.linalg.norm(R_t)) / scale_y
            if err_t < err:
                trial, R_new, err = candidate, R_t, err_t
            if err < history[-1] / 2:
                break
        (params, R), more = keep_if_lower(history, err, (params, R), (trial, R_new), floor=1e-15)
        if not more:
            break
    return params, history, used


def _normalised(model: GatedFFN) -> GatedFFN:
    """The same function with each unit's ``(u_i, bu_i)`` at unit norm (the free scale moved into ``w2_i``)."""
    c = np.sqrt(np.sum(model.Wu ** 2, axis=1) + model.bu ** 2)
    c = np.where(c > 0, c, 1.0)
    return GatedFFN(model.Wg, model.bg, model.Wu / c[:, None], model.bu / c, model.W2 * c[None, :], model.b2,
                    model.activation, model.dtype)


class _Scalar:
    """A one-output model answering ``(B,)`` like a scalar oracle."""

    def __init__(self, model) -> None:
        self.model = model

    def __call__(self, X):
        return self.model(X)[:, 0]
