"""``extract_ffn``: a short driver over the phases of the critical-point FFN learner.

Phases (each charged to its own query count): ``odd_part`` (bias-free nets: ``f(x) − f(−x) = vᵀx``, 2d
queries unless v is given), ``kink_search`` (:mod:`.kinks`), ``gradients`` and ``re_measured`` (:mod:`.regions`),
then orientations (:mod:`.orientation`, no queries) and, for coarse answers, ``polish`` (:mod:`.fit`) and, when the
polished neurons miss answers, neurons found in the polish answers (:mod:`.missing`, no queries), else
``repair_line`` (:mod:`.repair`) and ``more_lines`` (:mod:`.more_lines`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields, replace

import numpy as np

from attnprobe._validation import check_float, check_int, check_option
from attnprobe.errors import BudgetExceededError, ConfigError, UnidentifiableError
from attnprobe.learners.ffn.answers import Answers
from attnprobe.learners.ffn.fit import (POLISH_MAX_UNKNOWNS, POLISH_ROUNDS, Neurons, fit_output_bias, jump_neurons,
                                        linear_rest_neurons, polish, polish_answers, polish_rounds)
from attnprobe.learners.ffn.kinks import Segment, SearchSettings, search_kinks
from attnprobe.learners.ffn.missing import faint_last, missing_neuron_candidates, tidy
from attnprobe.learners.ffn.more_lines import MAX_LINES, SAME_NEURON_COS, candidate_sets, needs_another_line
from attnprobe.learners.ffn.orientation import Orientation, closest_signs, orientation_matrix, solve_signs
from attnprobe.learners.ffn.regions import PROBE_FRACTION, Regions, RefineSettings, hyperplane_normals
from attnprobe.learners.ffn.repair import contradicted, failed_side_checks, repaired_set, sub_segment, suspect_spans
from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.core.skeleton import Run
from attnprobe.models.ffn import ReLUNet

#: answers agree with a line if they differ by less than this many roundings of the largest answer seen
#: (float64 answers / coarser answers: float32's real rounding is a few units, and 64 hide weak kinks)
NOISE_FACTOR, COARSE_NOISE_FACTOR = 64.0, 8.0
#: a kink is merged away when its gradient jump is below this many roundings over the probe radius
MERGE_NOISE, COARSE_MERGE_NOISE = 64.0, 2.0
SIGN_TIME_LIMIT = 5.0
#: coarse answers: times the orientation is solved again on the polished neurons (and flipped ones polished)
SETTLE_ROUNDS = 3
#: coarse answers: the weakest neurons whose orientation is tried the other way when the answers are missed
FLIP_TRIES = 6
#: coarse answers: neurons found in the polish answers (:mod:`.missing`) at most, one after another
MAX_FOUND_IN_ANSWERS = 3
#: ... while each lowers the largest miss of the answers by at least this share
FOUND_GAIN = 0.1
#: least-squares work of one polish round (rows × unknowns²) up to which it is tried: a step fits the candidates
#: and polishes three (biased float32 d = 16, m = 32: 6.4e8, 1.8 s; d = 64, m = 16: 4.5e9, 7.3 s, measured with
#: the other core busy); d = 784 would factor a 31,400 × 7,851 span
FOUND_MAX_WORK = 1e10
#: coarsest answer rounding the kink search resolves (float32's 1.2e-7 works; float16's 9.8e-4 does not)
FINEST_EPS = 1e-6


def require_fine_answers(oracle, what: str) -> None:
    """Refuse answers coarser than :data:`FINEST_EPS` (float16, bfloat16): the kinks drown in rounding."""
    if oracle.eps > FINEST_EPS:
        raise ConfigError(f"{what} needs answers rounded at most at {FINEST_EPS:g} (float32 or better); these are "
                          f"rounded at {oracle.eps:.2g} ({oracle.precision}), where kinks drown in rounding")


@dataclass(frozen=True)
class FFNOptions:
    """The FFN learner's settings, validated on construction (every error names its parameter).

    * ``bias``: learn ``w_oᵀReLU(Aᵀx + b) + c`` (default, searched in the lifted space) or the paper's bias-free
      ``w_oᵀReLU(Aᵀx)`` (``False``; implied when ``v`` is given);
    * ``noise_factor``: answers within this many roundings of the largest answer count as "on a line" (default
      64 for float64 answers, 8 for coarser ones, whose pieces between kinks are then also checked against a
      least-squares line through all their answers);
    * ``min_width``: search intervals shorter than this (in units of the search line; default
      ``max(1e-9, 1024·eps)``) are taken to hold one kink;
    * ``min_jump`` / ``min_region``: a kink whose gradient jump is below ``min_jump`` times the largest (or below
      its finite-difference noise), and a region narrower than ``min_region``, are merged away;
    * ``probe_fraction``: how far towards the nearest kink along the line the gradient probes reach;
    * ``refine``: ``"auto"`` re-measures regions whose probes crossed a recovered hyperplane or broke Euler's
      identity, ``"always"`` every region once more, ``"never"`` none;
    * ``chebyshev``: regions the search line only grazes are re-measured at the deepest point of their cell;
    * ``polish``: refit all neurons by least squares on ``3·D·m`` fresh random inputs (``"auto"``: only when
      answers are coarser than float64; ``"always"``, ``"never"``);
    * ``sign_time_limit``: seconds for the 0/1 program that fixes neuron orientations;
    * ``reach``: biased nets: the search line reaches ``reach`` times its own scale (kinks farther out are missed);
    * ``hidden``: the hidden width if known: neurons the answers cannot show are then reported as unidentifiable;
    * ``check_count``: fresh inputs of the functional check.
    """

    bias: bool | None = None
    noise_factor: float | None = None
    min_width: float | None = None
    min_jump: float = 1e-6
    min_region: float = 1e-7
    probe_fraction: float = PROBE_FRACTION
    refine: str = "auto"
    chebyshev: bool = True
    polish: str = "auto"
    sign_time_limit: float = SIGN_TIME_LIMIT
    reach: float = 1e6
    hidden: int | None = None
    check_count: int = 64

    def __post_init__(self) -> None:
        check_option(self.refine, "refine", ("auto", "always", "never"))
        check_option(self.polish, "polish", ("auto", "always", "never"))
        check_option(self.bias, "bias", (None, True, False))
        check_option(self.chebyshev, "chebyshev", (True, False))
        check_float(self.noise_factor, "noise_factor", min_value=0, strict_min=True, allow_none=True)
        check_float(self.min_width, "min_width", min_value=0, strict_min=True, allow_none=True)
        check_float(self.min_jump, "min_jump", min_value=0, max_value=1)
        check_float(self.min_region, "min_region", min_value=0, max_value=1)
        check_float(self.probe_fraction, "probe_fraction", min_value=0, max_value=1, strict_min=True)
        if self.probe_fraction >= 1:
            raise ConfigError(f"The 'probe_fraction' parameter must lie in (0, 1); got {self.probe_fraction}",
                              param="probe_fraction")
        check_float(self.sign_time_limit, "sign_time_limit", min_value=0, strict_min=True)
        check_float(self.reach, "reach", min_value=1, strict_min=True)
        check_int(self.hidden, "hidden", min_value=1, allow_none=True)
        check_int(self.check_count, "check_count", min_value=1)

    @classmethod
    def build(cls, options: "FFNOptions | None", settings: dict) -> "FFNOptions":
        """``options`` with ``settings`` (keyword arguments of :func:`extract_ffn`) applied; unknown names are
        refused with the list of known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ConfigError(f"unknown FFN option(s) {', '.join(map(repr, unknown))}; "
                              f"known: {', '.join(sorted(known))}",
                              param=unknown[0])
        return replace(options or cls(), **settings)


