"""Learners for attention whose logits depend on the offset between positions (RoPE; docs/positional.md).

Registers ``positional`` (whole output rows at the last position, float64 answers) with its options and estimate.
"""

from attnprobe.learners.core.check import check_queries
from attnprobe.learners.core.estimate import QueryCount
from attnprobe.learners.core.registry import Capabilities, Option, register
from attnprobe.learners.multihead.options import HEADS
from attnprobe.learners.positional.rope import (CHECK_LENGTHS, WALK, coarse_refusal, extract_positional,
                                               positional_queries)
from attnprobe.learners.positional.route import POSITION, additive_estimate, extract_any_positional
from attnprobe.models.precision import machine_epsilon

#: queries of the pair probe's walk per ⌈K/H⌉: more span each head's output space better (docs/positional.md)
WALK_OPTION = Option("walk", int, "RoPE: queries of the pair probe's walk per ceil(K/H) (more: closer function, "
                     "up to a point)", default=WALK, low=1)


def _positional(oracle, *, seed, progress, heads, position="auto", walk=WALK):
    return extract_any_positional(oracle, heads=heads, seed=seed, progress=progress, position=position, walk=walk)


def positional_estimate(setting) -> QueryCount:
    """The plan of :func:`extract_positional` (:func:`positional_queries`) plus its check on lengths up to 256."""
    if setting.option("position") in ("t5", "alibi"):
        return additive_estimate(setting)
    H = setting.needs("heads", "a positional estimate needs the number of heads H")
    if setting.coarse:
        from attnprobe.errors import ConfigError

        raise ConfigError(f"{coarse_refusal(setting.precision, machine_epsilon(setting.precision))}: nothing to "
                          "estimate", param="precision")
    head_dim = setting.d // H
    walk = setting.option("walk") or WALK
    checks = check_queries(CHECK_LENGTHS) if setting.check else 0
    q = positional_queries(setting.d, H, head_dim, outputs=setting.outputs, walk=walk) + checks
    extra = positional_queries(setting.d, H, head_dim, outputs=setting.outputs, walk_only=True, walk=walk)
    return QueryCount(q, q, q + extra, f"values 2d, the pair probe at 4 settings on walk·⌈K/H⌉ + 5 queries "
                                       f"(walk = {walk}; up to twice when steps of the walk are halved), logit "
                                       f"sketches 4d(d_h + 8) with d_h = {head_dim}, check {checks}")


register("positional", _positional, recovers="positional",
         capabilities=Capabilities(vector_answers=True, fine_answers=True), estimate=positional_estimate,
         help="attention with position terms from whole output rows at the last position: RoPE (LLaMA/Mistral: "
              "rotary, GQA, no biases; per head and frequency pair W_Q, W_K up to a scaled rotation of the pair, the "
              "frequencies, V_h), T5 relative buckets and ALiBi (an additive bias: B_h, u_h, V_h, the bias per "
              "bucket or the slope)",
         options=[HEADS, POSITION, WALK_OPTION])

__all__ = ["extract_positional", "positional_estimate", "positional_queries"]
