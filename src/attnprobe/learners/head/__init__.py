"""Single attention heads ``f(X) = softmax(X W x_N + X u)ᵀ X v + c`` (paper Sec. 4–6, App. B), and the learners'
shared parts: probe designs (:mod:`.probes`), logit measurement and inversion (:mod:`.sigmoid`), probe scaling
(:mod:`.scaling`).

Registers ``exact`` (Thm 4.1), ``lowrank``, ``nuclear`` (Thm 5.1), ``robust`` (Sec. 6) and ``membership``
(App. B) with their options and estimates.
"""

from __future__ import annotations

from attnprobe.learners.core.registry import NO_BIAS, Capabilities, Option, register
from attnprobe.learners.head.estimate import exact_estimate, lowrank_estimate
from attnprobe.learners.head.exact import PROBES, extract_exact, probe_design
from attnprobe.learners.head.lowrank import extract_lowrank
from attnprobe.learners.head.membership import extract_membership, extract_membership_paper
from attnprobe.learners.head.nuclear import extract_nuclear
from attnprobe.learners.head.robust import MAX_RETRIES, extract_robust, extract_robust_paper

#: the rank bound r of W, shared with the multi-head learners
RANK = Option("rank", int, "rank bound r of W (head dimension); lowrank detects it when omitted", low=1)
W_BOUND = Option("w_bound", float, "known W ≥ 2 with ‖W‖_F ≤ W (probes paper)")
MARGIN = Option("margin", float, "known μ ≤ min nonzero |v_i| (probes paper)")
#: the probe designs of the value-query head learners (``paper``: the basis probes of Thm 4.1)
HEAD_PROBES = ("orthogonal", "basis", "gaussian", "paper")


def _exact(oracle, *, seed, progress, probes, no_bias):
    return extract_exact(oracle, probes=probe_design(probes), bias=not no_bias, seed=seed, progress=progress)


def _lowrank(oracle, *, seed, progress, rank, oversample, no_bias):
    return extract_lowrank(oracle, rank=rank, oversample=oversample, bias=not no_bias, seed=seed,
                           progress=progress)


def _nuclear(oracle, *, seed, progress, rank, measurements, solver, solver_time_limit, no_bias):
    return extract_nuclear(oracle, rank=rank, measurements=measurements, solver=solver,
                           solver_time_limit=solver_time_limit, bias=not no_bias, seed=seed, progress=progress)


def _robust(oracle, *, seed, progress, probes, no_bias, tolerance, queries, max_scale, no_retries, w_bound,
            margin):
    if probes == "paper":
        tol = tolerance if tolerance is not None else oracle.noise.tolerance
        return extract_robust_paper(oracle, w_bound=w_bound, margin=margin, tolerance=tol, seed=seed,
                                    progress=progress)
    return extract_robust(oracle, bias=not no_bias, tolerance=tolerance, queries=queries, seed=seed,
                          max_scale=max_scale, retries=0 if no_retries else MAX_RETRIES, progress=progress)


def _membership(oracle, *, seed, progress, probes, w_bound, margin, eps_w, delta, samples):
    if probes == "paper":
        return extract_membership_paper(oracle, w_bound=w_bound, margin=margin, eps_w=eps_w, delta=delta,
                                        samples=samples, seed=seed, progress=progress)
    return extract_membership(oracle, seed=seed, progress=progress)


register("exact", _exact, recovers="head", help="Thm 4.1: exact recovery from d²+2d+1 value queries",
         estimate=exact_estimate,
         options=[Option("probes", str, "probe design: orthogonal (default), basis (= paper), gaussian",
                         default="orthogonal", choices=HEAD_PROBES), NO_BIAS])
register("lowrank", _lowrank, recovers="head", help="low-rank heads from 2dr − r² bilinear measurements",
         estimate=lowrank_estimate,
         options=[RANK, Option("oversample", int, "extra sketch directions/probes for noisy answers (default 0 "
                               "for float64, 4 for coarser answers)", low=0), NO_BIAS])
register("nuclear", _nuclear, recovers="head", capabilities=Capabilities(cvxpy=True),
         needs_one_of=("rank", "measurements"),
         help="Thm 5.1: low-rank heads by nuclear-norm minimisation",
         options=[RANK, Option("measurements", int, "number m of rank-one measurements (default from the measured "
                               "phase transition)", low=1),
                  Option("solver", str, "cvxpy solver (default auto = SCS, then CLARABEL)", default="auto"),
                  Option("solver_time_limit", float, "refuse up front when the solver is estimated to take longer "
                         "(default 300)", default=300.0, low=0, open_low=True, metavar="SEC"), NO_BIAS])
register("robust", _robust, recovers="head", capabilities=Capabilities(noisy_answers=True),
         help="Sec. 6: heads from answers with additive noise or rounding",
         options=[Option("probes", str, "orthogonal (default) or paper (Thm 6.1)", default="orthogonal",
                         choices=("orthogonal", "paper")), NO_BIAS,
                  Option("tolerance", float, "the answers' additive error bound τ (default: the declared noise)"),
                  Option("queries", int, "queries to plan for (extra ones shrink the error)", low=1),
                  Option("max_scale", float, "largest probe norm the API accepts", low=0, open_low=True),
                  Option("no_retries", bool, "never re-measure a probe (spend exactly the planned queries; unresolved "
                         "weights clipped)"), W_BOUND, MARGIN])
register("membership", _membership, recovers="head",
         capabilities=Capabilities(value_answers=False, membership_answers=True),
         help="App. B: heads from yes/no answers 1[f(X) > 0]",
         options=[Option("probes", str, "bisection (default) or paper (App. B)", default="bisection",
                         choices=("bisection", "paper")), W_BOUND, MARGIN,
                  Option("eps_w", float, "probes paper: target ε_W (default 0.1)", default=0.1, low=0,
                         open_low=True),
                  Option("delta", float, "probes paper: failure probability (default 0.05)", default=0.05, low=0,
                         open_low=True),
                  Option("samples", int, "probes paper: sign samples (overrides Thm B.1's k)", low=1)])

__all__ = ["HEAD_PROBES", "MARGIN", "PROBES", "RANK", "W_BOUND", "extract_exact", "extract_lowrank",
           "extract_membership", "extract_membership_paper", "extract_nuclear", "extract_robust",
           "extract_robust_paper", "probe_design"]