def extract_ffn(oracle, *, seed: int = 0, v: np.ndarray | None = None, options: FFNOptions | None = None,
                check: bool = True, progress=None, **settings) -> Extraction:
    """Recover a ReLU network ``x ↦ w_oᵀReLU(Aᵀx + b) + c`` (one or K outputs) from length-1 value queries.

    Critical points as in Carlini–Jagielski–Mironov (2020) and Jagielski et al. (2020), adapted: the kinks are
    found once on one line (shared by every output), each linear region's gradient gives every output's layer,
    and the neurons' orientations come from the network's linear part. Bias-free (``bias=False``, the ``A_FFN``
    of Sec. 4.1) the odd part ``v = A w_o`` costs 2d queries unless given (the transformer passes it).
    ``settings`` are :class:`FFNOptions` fields (validated). Neurons no output sees (dead, or zero output weight
    everywhere) are invisible to any query: with ``hidden`` given they are reported as unidentifiable.
    The model has unit neuron directions (``(a_k, b_k)`` with biases) and is unique up to neuron permutation.
    """
    opts = FFNOptions.build(options, settings)
    require_fine_answers(oracle, "the ReLU-network learner")
    lifted = opts.bias if opts.bias is not None else v is None
    if lifted and v is not None:
        raise ConfigError("v (the odd part A w_o) describes a bias-free network; drop v or set bias=False", param="v")
    run = Run(oracle, "ffn", seed=seed, check=check, check_lengths=(1,), check_per_length=opts.check_count,
              progress=progress)
    d = oracle.d
    dim = d + int(lifted)
    run.plan((2 * d if not lifted and v is None else 0) + 14 + 2 * (dim + 1),
             f"the FFN learner at d={d} (3 queries per search point, {dim + 1} per linear region)", at_least=True)
    ask = Answers(oracle, lifted=lifted, rng=run.rng, reserve=run.check_queries)
    coarse = oracle.eps > 1e-12
    if not lifted:
        with run.phase("odd_part"):
            v = _odd_part(ask, d) if v is None else _given_v(v, d)
    segs = _segments(d, lifted, run.rng, opts.reach, _line_scale(d, lifted, coarse))
    state = _search_and_measure(run, ask, segs, opts, coarse)
    regions = state.pop("regions")
    J, where = regions.jumps()
    if lifted:  # the two far ends of the line: their gradients sum to Σ_k w_k a_k (+ 2c in the s entry)
        v = (regions.G[0] + regions.G[-1])[:, :d]
    settles = coarse and opts.polish != "never" and _settles(ask, J.shape[0])
    neurons, orient, rest, notes = _orient(J, where, segs, v, opts, oracle.eps, lifted, provisional=settles)
    if lifted:
        neurons = replace(neurons, c=fit_output_bias(neurons, regions.XR, regions.F0))
    neurons, polished, fit_data = _polish_phase(run, ask, neurons, opts, coarse)
    if settles:
        neurons, orient, rest, notes = _settle(neurons, orient, v, opts, ask, fit_data)
    # the polish may leave a network with a wrong neuron as it was (no round lowers the misfit): such a network
    # is searched again like one the polish moved
    refits = fit_data is not None and ask.dim * neurons.dirs.shape[1] <= POLISH_MAX_UNKNOWNS
    if coarse and refits and needs_another_line(orient.exact, _consistency(neurons, ask), oracle.eps):
        more = _more_lines(run, ask, (J, where, segs), (neurons, orient, rest), v, opts, fit_data,
                           noise=regions.jump_noise(oracle.eps))
        J, (neurons, orient, rest), state["more_lines"] = more
    model = _model(neurons, d, lifted, ask.vector)
    m_found = J.shape[0]
    notes += _unidentifiable_notes(opts.hidden, m_found)
    if "more_lines" in state and orient.exact:
        notes = [n for n in notes if not n.startswith("neuron orientations not pinned down")]
    if state.get("more_lines", {}).get("stopped") == "budget":
        notes.append("the neurons found do not explain every answer, and the budget had no room for another search "
                     "line (raise the budget to let the learner look again)")
    details = {
        "seed": seed, "bias": lifted, "outputs": ask.outputs, "min_width": state.pop("min_width"),
        "noise_factor": state.pop("noise_factor"), "probe_fraction": opts.probe_fraction, "refine": opts.refine,
        "polished": polished, "neurons_found": int(m_found),
        "neurons_unidentifiable": None if opts.hidden is None else max(0, opts.hidden - m_found),
        "kinks_per_segment": [len(s.kinks) for s in segs], **state, "regions": len(regions.regs),
        "orientation": orient.how, "orientation_exact": bool(orient.exact),
        "orientation_residual": float(np.linalg.norm(rest) / max(np.linalg.norm(v), 1e-300)),
        "queries_per_dm": run.queries / (d * max(m_found, 1)),
        "self_consistency": _consistency(neurons, ask),
    }
    unknowns = ReLUNet.unknowns(d, max(m_found, 1), ask.outputs, lifted)
    return run.finish(model, unknowns=unknowns, details=details, notes=notes,
                      hint=" (a two-layer ReLU network of this form" + (")" if lifted else " without biases)"))


