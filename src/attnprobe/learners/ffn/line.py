"""One search line of the FFN learner: the segments that meet every neuron's hyperplane once, the kinks found on
them (:mod:`.kinks`) and the gradients of the linear regions between the kinks (:mod:`.regions`)."""

from __future__ import annotations

import numpy as np

from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.ffn.answers import Answers
from attnprobe.learners.ffn.kinks import Segment, SearchSettings, search_kinks
from attnprobe.learners.ffn.options import FFNOptions
from attnprobe.learners.ffn.regions import Regions, RefineSettings
from attnprobe.learners.head.probes import random_orthogonal

#: answers agree with a line if they differ by less than this many roundings of the largest answer seen
#: (float64 answers / coarser answers: float32's real rounding is a few units, and 64 hide weak kinks)
NOISE_FACTOR, COARSE_NOISE_FACTOR = 64.0, 8.0
#: a kink is merged away when its gradient jump is below this many roundings over the probe radius
MERGE_NOISE, COARSE_MERGE_NOISE = 64.0, 2.0


def segments(d: int, lifted: bool, rng: np.random.Generator, reach: float, scale: float = 1.0) -> list[Segment]:
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


def line_scale(d: int, lifted: bool, coarse: bool) -> float:
    """Norm of the search line's points ``p`` and ``q`` (biased nets on float64 answers: √d, the norm of a
    standard Gaussian input). A hyperplane ``aᵀx + b = 0`` meets the line ``p + τq`` at ``τ = −(aᵀp + b)/aᵀq``; on a
    unit line ``aᵀq ~ ‖a‖/√d`` against a bias of order ‖a‖, so the kinks crowd near the line's far ends (τ ~ √d),
    where the regions are thin and each is measured twice (784 inputs: 1–6 of 18 regions, 28–45 of 66); at norm √d
    they spread as on a bias-free net. Float32 answers keep the unit line (their search is tuned to it)."""
    return float(np.sqrt(d)) if lifted and not coarse else 1.0


def line_noise_factor(opts: FFNOptions, coarse: bool) -> float:
    """Roundings of the largest answer within which answers count as on a line (:data:`NOISE_FACTOR`)."""
    return opts.noise_factor or (COARSE_NOISE_FACTOR if coarse else NOISE_FACTOR)


def search_and_measure(run: Run, ask: Answers, segs, opts: FFNOptions, coarse: bool) -> dict:
    """Kinks on every segment, then the gradient of every linear region between them (re-measured where
    needed). Returns the regions and what the phases saw."""
    eps = run.oracle.eps
    noise_factor = line_noise_factor(opts, coarse)
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
