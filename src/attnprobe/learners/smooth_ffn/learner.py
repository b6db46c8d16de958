"""``extract_smooth_ffn``: a smooth FFN ``y = W2 σ(W1 x + b1) + b2`` from length-1 vector answers.

Phases (each charged to its own query count): ``step`` (the finite-difference step), ``width`` (first
derivatives along C directions at n points: the hidden width m as their rank, and later each neuron's σ'
curve), ``factors`` (second derivatives along C × E direction pairs at the same points: Jennrich's
simultaneous diagonalisation gives the fixed factors ``w2_i ⊗ U w1_i``, :mod:`.decompose`), ``directions``
(second derivatives along every coordinate at a few points: ``w1_i``'s direction, :mod:`.neurons`), then no
queries for the per-neuron curve fits (scale, bias, activation), and ``answers`` (plain answers at fresh points:
the second layer by least squares and Gauss–Newton on all parameters, :mod:`.polish`).

Works for any hidden width m with ``m ≤ K·C`` (C grows with m) — m above the input width d and above the
output count K included — because the points, not the outputs, carry the neurons apart.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe._validation import check_int, check_option
from attnprobe.errors import ConfigError
from attnprobe.learners.core.estimate import QueryCount, Setting
from attnprobe.learners.smooth_ffn.decompose import distinct_columns, factors, split_factors
from attnprobe.learners.smooth_ffn.derivatives import (choose_extrapolated_step, coarse_answers,
                                                       second_derivatives, step_queries)
from attnprobe.learners.smooth_ffn.derivatives import richardson as richardson_differences
from attnprobe.learners.smooth_ffn.drive_start import DRIVABLE, MAX_AIMED, PROBES, circles, drive_factors, growth_gap
from attnprobe.learners.smooth_ffn.neurons import directions, pick_activation
from attnprobe.learners.smooth_ffn.polish import gauss_newton, output_layer
from attnprobe.learners.smooth_ffn.first_stages import search_width, start_run
from attnprobe.models.smooth_ffn import ACTIVATIONS, SmoothFFN, activation as get_activation

#: second directions E of the factor array (mixtures of E slices are diagonalised)
SECOND_DIRECTIONS = 4
#: ... on coarse (float32) answers: more mixtures to choose each neuron's from (16-48-16 GELU in float32:
#: 7 of 8 seeds passed with 4, 10 of 10 with 8)
COARSE_SECOND_DIRECTIONS = 8
#: alternating least-squares sweeps refining the factors on coarse answers (MiniLM layer 2's first 192 units on
#: float32 answers: factors wrong by more than 1e-2 from 5 to 2 of 192, median 1 − cos from 6e-5 to 6e-6)
COARSE_SWEEPS = 30
#: draws of the Jennrich mixtures tried on coarse answers while the refined factors leave a neuron out
COARSE_ATTEMPTS = 3
#: the drive start (:mod:`.drive_start`): circles on the learner's C directions and DRIVE_EXTRA random ones (at least
#: DRIVE_DIRECTIONS in all), of radius DRIVE_RADIUS·scale·√d, with samples per circle a power of two ≥ DRIVE_SAMPLES
#: per bend (2m bends) but at most DRIVE_MAX_SAMPLES (a bend's second difference shrinks with the step while the
#: rounding does not: on MiniLM layer 2's whole FFN a floor of 12 times the median found 12 of 3072 bends on a circle
#: of 65,536 samples, 573 on 16,384)
DRIVE_DIRECTIONS, DRIVE_EXTRA, DRIVE_RADIUS, DRIVE_SAMPLES, DRIVE_MAX_SAMPLES = 4, 1, 1e5, 20, 16384
#: fewest units for which the drive start is chosen without being asked (:func:`choose_start`)
DRIVE_MIN_UNITS = 256
#: starts of the learner: Jennrich's diagonalisation of second derivatives, or the bends far from the origin
STARTS = ("jennrich", "drive")
#: points at which ``w1``'s direction is read (each costs 4·C·d queries)
DIRECTION_POINTS = 3
#: points beyond the hidden width: n = ⌈POINT_FACTOR·m⌉ + POINT_EXTRA
POINT_FACTOR, POINT_EXTRA = 1.25, 8
#: ... and at least this many (the per-neuron curve fits read them)
POINT_MIN = 64
#: K·C ≥ DIRECTION_FACTOR·m (+1 direction)
DIRECTION_FACTOR = 1.3
#: widths tried when the hidden width is not given (the first-derivative rank must show a drop below the grid)
FIRST_GUESS = 64
#: Gauss–Newton on the answers: rounds and LSMR iterations per round
GN_ROUNDS, GN_ITERATIONS = 8, 300
#: flops the default Gauss–Newton polish may spend (past it: one capped round, :func:`polish_settings`)
POLISH_WORK = 5e12
#: ... past it on coarse (float32) answers: short rounds with the Jacobian products in float32 (about five times
#: faster here). MiniLM layer 2's whole FFN from the drive start: one 20-iteration round took the residual from 2.9e-2
#: to 6.1e-3, where one float64 round of 57 iterations reached 1.4e-2 (early-stopped LSMR steps overshoot less; the
#: next rounds: 2.5e-3, 1.3e-3, 1.05e-3, 9.2e-4); a round that leaves more than half the residual doubles the next
#: one's iterations up to COARSE_GN_MAX_ITERATIONS (:data:`.polish.GROW_RATIO`): at most 20·3 + 40·5 = 260, about
#: 12 minutes of wall time for MiniLM's whole FFN at this machine's usual load (1–2 minutes a round; its check norm
#: 1.02e-3 after round 7 against the check's 1.19e-3, hence an eighth)
COARSE_GN_ROUNDS, COARSE_GN_ITERATIONS, COARSE_GN_MAX_ITERATIONS = 8, 20, 40
#: answers for the output layer and Gauss–Newton: enough rows for four times the unknowns (and at least
#: 2(d + 1): each neuron's first-layer row is read through the points alone)
ANSWER_FACTOR = 4.0
#: fresh length-1 inputs of the functional check
CHECK_QUERIES = 64
#: largest hidden width searched for when it is not given
MAX_WIDTH = 8192


def _answers(d: int, K: int, m: int) -> int:
    return max(2 * m + 8, 2 * (d + 1), math.ceil(ANSWER_FACTOR * SmoothFFN.unknowns(d, m, K) / K))


def polish_settings(d: int, K: int, m: int, richardson: int | None = None, rounds: int | None = None,
                    iterations: int | None = None, *, coarse: bool = False) -> tuple[int, int, int]:
    """``(richardson, rounds, iterations)`` with the unset ones chosen: the default polish (:data:`GN_ROUNDS` ×
    :data:`GN_ITERATIONS` LSMR iterations, each about ``4·N·m·(d + 2K)`` flops on N answers) when it costs at
    most :data:`POLISH_WORK`; past that (MiniLM's 384 → 1536 → 384: 9e10 flops an iteration) one round capped to
    the budget, and the derivatives extrapolated (``richardson`` 2), whose start is then what the result mostly
    rests on. On ``coarse`` answers (float32) the derivatives are always extrapolated over three levels
    (:func:`.derivatives.choose_extrapolated_step`), and past the budget the polish is :data:`COARSE_GN_ROUNDS`
    short rounds of :data:`COARSE_GN_ITERATIONS` in float32 (:func:`single_products`)."""
    per_iteration = _iteration_flops(d, K, m)
    big = _past_budget(d, K, m)
    if richardson is None:
        richardson = 3 if coarse else 2 if big else 1
    if big and coarse:
        return richardson, COARSE_GN_ROUNDS if rounds is None else rounds, \
            COARSE_GN_ITERATIONS if iterations is None else iterations
    if rounds is None:
        rounds = 1 if big else GN_ROUNDS
    if iterations is None:
        iterations = max(1, min(GN_ITERATIONS, int(POLISH_WORK / (per_iteration * rounds)))) if big else GN_ITERATIONS
    return richardson, rounds, iterations


def single_products(d: int, K: int, m: int, coarse: bool) -> bool:
    """Whether the polish's Jacobian products run in float32: on coarse answers past :data:`POLISH_WORK` only
    (the answers are float32 themselves; on float64 answers the polish goes down to 1e-15)."""
    return coarse and _past_budget(d, K, m)


def _past_budget(d: int, K: int, m: int) -> bool:
    """Whether the default polish (:data:`GN_ROUNDS` × :data:`GN_ITERATIONS`) would cost more than
    :data:`POLISH_WORK`."""
    return _iteration_flops(d, K, m) * GN_ROUNDS * GN_ITERATIONS > POLISH_WORK


def _iteration_flops(d: int, K: int, m: int) -> float:
    """Flops of one LSMR iteration of the polish on its answers (``4·N·m·(d + 1 + 2K)``)."""
    return 4.0 * _answers(d, K, m) * m * (d + 1 + 2 * K)


def plan(d: int, K: int, m: int, check: int = 0, richardson: int | None = None, *,
         coarse: bool = False, start: str | None = None) -> dict[str, int]:
    """Queries of each phase for hidden width m (the width search not counted); ``coarse``: float32 answers;
    ``start``: one of :data:`STARTS` or None (:func:`choose_start`)."""
    C = _directions(K, m)
    n = _points(m)
    richardson = polish_settings(d, K, m, richardson, coarse=coarse)[0]
    answers = _answers(d, K, m)
    E = COARSE_SECOND_DIRECTIONS if coarse else SECOND_DIRECTIONS
    if (start or choose_start(K, m, coarse)) == "drive":
        return {"step": step_queries(coarse), "width": 2 * C * n,
                "factors": 2 * PROBES + circles(_drive_directions(C)) * drive_samples(m),
                "directions": richardson * 4 * C * d * DIRECTION_POINTS, "answers": answers, "check": check}
    return {"step": step_queries(coarse), "width": 2 * C * n, "factors": richardson * 4 * C * E * n,
            "directions": richardson * 4 * C * d * DIRECTION_POINTS, "answers": answers, "check": check}


def smooth_estimate(s: Setting) -> QueryCount:
    """The smooth learner's queries at hidden width m by phase (:func:`plan`), exact when ``hidden`` and the
    activation are given; without ``hidden`` the width search adds its first-derivative grids (the ``width``
    phase at each doubling from :data:`FIRST_GUESS`), and without the activation its test adds 92; the drive
    start's circles aimed at units left open (:func:`.drive_start.aimed_circles`) may add up to
    :data:`.drive_start.MAX_AIMED` circles (the range's top)."""
    from attnprobe.learners.smooth_ffn.detect import test_queries

    m = s.needs("hidden", "an FFN estimate needs the number of hidden units m")
    K = s.outputs or 1
    parts = plan(s.d, K, m, check=CHECK_QUERIES if s.check else 0, coarse=s.coarse)
    total = sum(parts.values()) + (0 if s.option("activation") else test_queries())
    basis = ", ".join(f"{k} {v}" for k, v in parts.items()) + f" (K = {K} outputs per answer" + (
        "" if s.outputs else ", undeclared: declare the outputs K") + ")"
    aimed = MAX_AIMED * drive_samples(m) if choose_start(K, m, s.coarse) == "drive" else 0
    if aimed:  # circles aimed at units the drive start's circles left open (0 to MAX_AIMED of them)
        return QueryCount(total, total, total + aimed, basis + f"; up to {aimed} more on aimed circles")
    return QueryCount.exactly(total, basis)


def choose_start(K: int, m: int, coarse: bool) -> str:
    """The start when none is given: on coarse (float32) answers with at least :data:`DRIVE_MIN_UNITS` units the
    drive start when its circles ask no more than Jennrich's factor array (MiniLM layer 2's whole FFN: 458,752
    against 1,295,616 queries, where Jennrich's start failed, fresh error 0.51), else Jennrich's (its first 192
    units and the small random nets of the float32 rows pass with it; on few outputs the drive start's bends are
    weak: 8-16-8 tanh-GELU left 2 of 16 units out)."""
    if not coarse or m < DRIVE_MIN_UNITS:
        return "jennrich"
    C = _directions(K, m)
    jennrich = polish_settings(1, K, m, coarse=True)[0] * 4 * C * COARSE_SECOND_DIRECTIONS * _points(m)
    return "drive" if circles(_drive_directions(C)) * drive_samples(m) <= jennrich else "jennrich"


def drive_samples(m: int) -> int:
    """Answers on each circle of the drive start: a power of two, at least :data:`DRIVE_SAMPLES` per bend, at most
    :data:`DRIVE_MAX_SAMPLES`."""
    return min(DRIVE_MAX_SAMPLES, 1 << math.ceil(math.log2(DRIVE_SAMPLES * 2 * m)))


def _drive_directions(C: int) -> int:
    return max(C + DRIVE_EXTRA, DRIVE_DIRECTIONS)


def _directions(K: int, m: int) -> int:
    return max(2, math.ceil(DIRECTION_FACTOR * m / K) + 1)


def _rich_step(run, ask, h: float, coarse: bool, scale: float) -> tuple[float, float | None]:
    """The first step of a Richardson sequence and its estimated error (None: not measured): larger steps (less
    rounding) once the h² terms cancel — 3h on float64 answers, on coarse ones the step chosen for the
    extrapolation (:func:`.derivatives.choose_extrapolated_step`, in the ``step`` phase)."""
    if not coarse:
        return 3.0 * h, None
    with run.phase("step"):
        return choose_extrapolated_step(ask, ask.d, run.rng, scale)


def _factors(T: np.ndarray, m: int, rng: np.random.Generator, coarse: bool) -> tuple[np.ndarray, dict]:
    """The factors (:func:`.decompose.factors`); on coarse answers refined by least squares, where two columns
    that land on one neuron leave one out, so up to :data:`COARSE_ATTEMPTS` draws of the mixtures are tried until
    none is left out (the fewest, then the smallest residual, kept)."""
    if not coarse:
        return factors(T, m, rng)
    best = None
    for attempt in range(COARSE_ATTEMPTS):
        A, sep = factors(T, m, rng, sweeps=COARSE_SWEEPS)
        A = A[:, distinct_columns(A)]
        sep.update(left_out=m - A.shape[1], factor_attempts=attempt + 1)
        if best is None or (sep["left_out"], sep["core_residual"]) < (best[1]["left_out"], best[1]["core_residual"]):
            best = (A, sep)
        if not sep["left_out"]:
            break
    return best


def _drive_factors(run, ask, U: np.ndarray, m: int, scale: float) -> tuple[np.ndarray, dict] | None:
    """The drive start's factors on the learner's C directions (:mod:`.drive_start`; random directions added up to
    :func:`_drive_directions` for more circles): the m best supported, ``left_out`` the neurons it did not find;
    None when the answers do not grow linearly far from the origin (:func:`.drive_start.growth_gap`: a norm in
    front of the FFN, say), where no circle would show its bends."""
    C, d = U.shape
    radius = DRIVE_RADIUS * scale * math.sqrt(d)
    with run.phase("factors"):
        gap = growth_gap(ask, d, radius, run.rng)
        if not gap <= DRIVABLE:
            return None
        extra = run.rng.standard_normal((_drive_directions(C) - C, d))
        extra /= np.linalg.norm(extra, axis=1, keepdims=True)
        A, sep = drive_factors(ask, np.concatenate([U, extra]), C, radius, drive_samples(m))
    A = A[:, :m]
    sep.update(start="drive", left_out=m - A.shape[1], growth_gap=gap)
    return A, sep


def _points(m: int) -> int:
    return max(POINT_MIN, math.ceil(POINT_FACTOR * m) + POINT_EXTRA)


def extract_smooth_ffn(oracle, *, seed: int = 0, activation: str | None = None, hidden: int | None = None,
                       bias: bool = True, scale: float = 1.0, check: bool = True, progress=None,
                       polish_rounds: int | None = None, polish_iterations: int | None = None,
                       richardson: int | None = None, start: str | None = None) -> object:
    """Recover ``y = W2 σ(W1 x + b1) + b2`` (σ GELU, tanh-GELU or SiLU; K ≥ 1 outputs) from length-1 queries.

    ``activation``: one of :data:`~attnprobe.models.smooth_ffn.ACTIVATIONS` or None (the best fit of all);
    ``hidden``: the hidden width m if known (else read off the first derivatives' rank, doubling the grid until
    it shows); ``bias``: learn ``b1, b2`` (else both are 0); ``scale``: the inputs' standard deviation per
    coordinate (points are drawn N(0, scale²)); ``polish_rounds`` / ``polish_iterations``: Gauss–Newton rounds on
    the answers and LSMR iterations per round; ``richardson``: 1, 2 or 3 steps for the factors' and directions'
    differences (Richardson's extrapolation: a start closer to the answers for ``richardson − 1`` more times
    their queries; the first derivatives' own extrapolation was measured not to help). Unset, the three follow
    :func:`polish_settings` (the default polish, or on wide FFNs a capped one after extrapolated derivatives).
    ``start``: how the factors are read (:data:`STARTS`): Jennrich's diagonalisation of second derivatives near
    the origin, or (``drive``) the bends of the answers on circles far from it (:mod:`.drive_start`); unset,
    :func:`choose_start` picks one, and on coarse answers a Jennrich start that leaves neurons out is followed by
    the drive start.
    The result is unique up to the order of the neurons.
    """
    check_option(activation, "activation", (None, *ACTIVATIONS))
    check_option(start, "start", (None, *STARTS))
    check_int(hidden, "hidden", min_value=1, allow_none=True)
    check_int(polish_rounds, "polish_rounds", min_value=0, allow_none=True)
    check_int(polish_iterations, "polish_iterations", min_value=1, allow_none=True)
    check_int(richardson, "richardson", min_value=1, max_value=3, allow_none=True)
    run, ask, h, fd_error = start_run(oracle, seed=seed, check=check, progress=progress, scale=scale,
                                      check_queries=CHECK_QUERIES)
    d, rng = oracle.d, run.rng
    K = ask.outputs
    coarse = coarse_answers(oracle)
    h_rich, rich_error = _rich_step(run, ask, h, coarse, scale)
    m_plan = hidden or FIRST_GUESS
    # richardson: given or chosen
    run.plan(sum(plan(d, K, m_plan, richardson=richardson, coarse=coarse, start=start).values()),
             f"the smooth FFN learner at d={d}, K={K}, m={m_plan}",
             at_least=hidden is None)
    with run.phase("width"):
        w = search_width(run, ask, scale=scale, h=h, hidden=hidden, first_guess=FIRST_GUESS, max_width=MAX_WIDTH,
                         grid=lambda g: (_directions(K, g), _points(g)), units=lambda r: r,
                         replan=lambda g: sum(plan(d, K, g, richardson=richardson, coarse=coarse,
                                                   start=start).values()),
                         what="smooth FFN")
    m, drop, U, X, D1 = w.m, w.drop, w.U, w.X, w.D1
    C, n = _directions(K, m), _points(m)  # the grid the width search ended on may be larger than m needs
    U, D1 = U[:C], D1[:, :C, :]  # every point's first derivatives feed the curve fits; n of them the factors
    if K * C < m or n < m:
        raise ConfigError(f"hidden width {m} needs K·C ≥ m and n ≥ m; got K·C = {K * C}, n = {n}", param="hidden")
    richardson, polish_rounds, polish_iterations = polish_settings(d, K, m, richardson, polish_rounds,
                                                                   polish_iterations, coarse=coarse)
    asked, start = start, start or choose_start(K, m, coarse)
    p = plan(d, K, m, richardson=richardson, coarse=coarse, start=start)
    run.report(run.queries + sum(p.values()) - p["width"] - p["step"])
    E = COARSE_SECOND_DIRECTIONS if coarse else SECOND_DIRECTIONS
    A, sep, start = _start_factors(run, ask, U, X[:n], m=m, scale=scale, start=start, asked=asked, coarse=coarse,
                                   E=E, steps=(h if richardson == 1 else h_rich, richardson))
    Ap = np.linalg.pinv(A)
    w2_dirs, _ = split_factors(A, K, C)
    with run.phase("directions"):
        Xs = scale * rng.standard_normal((DIRECTION_POINTS, d))
        Td = richardson_differences(lambda s: second_derivatives(ask, Xs, U, np.eye(d), s),
                                    h if richardson == 1 else h_rich, richardson)  # (K, C, d, points)
    Z = np.einsum("ma,adp->pmd", Ap, Td.reshape(K * C, d, DIRECTION_POINTS))
    W1_dirs = directions(Z)
    p = Ap @ D1.reshape(K * C, -1)
    t = W1_dirs @ X.T
    candidates = (activation,) if activation else tuple(ACTIVATIONS)
    name, fit, scores = pick_activation(p, t, bias, rng, candidates)
    act = get_activation(name)
    W1 = fit["lam"][:, None] * W1_dirs
    b1 = fit["b"] if bias else np.zeros(W1.shape[0])
    unknowns = SmoothFFN.unknowns(d, m, K, bias)
    with run.phase("answers"):
        N = max(2 * m + 8, 2 * (d + 1), math.ceil(ANSWER_FACTOR * unknowns / K))
        Xa = scale * rng.standard_normal((N, d))
        Ya = ask(Xa)
    W2, b2 = output_layer(Xa, Ya, W1, b1, act, bias)
    single = single_products(d, K, m, coarse)  # short float32 rounds, growing while they do little
    (W1, b1, W2, b2), history, used = gauss_newton(
        Xa, Ya, (W1, b1, W2, b2), act, bias, rounds=polish_rounds, iterations=polish_iterations, single=single,
        grow_to=max(COARSE_GN_MAX_ITERATIONS, polish_iterations) if single else None)
    model = SmoothFFN(W1, b1, W2, b2, name)
    details = {"seed": seed, "bias": bool(bias), "outputs": K, "hidden": int(m), "width_drop": drop,
               "activation": name, "activation_detected": activation is None, "activation_fit": scores,
               "step": h, "step_error": fd_error, "richardson": richardson, "coarse_answers": coarse,
               "extrapolated_step": h_rich, "extrapolated_step_error": rich_error,
               "directions_C": C, "second_directions_E": E,
               "points": n, "answers": N, "start": start, **sep, "curve_fit_worst": float(np.max(fit["res"])),
               "polish_residuals": history, "polish_iterations": used, "queries_per_unknown": run.queries / unknowns}
    notes = [f"neurons are recovered up to their order only (a smooth {name} has no scale or sign symmetry)"]
    check_model = model if ask.vector else _Scalar(model)
    return run.finish(model, unknowns=unknowns, details=details, notes=notes, check_model=check_model,
                      hint=f" (a smooth FFN of this form with {name})")


def _start_factors(run, ask, U, X, *, m, scale, start, asked, coarse, E, steps):
    """The factors ``w2_i ⊗ U w1_i`` (K·C, m) and their separation details, read as ``start`` says: far from the
    origin (:mod:`.drive_start`; refused when asked for and the answers do not grow linearly) or by Jennrich's
    diagonalisation of second derivatives at the points ``X`` (``steps``: the difference step and Richardson's
    levels), which on coarse answers is followed by the drive start when it leaves neurons out. Returns
    ``(A, sep, start)`` with the start actually used."""
    driven = _drive_factors(run, ask, U, m, scale) if start == "drive" else None
    if start == "drive" and driven is None and asked == "drive":
        raise ConfigError("the answers do not grow linearly far from the origin (a norm in front of the FFN?), so "
                          "the drive start cannot read its bends; use start='jennrich'", param="start")
    if driven is not None:
        return driven[0], driven[1], start
    rng, K, C = run.rng, ask.outputs, U.shape[0]
    with run.phase("factors"):
        V = rng.standard_normal((E, U.shape[1]))
        V /= np.linalg.norm(V, axis=1, keepdims=True)
        T = richardson_differences(lambda s: second_derivatives(ask, X, U, V, s), *steps)
    A, sep = _factors(T.reshape(K * C, E, X.shape[0]), m, rng, coarse)
    if start == "drive":
        start, sep["drive_refused"] = "jennrich", "the answers do not grow linearly far from the origin"
    elif coarse and sep.get("left_out"):  # Jennrich's start blended neurons: read them far from the origin
        driven = _drive_factors(run, ask, U, m, scale)
        if driven is not None:
            A, sep = driven[0], {**sep, **driven[1], "jennrich_left_out": sep["left_out"]}
    return A, sep, start


class _Scalar:
    """A one-output model answering ``(B,)`` like a scalar oracle."""

    def __init__(self, model) -> None:
        self.model = model

    def __call__(self, X):
        return self.model(X)[:, 0]
