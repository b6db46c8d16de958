"""``extract_ffn``: a short driver over the phases of the critical-point FFN learner.

Phases (each charged to its own query count): ``odd_part`` (bias-free nets: ``f(x) − f(−x) = vᵀx``, 2d
queries unless v is given), ``kink_search`` and ``gradients``/``re_measured`` on one line (:mod:`.line`), then
orientations (:mod:`.settle`, no queries) and, for coarse answers, ``polish`` (:mod:`.fit`) and, when the
polished neurons miss answers, the mending (:mod:`.mending`: neurons found in the polish answers, else
``repair_line`` and ``more_lines``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.ffn.answers import Answers
from attnprobe.learners.ffn.fit import POLISH_MAX_UNKNOWNS, Neurons, fit_output_bias, polish, polish_answers
from attnprobe.learners.ffn.line import line_scale, search_and_measure, segments
from attnprobe.learners.ffn.mending import Lines, mend
from attnprobe.learners.ffn.more_lines import needs_another_line
from attnprobe.learners.ffn.options import SIGN_TIME_LIMIT, FFNOptions
from attnprobe.learners.ffn.settle import consistency, orient_neurons, settle, settles_on_polish
from attnprobe.models.ffn import ReLUNet

#: coarsest answer rounding the kink search resolves (float32's 1.2e-7 works; float16's 9.8e-4 does not)
FINEST_EPS = 1e-6

__all__ = ["FINEST_EPS", "SIGN_TIME_LIMIT", "FFNOptions", "extract_ffn", "require_fine_answers"]


def require_fine_answers(oracle, what: str) -> None:
    """Refuse answers coarser than :data:`FINEST_EPS` (float16, bfloat16): the kinks drown in rounding."""
    if oracle.eps > FINEST_EPS:
        raise ConfigError(f"{what} needs answers rounded at most at {FINEST_EPS:g} (float32 or better); these are "
                          f"rounded at {oracle.eps:.2g} ({oracle.precision}), where kinks drown in rounding",
                          param="precision")


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
    run.plan((odd_part_queries(d) if not lifted and v is None else 0) + 14 + 2 * (dim + 1),
             f"the FFN learner at d={d} (3 queries per search point, {dim + 1} per linear region)", at_least=True)
    ask = Answers(oracle, lifted=lifted, rng=run.rng, reserve=run.check_queries)
    coarse = oracle.eps > 1e-12
    if not lifted:
        with run.phase("odd_part"):
            v = _odd_part(ask, d) if v is None else _given_v(v, d)
    segs = segments(d, lifted, run.rng, opts.reach, line_scale(d, lifted, coarse))
    state = search_and_measure(run, ask, segs, opts, coarse)
    regions = state.pop("regions")
    J, where = regions.jumps()
    if lifted:  # the two far ends of the line: their gradients sum to Σ_k w_k a_k (+ 2c in the s entry)
        v = (regions.G[0] + regions.G[-1])[:, :d]
    settles = coarse and opts.polish != "never" and settles_on_polish(ask, J.shape[0])
    net = orient_neurons(J, where, segs, v, opts, oracle.eps, lifted, provisional=settles)
    neurons = net.neurons
    if lifted:
        neurons = replace(neurons, c=fit_output_bias(neurons, regions.XR, regions.F0))
    neurons, polished, fit_data = _polish_phase(run, ask, neurons, opts, coarse)
    net = settle(neurons, v, opts, ask, fit_data) if settles else replace(net, neurons=neurons)
    # the polish may leave a network with a wrong neuron as it was (no round lowers the misfit): such a network
    # is searched again like one the polish moved
    refits = fit_data is not None and ask.dim * net.neurons.dirs.shape[1] <= POLISH_MAX_UNKNOWNS
    if coarse and refits and needs_another_line(net.orientation.exact, consistency(net.neurons, ask), oracle.eps):
        mended = mend(run, ask, Lines(J, where, segs), net, v, opts, fit_data, noise=regions.jump_noise(oracle.eps))
        J, net, state["more_lines"] = mended.kept.jumps, mended.kept.net, mended.summary
    model = _model(net.neurons, d, lifted, ask.vector)
    m_found = J.shape[0]
    notes = [*net.notes, *_unidentifiable_notes(opts.hidden, m_found)]
    if state.get("more_lines", {}).get("stopped") == "budget":
        notes.append("the neurons found do not explain every answer, and the budget had no room for another search "
                     "line (raise the budget to let the learner look again)")
    details = {
        "seed": seed, "bias": lifted, "outputs": ask.outputs, "min_width": state.pop("min_width"),
        "noise_factor": state.pop("noise_factor"), "probe_fraction": opts.probe_fraction, "refine": opts.refine,
        "polished": polished, "neurons_found": int(m_found),
        "neurons_unidentifiable": None if opts.hidden is None else max(0, opts.hidden - m_found),
        "kinks_per_segment": [len(s.kinks) for s in segs], **state, "regions": len(regions.regs),
        "orientation": net.orientation.how, "orientation_exact": bool(net.orientation.exact),
        "orientation_residual": float(np.linalg.norm(net.rest) / max(np.linalg.norm(v), 1e-300)),
        "queries_per_dm": run.queries / (d * max(m_found, 1)),
        "self_consistency": consistency(net.neurons, ask),
    }
    unknowns = ReLUNet.unknowns(d, max(m_found, 1), ask.outputs, lifted)
    return run.finish(model, unknowns=unknowns, details=details, notes=notes,
                      hint=" (a two-layer ReLU network of this form" + (")" if lifted else " without biases)"))


def odd_part_queries(d: int) -> int:
    """Queries of the odd part of a bias-free network (:func:`_odd_part`): ``[±e_i]``, 2d."""
    return 2 * d


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