def _odd_part(ask: Answers, d: int) -> np.ndarray:
    """``f(x) − f(−x) = vᵀx`` for a bias-free network: v of every output (K, d) from 2d queries."""
    I = np.eye(d)
    y = ask.vectors(np.concatenate([I, -I]))
    return (y[:d] - y[d:]).T


def _given_v(v, d: int) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    v = v.reshape(1, -1) if v.ndim == 1 else v.T
    if v.shape[1] != d:
        raise ConfigError(f"The 'v' parameter must have length d = {d} (or shape (d, K)); got {v.shape}", param="v")
    return v


def _segments(d: int, lifted: bool, rng: np.random.Generator, reach: float, scale: float = 1.0) -> list[Segment]:
    """Search segments that together meet every neuron's hyperplane once.

    Bias-free: ``p + t q`` and ``q + t p`` (p ⟂ q) cover every direction up to sign. Biased (lifted space): the
    input line ``x = p + τq`` as two straight segments ``(−q, δ) → (p, 1) → (q, δ)`` of ``(x, s)``, δ = 1/reach,
    with ``‖p‖ = ‖q‖ = scale``.
    """
    if d == 1 and not lifted:  # directions ±1 only: the segment through 0 sees the single hyperplane x = 0
        return [Segment(np.zeros(1), np.ones(1))]
    Q, _ = np.linalg.qr(rng.standard_normal((d, 2))) if d > 1 else (np.array([[0.0, 1.0]]), None)
    p, q = scale * Q[:, 0], scale * Q[:, 1]
    if not lifted:
        return [Segment(p, q), Segment(q, p)]
    delta = 1.0 / reach
    mid, left, right = np.r_[p, 1.0], np.r_[-q, delta], np.r_[q, delta]
    return [Segment(0.5 * (left + mid), 0.5 * (mid - left)), Segment(0.5 * (mid + right), 0.5 * (right - mid))]


def _line_scale(d: int, lifted: bool, coarse: bool) -> float:
    """Norm of the search line's points ``p`` and ``q`` (biased nets on float64 answers: √d, the norm of a
    standard Gaussian input). A hyperplane ``aᵀx + b = 0`` meets the line ``p + τq`` at ``τ = −(aᵀp + b)/aᵀq``; on a
    unit line ``aᵀq ~ ‖a‖/√d`` against a bias of order ‖a‖, so the kinks crowd near the line's far ends (τ ~ √d),
    where the regions are thin and each is measured twice (784 inputs: 1–6 of 18 regions, 28–45 of 66); at norm √d
    they spread as on a bias-free net. Float32 answers keep the unit line (their search is tuned to it)."""
    return float(np.sqrt(d)) if lifted and not coarse else 1.0


