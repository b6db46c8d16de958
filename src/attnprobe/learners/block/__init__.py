"""Whole transformer blocks (docs/block.md): registers ``block``, a pre-norm RMSNorm block with RoPE attention and
a bias-free gated FFN (LLaMA's decoder layer) from hidden states in and every position out (:mod:`.learner`).

Also here: the measured levers (:mod:`.levers`: the last token driven out, zero keys that leave the FFN alone, the
post-norm output LayerNorm read from the answers) and the sublayer oracles the learner builds on them
(:mod:`.sublayers`). The model: :class:`attnprobe.models.block.TransformerBlock`; its gauges
:func:`attnprobe.models.block.fold_norm_weights` and :func:`attnprobe.models.block.flip_post_norm_sign`.
"""

from attnprobe.learners.block.learner import block_queries, extract_block
from attnprobe.learners.core.estimate import QueryCount
from attnprobe.learners.core.registry import Capabilities, Option, register
from attnprobe.learners.multihead.options import HEADS
from attnprobe.learners.positional import WALK_OPTION


def _block(oracle, *, seed, progress, heads, hidden=None, walk=1):
    if heads is None:
        from attnprobe.errors import ConfigError

        raise ConfigError("the block learner needs the attention's number of heads", param="heads")
    return extract_block(oracle, heads=heads, hidden=hidden, seed=seed, progress=progress, walk=walk)


def block_estimate(setting) -> QueryCount:
    """:func:`block_queries` (exact but for the pair probe's halved steps, which the positional estimate bounds)."""
    H = setting.needs("heads", "a block estimate needs the number of heads H")
    m = setting.needs("hidden", "a block estimate needs the FFN's gated units m (--hidden)")
    if setting.coarse:
        from attnprobe.errors import ConfigError

        raise ConfigError(f"the block learner reads float64 answers; {setting.precision} answers would be refused",
                          param="precision")
    q = block_queries(setting.d, H, m, walk=setting.option("walk") or 1, check=setting.check)
    return QueryCount(q, q, q, "1 + 6d (linear part at 0), 60 (ε), the gated FFN learner's plan at K = d, the "
                               "RoPE learner's plan with unit queries, the every-position check")


register("block", _block, recovers="block", capabilities=Capabilities(vector_answers=True, fine_answers=True),
         estimate=block_estimate,
         help="a whole pre-norm block (LLaMA: RMSNorm, RoPE GQA attention, residual, RMSNorm, SwiGLU/GeGLU, "
              "residual; no biases) from hidden states in and every position out: norm weights folded into the "
              "next projections, ε, the attention (per head and frequency pair) and the gated FFN",
         options=[HEADS, Option("hidden", int, "hidden width if known (ReLU: neurons no answer shows are then "
                                "reported as unidentifiable; smooth: skips the width search)", low=1, metavar="M"),
                  WALK_OPTION])

__all__ = ["block_queries", "block_estimate", "extract_block"]
