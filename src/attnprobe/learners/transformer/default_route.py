"""The transformer learner's default route: Sec. 4.1's route first when the target may be the paper's model,
the regions route otherwise or when it fails.

The paper's model (one head, a bias-free FFN, one output) is the cheapest to learn by its own route (measured at
d = 12, m = 20: 932 queries against 3,569 by regions); the regions route learns every other one-layer
transformer. One length-1 query at 0 tells them apart in part: the paper's model answers one number, and 0 there
(``ReLU(Aᵀ0) = 0``). When it does, the paper route runs; any other model makes it fail early (measured: 34–312
queries at d = 12 for two heads, FFN biases or the residual, its answers no softmax average) or fail its check,
and the regions route takes over, counting what the attempt asked (phases ``route`` and ``paper route``).
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import RecoveryError, SaturationError, UnidentifiableError
from attnprobe.learners.core.check import check_queries
from attnprobe.learners.head import probe_design
from attnprobe.learners.transformer.paper import TRANSFORMER_CHECK_LENGTHS, extract_transformer
from attnprobe.learners.transformer.regions import CHECK_LENGTHS, extract_transformer_multihead, regions_plan
from attnprobe.models.attention import AttentionHead

#: an answer at X = [0] this close to 0 (in roundings of the answers) is the paper model's ReLU(Aᵀ0)ᵀw_o = 0
ZERO_ROUNDINGS = 1e3


def paper_then_regions(oracle, *, seed, progress, sign_time_limit):
    """The default route (module docstring): the paper route when one query at 0 allows it, kept when its check
    passes; else the regions route, whose result counts the queries asked before it."""
    d = oracle.d
    least = 1 + min(2 * AttentionHead.unknowns(d, bias=False) + check_queries(TRANSFORMER_CHECK_LENGTHS),
                    regions_plan(d) + check_queries(CHECK_LENGTHS))
    oracle.require(least, f"the transformer learner at d={d} (one query at 0, then the cheaper route's first stage "
                          "and its check)")
    with oracle.phase("route"):
        y0 = np.asarray(oracle(np.zeros((1, 1, d))), dtype=np.float64).ravel()
    asked = {"route": 1}
    why = "it answers more than one number" if y0.size != 1 else (
        f"its answer at X = [0] is {y0[0]:.3g}, not 0 (FFN biases or an output offset)"
        if abs(y0[0]) > ZERO_ROUNDINGS * oracle.eps else "")
    if not why:
        before = oracle.queries
        try:
            res = extract_transformer(oracle, probes=probe_design("orthogonal"), seed=seed, progress=progress,
                                      sign_time_limit=sign_time_limit, asked_before=asked)
        except (RecoveryError, SaturationError, UnidentifiableError) as exc:
            why = f"the paper route stopped: {exc}"
        else:
            if res.check is None or res.check.passed:
                res.model = res.model.as_multihead()  # the learner's kind: the same function, one head, no biases
                res.notes.append("the default route: Sec. 4.1's route fitted the target (one head, a bias-free FFN, "
                                 "one output) and its check passed; the regions route (transformer_route regions) "
                                 "also learns several heads, FFN biases, K outputs and the residual, for more queries")
                return res
            why = f"the paper route's result failed its check (error {res.check.error:.1e})"
        asked["paper route"] = oracle.queries - before
    res = extract_transformer_multihead(oracle, seed=seed, progress=progress, sign_time_limit=sign_time_limit,
                                        asked_before=asked)
    res.notes.append(f"the default route: the regions route, as the target is not the paper's model ({why}; "
                     f"{sum(asked.values())} queries asked before it, counted)")
    return res