def _noise_factor(opts: FFNOptions, coarse: bool) -> float:
    """Roundings of the largest answer within which answers count as on a line (:data:`NOISE_FACTOR`)."""
    return opts.noise_factor or (COARSE_NOISE_FACTOR if coarse else NOISE_FACTOR)


def _search_and_measure(run: Run, ask: Answers, segs, opts: FFNOptions, coarse: bool) -> dict:
    """Kinks on every segment, then the gradient of every linear region between them (re-measured where
    needed). Returns the regions and what the phases saw."""
    eps = run.oracle.eps
    noise_factor = _noise_factor(opts, coarse)
    min_width = opts.min_width or max(1e-9, 1024 * eps)
    with run.phase("kink_search"):
        end = 0.5 / opts.reach if ask.lifted else 2.0 / 64  # lifted: the ends' outer stencils stay at s > 0
        settings = SearchSettings(noise_factor, eps, min_width, coarse, end, zoom=not coarse, pin=not coarse)
        rounds = search_kinks(ask, segs, settings, run.rng)
    tight = sum(s.unresolved for s in segs)
    dim = ask.dim
    run.report(run.queries + (dim + 1) * (sum(len(s.kinks) for s in segs) + len(segs)))
    U = random_orthogonal(dim, run.rng)
    with run.phase("gradients"):
        regions = Regions(segs, ask, U, opts.probe_fraction)
    run.report(run.queries)
    tiny = regions.merge_tiny(opts.min_region)
    merge_noise = COARSE_MERGE_NOISE if coarse else MERGE_NOISE
    dropped = regions.merge_small_jumps(opts.min_jump, merge_noise, eps)
    with run.phase("re_measured"):
        stats = regions.refine(RefineSettings(opts.refine == "always", opts.refine == "never", opts.chebyshev), eps)
    # a split point next to a kink whose region's first gradient was bad shows its ~0 jump only once re-measured
    dropped += regions.merge_small_jumps(opts.min_jump, merge_noise, eps)
    return {"regions": regions, "min_width": min_width, "noise_factor": noise_factor, "search_rounds": rounds,
            "kinks_at_min_width": tight, "kinks_dropped_min_jump": dropped, "tiny_regions_merged": tiny, **stats}


def _orient(J, where, segs, v, opts: FFNOptions, eps: float, lifted: bool, *, provisional: bool = False):
    """Neurons from the jumps, oriented by the linear part v (K, d). When no ±1 orientation reproduces v
    (antiparallel neurons, or none found in time), pairs of extra neurons carry the linear rest ``½ρᵀx``;
    ``provisional`` (coarse answers, whose jumps are known to ~1e-3 only): the ±1 vector closest to v instead,
    to be settled on the polished neurons (:func:`_settle`)."""
    K, d = v.shape
    dim = d + int(lifted)
    if J.shape[0] == 0 and lifted:
        raise UnidentifiableError("no kink on the search line: the answers are affine in the input, so no neuron is "
                                  "visible (all dead, or zero output weights)")
    if J.shape[0] == 0:  # bias-free: the odd part alone (extra neurons below); the check judges the result
        N, C = np.zeros((dim, 0)), np.zeros((0, K))
    else:
        N, C = jump_neurons(J, hyperplane_normals(J), np.array([segs[si].direction for si in where]).T)
    M = orientation_matrix(N, C, d)
    orient = _signs(M, v, opts, eps, closest=provisional)
    dirs, weights = N * orient.signs[None, :], C
    rest = v - (M @ orient.signs).reshape(K, d)
    neurons = Neurons(dirs, weights, np.zeros(K if lifted else 0))
    if not orient.exact and not provisional:
        neurons, notes = _with_linear_rest(neurons, rest, v, orient, dim)
        return neurons, orient, rest, notes
    return neurons, orient, rest, []


def _with_linear_rest(neurons: Neurons, rest, v, orient, dim: int) -> tuple[Neurons, list[str]]:
    """When no ±1 orientation reproduces v: pairs of extra neurons carry the linear rest ``½ρᵀx``, and a note says
    so. Returns the neurons and the notes."""
    d = v.shape[1]
    extra_dirs, extra_w = linear_rest_neurons(rest, dim, d, tiny=0.0)
    neurons = Neurons(np.concatenate([neurons.dirs, extra_dirs], axis=1),
                      np.concatenate([neurons.weights, extra_w]), neurons.c)
    note = (f"neuron orientations not pinned down ({orient.how}): extra neuron pairs carry the linear part ½ρᵀx "
            f"with ‖ρ‖/‖v‖ = {np.linalg.norm(rest) / max(np.linalg.norm(v), 1e-300):.2e}; the network computes the "
            "same function but its neurons are not the target's")
    return neurons, [note]


