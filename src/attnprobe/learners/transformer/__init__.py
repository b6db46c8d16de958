"""One-layer transformers from value queries, by two routes under one learner ``transformer``:

- ``regions`` (:mod:`.regions`): multi-head attention, a biased K-output ReLU FFN and the residual, detected from
  length-1 and length-2 queries (:mod:`.frames`, :mod:`.heads`, :mod:`.polish`);
- ``paper`` (:mod:`.paper`): Sec. 4.1's route through ``TF(X) − TF(−X)`` (one head, bias-free FFN, one output).

Neither given: the paper route when the target may be its model, else regions (:mod:`.default_route`).
"""

from __future__ import annotations

from attnprobe.errors import ConfigError
from attnprobe.learners.core.registry import Capabilities, Option, register
from attnprobe.learners.ffn import SIGN_TIME
from attnprobe.learners.head import HEAD_PROBES, probe_design
from attnprobe.learners.transformer.default_route import paper_then_regions
from attnprobe.learners.transformer.paper import extract_transformer
from attnprobe.learners.transformer.regions import extract_transformer_multihead


def _transformer(oracle, *, seed, progress, probes, sign_time_limit, transformer_route):
    """``regions``: multi-head attention, a biased K-output FFN and the residual, detected; ``paper``: Sec. 4.1's
    route through TF(X) − TF(−X) (one head, bias-free FFN, one output; implied by ``probes``); neither given: the
    paper route when the target may be its model, else (or when it fails) regions (:mod:`.default_route`)."""
    route = transformer_route or ("paper" if probes else None)
    if route is None:
        return paper_then_regions(oracle, seed=seed, progress=progress, sign_time_limit=sign_time_limit)
    if route == "paper":
        return extract_transformer(oracle, probes=probe_design(probes or "orthogonal"), seed=seed,
                                   progress=progress, sign_time_limit=sign_time_limit)
    if probes:
        raise ConfigError(f"the 'probes' parameter chooses the probes of the paper's transformer route; drop it "
                          f"({probes}) or use the 'transformer_route' parameter paper", param="probes")
    return extract_transformer_multihead(oracle, seed=seed, progress=progress, sign_time_limit=sign_time_limit)


register("transformer", _transformer, recovers="transformer",
         capabilities=Capabilities(fine_answers=True, vector_answers=True),
         help="a one-layer transformer: multi-head attention, a biased ReLU FFN, K outputs, the residual (heads up "
              "to order, the FFN up to neuron permutation and scale; Sec. 4.1's route with transformer_route paper)",
         options=[Option("transformer_route", str, "regions (heads, FFN biases, K outputs and residual detected) "
                         "or paper (Sec. 4.1: one head, bias-free FFN, one output, via TF(X) - TF(-X); implied by "
                         "probes); default: paper when one query at 0 allows it and its check passes, else regions",
                         choices=("regions", "paper")),
                  Option("probes", str, "paper route: probe design of W, as for exact (default orthogonal)",
                         choices=HEAD_PROBES), SIGN_TIME])

__all__ = ["extract_transformer", "extract_transformer_multihead"]