def _signs(M: np.ndarray, v: np.ndarray, opts: FFNOptions, eps: float, closest: bool = False):
    """Orientations ``ε`` with ``M ε ≈ vec(v)`` (:func:`solve_signs`; coarse answers accept the closest ±1 vector
    within a quarter of the weakest column). ``closest``: when none fits, the ±1 vector closest to v in L1 (not
    exact)."""
    col = np.linalg.norm(M, axis=0)
    scale_v = max(float(np.linalg.norm(v)), float(np.sum(col)), 1e-300)
    coarse = eps > 1e-12
    tol = max(1e-6 if coarse else 1e-8, 1e4 * eps) * scale_v
    loose = 0.25 * float(col.min()) if coarse and col.size else 0.0
    orient = solve_signs(M, v.reshape(-1), tol, opts.sign_time_limit, loose=loose)
    if orient.exact or not closest or M.shape[1] == 0:
        return orient
    near = closest_signs(M, v.reshape(-1), opts.sign_time_limit)
    return orient if near is None else Orientation(near, False, "closest ±1 vector (provisional)")


def _settles(ask: Answers, m: int) -> bool:
    """Whether m neurons' orientations are settled on the polished neurons (:func:`_settle`): while their polish may
    run until settled (:func:`polish_rounds`); larger networks keep the jumps' orientation (each settling and flip
    is a whole polish: at d = 64, m = 16 the search took 53 s instead of 16 s)."""
    n_fit = polish_answers(ask.dim, m, ask.lifted)
    return polish_rounds(n_fit, ask.dim * m) >= POLISH_ROUNDS


def _settle(neurons: Neurons, orient, v, opts: FFNOptions, ask: Answers, fit_data):
    """Coarse answers: orientations fixed on the polished neurons. The jumps of thin regions and weak neurons are
    off by up to ~0.1 rad on float32 answers, too far for the ±1 vector that reproduces v to stand out; the
    polished columns are ~1e-5 off, so the orientation is solved again on them, flipped neurons are polished once
    more (a flip changes the activation pattern), up to :data:`SETTLE_ROUNDS` times. When still no ±1 vector
    fits, extra neuron pairs carry the linear rest (as :func:`_orient`). ``fit_data``: the polish answers (None:
    no polish, the orientation is solved once more on the neurons as they are). Returns
    ``(neurons, orientation, rest, notes)``."""
    d = ask.d
    m = neurons.dirs.shape[1]
    for _ in range(SETTLE_ROUNDS):
        M = orientation_matrix(neurons.dirs, neurons.weights, d)
        orient = _signs(M, v, opts, ask.oracle.eps)
        near = closest_signs(M, v.reshape(-1), opts.sign_time_limit) if orient.exact else None
        if near is not None and np.linalg.norm(M @ near - v.reshape(-1)) < np.linalg.norm(M @ orient.signs
                                                                                          - v.reshape(-1)):
            orient = Orientation(near, True, "closest ±1 vector (0/1 program)")
        if not orient.exact or np.all(orient.signs > 0):
            break
        neurons = replace(neurons, dirs=neurons.dirs * orient.signs[None, :])
        if fit_data is not None:
            neurons = _repolish(neurons, ask, fit_data)
    if orient.exact and fit_data is not None:
        neurons = _flip_weak(neurons, ask, fit_data)
    rest = _linear_rest(neurons, v, d)
    if orient.exact:
        return neurons, Orientation(np.ones(m), True, orient.how + ", on the polished neurons"), rest, []
    neurons, notes = _with_linear_rest(neurons, rest, v, orient, ask.dim)
    if fit_data is not None:
        neurons, _ = polish(neurons, *fit_data, ask.lifted)
    return neurons, orient, rest, notes


def _linear_rest(neurons: Neurons, v, d: int) -> np.ndarray:
    """The part of the linear part v (K, d) that the neurons, each oriented as it is, leave unexplained."""
    M = orientation_matrix(neurons.dirs, neurons.weights, d)
    return v - (M @ np.ones(neurons.dirs.shape[1])).reshape(v.shape)


def _flip_weak(neurons: Neurons, ask: Answers, fit_data) -> Neurons:
    """A neuron whose linear part ``c·n`` is within v's rounding (the weakest ones) cannot be oriented from v; a
    wrong orientation shows as answers the polished network misses. While it misses some, each of the
    :data:`FLIP_TRIES` weakest neurons is flipped and polished in turn, and a flip kept when it halves the miss."""
    eps = ask.oracle.eps
    miss = _consistency(neurons, ask)
    weak = np.argsort(np.linalg.norm(neurons.weights, axis=1) * np.linalg.norm(neurons.dirs[:ask.d], axis=0))
    for k in weak[:FLIP_TRIES]:
        if not needs_another_line(True, miss, eps):
            break
        dirs = neurons.dirs.copy()
        dirs[:, k] *= -1
        trial = _repolish(replace(neurons, dirs=dirs), ask, fit_data)
        got = _consistency(trial, ask)
        if got < 0.5 * miss:
            neurons, miss = trial, got
    return neurons


def _repolish(neurons: Neurons, ask: Answers, fit_data) -> Neurons:
    """Neurons whose orientation changed, polished again on the polish answers ``fit_data`` (the output bias refitted
    first when lifted: a flip changes every activation pattern)."""
    if ask.lifted:
        neurons = replace(neurons, c=fit_output_bias(neurons, *fit_data))
    return polish(neurons, *fit_data, ask.lifted)[0]


def _consistency(neurons: Neurons, ask: Answers) -> float:
    """Largest miss of the neurons' answers over every answer asked so far, relative to the largest answer."""
    Zs, Ys = ask.all()
    return float(np.max(np.abs(neurons.values(Zs) - Ys)) / max(ask.top, 1e-300))


def _more_lines(run: Run, ask: Answers, first, fitted, v, opts: FFNOptions, fit_data, *, noise):
    """Coarse answers whose first line left a neuron missing or wrong: first the neurons found in the polish
    answers (:func:`_found_in_answers`, no query; kept when they explain every answer), then a repair line
    (:func:`_repair_line`, searched only where the first line's neurons are contradicted; ``noise``: their jumps'
    relative errors), then, when its neurons do not explain every answer either, as without it (:mod:`.more_lines`):
    up to :data:`MAX_LINES` − 1 more lines, and after each keep the neuron set whose polished network best explains
    every answer (a set that explains them all beats one that does not, then one that orients exactly). Stops when
    the answers are explained or the budget has no room for another line. Returns
    ``(J, (neurons, orientation, rest), summary)``."""
    J, where, segs = first
    found = _found_in_answers(run, ask, _jump_columns(fitted[0], J.shape[0]), v, opts, fit_data)
    if found is not None:  # no query: the polish answers held the neurons the line missed
        neurons, orient, rest, J_added = found
        k = J_added.shape[0]
        return np.concatenate([J, J_added]), (neurons, orient, rest), {
            "lines": 1, "neurons_per_line": [int(J.shape[0])], "sets_tried": 0, "found_in_answers": k,
            "kept": f"the first line's {J.shape[0]} neurons and {k} found in the polish answers" if k else
                    f"the first line's {J.shape[0]} neurons, oriented as polished"}
    line = np.zeros(J.shape[0], dtype=int)
    eps = ask.oracle.eps

    def rank(score: float, exact: bool) -> tuple:  # explaining every answer first, then an exact orientation
        return (needs_another_line(True, score, eps), not exact, score)

    best = (_consistency(fitted[0], ask), J, fitted)
    summary = {"lines": 1, "neurons_per_line": [int(J.shape[0])], "sets_tried": 0, "kept": "first line"}
    repaired = None

    def add(J2, where2, new_segs, name, extra=None):  # another line's jumps joined, and the best neuron set kept
        nonlocal J, where, line, segs, best
        J, where = np.concatenate([J, J2]), np.concatenate([where, where2 + len(segs)])
        line, segs = np.concatenate([line, np.full(J2.shape[0], line.max() + 1)]), segs + new_segs
        jumps = (J, where, segs)
        sets, singles = candidate_sets(J, line)
        if extra is not None:  # the repair line's own proposal first
            sets.insert(0, extra)
        scored = [(_score(ask, jumps, keep, v, opts, fit_data, summary), keep) for keep in sets]
        (top, keep) = min(scored, key=lambda sk: rank(sk[0][0], sk[0][1]))
        for k in np.flatnonzero(singles & ~keep):  # one line alone saw it: kept when it explains more
            trial = keep.copy()
            trial[k] = True
            got = _score(ask, jumps, trial, v, opts, fit_data, summary)
            if got[0] < 0.5 * top[0] and rank(*got[:2]) < rank(*top[:2]):
                top, keep = got, trial
        if rank(*top[:2]) < rank(best[0], best[2][1].exact):
            best = (top[0], J[keep], top[2])
            summary["kept"] = f"{int(keep.sum())} neurons from {name}"

    try:
        J2, where2, subs, proposal, summary["repair"] = _repair_line(run, ask, first, opts, noise)
    except BudgetExceededError:
        summary["stopped"] = "budget"
    else:
        if J2.shape[0]:
            add(J2, where2, subs, "the first line and the repair line", proposal)
        if needs_another_line(best[2][1].exact, best[0], eps):  # not repaired: whole lines, as without it
            repaired, best = best, (_consistency(fitted[0], ask), first[0], fitted)
            J, where, segs = first
            line = np.zeros(J.shape[0], dtype=int)
    while (summary["lines"] < MAX_LINES and "stopped" not in summary
           and needs_another_line(best[2][1].exact, best[0], eps)):
        new_segs = _segments(ask.d, ask.lifted, run.rng, opts.reach, _line_scale(ask.d, ask.lifted, True))  # coarse
        try:
            with run.phase("more_lines", absorb=True):
                J2, where2 = _search_and_measure(run, ask, new_segs, opts, True)["regions"].jumps()
        except BudgetExceededError:
            summary["stopped"] = "budget"
            break
        summary["lines"] += 1
        summary["neurons_per_line"].append(int(J2.shape[0]))
        add(J2, where2, new_segs, f"{summary['lines']} lines")
    if repaired is not None and rank(repaired[0], repaired[2][1].exact) < rank(best[0], best[2][1].exact):
        best = repaired
        summary["kept"] = f"{repaired[1].shape[0]} neurons from the first line and the repair line"
    return best[1], best[2], summary


def _jump_columns(neurons: Neurons, n: int) -> Neurons:
    """The first ``n`` neurons (those of the jumps), without the pairs that carry a linear rest (:func:`_orient`)."""
    return replace(neurons, dirs=neurons.dirs[:, :n], weights=neurons.weights[:n])


def _found_in_answers(run: Run, ask: Answers, neurons: Neurons, v, opts: FFNOptions, fit_data):
    """Coarse answers whose polished neurons miss some: neurons fitted to the polish answers beyond the found ones
    (:mod:`.missing`, no query), one at a time (the best of a few candidates, each polished with the others), up to
    :data:`MAX_FOUND_IN_ANSWERS`, while each lowers the miss by :data:`FOUND_GAIN` and is no fainter than
    :data:`.missing.FAINT`. Kept only when the set then orients exactly and explains every answer asked so far
    (:func:`needs_another_line`, the bar of a line's own set; orientations as :func:`_settle_or_keep`). When none
    is added, the first line's own set, polished again, is tested the same way. ``neurons``: the first line's jump
    neurons, polished (:func:`_jump_columns`). Returns ``(neurons, orientation, rest, jumps of the added neurons
    (k, K, D))`` or None."""
    Z, Y = fit_data
    if Z.shape[0] * float(ask.dim * (neurons.dirs.shape[1] + 1)) ** 2 > FOUND_MAX_WORK:
        return None
    eps = ask.oracle.eps
    rng = np.random.Generator(run.rng.bit_generator.jumped(2))  # the run's own stream stays as it was
    miss, added = _consistency(neurons, ask), 0
    for _ in range(MAX_FOUND_IN_ANSWERS):
        best = None
        for n, w in missing_neuron_candidates(neurons.dirs, Z, Y, ask.lifted, rng)[0]:
            trial = Neurons(np.concatenate([neurons.dirs, n[:, None]], axis=1),
                            np.concatenate([neurons.weights, w[None, :]]), neurons.c)
            trial = _repolish(trial, ask, fit_data)
            got = _consistency(trial, ask)
            if best is None or got < best[0]:
                best = (got, trial)
        if best is None or best[0] > (1 - FOUND_GAIN) * miss or faint_last(best[1]):
            break
        (miss, neurons), added = best, added + 1
        if not needs_another_line(True, miss, eps):
            break
    if added == 0:  # none missing, yet the first line's set failed: orientations off v (kept when it explains all)
        neurons = _repolish(neurons, ask, fit_data)
    neurons, orient, rest = _settle_or_keep(neurons, v, opts, ask, fit_data)
    tidied, added = tidy(neurons, added)  # the polish may leave one neuron on another's hyperplane, or faint
    if tidied.dirs.shape[1] < neurons.dirs.shape[1]:
        neurons, orient, rest = _settle_or_keep(_repolish(tidied, ask, fit_data), v, opts, ask, fit_data)
    if needs_another_line(orient.exact, _consistency(neurons, ask), eps):
        return None
    new = slice(neurons.dirs.shape[1] - added, None)  # their jumps as a line would measure them: w_k ⊗ dir_k
    return neurons, orient, rest, np.einsum("kj,ek->kje", neurons.weights[new], neurons.dirs[:, new])


def _settle_or_keep(neurons: Neurons, v, opts: FFNOptions, ask: Answers, fit_data):
    """Orientations settled on polished neurons (:func:`_settle`); when no ±1 vector reproduces the linear part v
    but the neurons as polished explain every answer, they are kept as they are: v comes from the first line's two
    end regions, whose gradients are off when a kink the line missed lies in one (measured: 2.5e-2 relative, where
    the polished set was 5e-8 from the true ``A w_o``), and a neuron turned the wrong way would change the function
    by a linear term that every answer shows. Returns ``(neurons, orientation, rest)``."""
    settled, orient, rest, _ = _settle(neurons, None, v, opts, ask, fit_data)
    if orient.exact or needs_another_line(True, _consistency(neurons, ask), ask.oracle.eps):
        return settled, orient, rest
    rest = _linear_rest(neurons, v, ask.d)
    off = np.linalg.norm(rest) / max(float(np.linalg.norm(v)), 1e-300)
    return neurons, Orientation(np.ones(neurons.dirs.shape[1]), True,
                                f"as polished: they explain every answer (v from the line's ends {off:.1e} off)"), rest


def _repair_line(run: Run, ask: Answers, first, opts: FFNOptions, noise: np.ndarray):
    """A fresh line tested against the first line's neurons (:mod:`.repair`, 3 answers per interval between their
    predicted kinks; ``noise``: each jump's relative error); kinks searched and gradients measured only on the
    spans that contradict them. Returns the jumps found there, their sub-segments (``where`` indexes them), the
    neuron set it proposes (a mask over the first line's jumps then these) and what the test saw."""
    J1, where1, segs1 = first
    N, C = jump_neurons(J1, hyperplane_normals(J1), np.array([segs1[si].direction for si in where1]).T)
    # its own random stream (a jump ahead of the run's, which it leaves as it was): the whole lines searched when
    # the repair fails are the ones searched without it
    run = copy.copy(run)
    run.rng = np.random.Generator(run.rng.bit_generator.jumped())
    segs = _segments(ask.d, ask.lifted, run.rng, opts.reach, _line_scale(ask.d, ask.lifted, True))  # coarse
    tol_f = _noise_factor(opts, True) * ask.oracle.eps * max(ask.top, 1e-300)
    with run.phase("repair_line", absorb=True):
        spans, checks, stats = suspect_spans(ask, segs, N, C, noise, tol_f)
        subs = [sub_segment(segs[si], lo, hi) for si, lo, hi in spans]
        if not subs:
            return np.zeros((0,) + J1.shape[1:]), np.zeros(0, dtype=int), [], np.ones(J1.shape[0], bool), stats
        q0 = run.queries
        state = _search_and_measure(run, ask, subs, opts, True)
        regions = state["regions"]
        stats["search_queries"] = run.queries - q0
        stats["regions"] = len(regions.regs)
    J2, where2 = regions.jumps()
    grad_noise = 2 * ask.oracle.eps * ask.top * np.sqrt(ask.dim)  # two roundings per probe
    N2 = hyperplane_normals(J2)
    drop = (contradicted(N, segs, spans, N2, SAME_NEURON_COS)
            | failed_side_checks(checks, spans, segs, regions, ask.mix, grad_noise, J1.shape[0]))
    keep = repaired_set(N, noise, drop, N2, regions.jump_noise(ask.oracle.eps), SAME_NEURON_COS)
    stats.update(jumps=int(J2.shape[0]), contradicted=int(drop.sum()))
    return J2, where2, subs, keep, stats


def _score(ask: Answers, jumps, keep: np.ndarray, v, opts: FFNOptions, fit_data, summary: dict):
    """The network of the jumps ``keep`` selects, oriented and polished (on the polish answers ``fit_data``):
    ``(consistency, orientation exact?, (neurons, orientation, rest))``."""
    J, where, segs = jumps
    summary["sets_tried"] += 1
    settles = _settles(ask, int(keep.sum()))
    neurons, orient, rest, _ = _orient(J[keep], where[keep], segs, v, opts, ask.oracle.eps, ask.lifted,
                                       provisional=settles)
    if ask.lifted:
        neurons = replace(neurons, c=fit_output_bias(neurons, *ask.all()))
    neurons, _ = polish(neurons, *fit_data, ask.lifted)
    if settles:
        neurons, orient, rest, _ = _settle(neurons, orient, v, opts, ask, fit_data)
    return _consistency(neurons, ask), orient.exact, (neurons, orient, rest)


def _polish_phase(run: Run, ask: Answers, neurons: Neurons, opts: FFNOptions, coarse: bool):
    """The least-squares polish on fresh spread-out inputs: (neurons, polished?, (Z, Y) of the polish)."""
    if not (opts.polish == "always" or (opts.polish == "auto" and coarse)):
        return neurons, False, None
    # the answers so far lie near one or two lines; the refit needs inputs spread over every direction
    n_fit = polish_answers(ask.dim, neurons.dirs.shape[1], ask.lifted)
    with run.phase("polish"):
        X = run.rng.standard_normal((n_fit, ask.d))
        if ask.lifted:
            X = _near_hyperplanes(X, neurons.dirs, run.rng)
        Z = np.concatenate([X, np.ones((n_fit, 1))], axis=1) if ask.lifted else X
        Y = ask.vectors(Z)
    return (*polish(neurons, Z, Y, ask.lifted), (Z, Y))


def _near_hyperplanes(X: np.ndarray, dirs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Three quarters of the polish inputs moved next to the hyperplanes ``aᵀx + b = 0`` (one neuron after another): a
    Gaussian point projected onto the hyperplane, then shifted by N(0, 1) along its normal. A biased neuron that
    Gaussian inputs rarely switch is then seen on both of its sides."""
    d, m = dirs.shape[0] - 1, dirs.shape[1]
    half = 3 * X.shape[0] // 4
    k = np.arange(half) % m
    a, b = dirs[:d, k].T, dirs[d, k]
    na = np.linalg.norm(a, axis=1)
    ok = na > 1e-12
    g = X[:half][ok]
    a_hat = a[ok] / na[ok, None]
    off = (np.einsum("nd,nd->n", g, a[ok]) + b[ok]) / na[ok]
    X = X.copy()
    X[np.flatnonzero(ok)] = g - (off - rng.standard_normal(int(ok.sum())))[:, None] * a_hat
    return X


def _model(neurons: Neurons, d: int, lifted: bool, vector: bool) -> ReLUNet:
    """The ReLUNet of the neurons: unit columns of A (bias-free) or unit ``(a_k, b_k)`` (biased)."""
    dirs = neurons.dirs
    norms = np.linalg.norm(dirs[:d] if not lifted else dirs, axis=0)
    keep = norms > 0
    dirs, W = dirs[:, keep] / norms[keep], neurons.weights[keep] * norms[keep, None]
    if dirs.shape[1] == 0:
        raise UnidentifiableError("the network answers 0 on every query: no neuron is visible (all dead)")
    w_o = W if vector else W[:, 0]
    c = None
    if lifted:
        c = neurons.c if vector else neurons.c[0]
    return ReLUNet(dirs[:d], w_o, "float64", dirs[d] if lifted else None, c)


def _unidentifiable_notes(hidden: int | None, found: int) -> list[str]:
    if hidden is None or found >= hidden:
        return []
    return [f"{hidden - found} of the {hidden} hidden neurons never show in any answer (a_k = 0, a constant folded "
            "into c; zero output weight in every output; or the same hyperplane as another neuron): they are "
            f"unidentifiable from queries and the model holds the {found} visible ones"]
