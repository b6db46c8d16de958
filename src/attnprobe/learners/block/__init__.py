"""Whole transformer blocks (docs/block.md): registers ``block``, a pre-norm RMSNorm block with RoPE attention and a
bias-free gated FFN (LLaMA's decoder layer) from hidden states in and every position out.

What is built: the model (:class:`attnprobe.models.block.TransformerBlock`, pre-norm, parallel and post-norm
layouts, checked against transformers' layer modules), its gauges (:func:`attnprobe.models.block.fold_norm_weights`,
:func:`attnprobe.models.block.flip_post_norm_sign`), the victims (:mod:`attnprobe.oracles.hf_block`), the measured
levers (:mod:`.levers`), the sublayer oracles a pre-norm RMSNorm block splits into through its norm's inverse
(:mod:`.sublayers`), the attention's per-head logit refit (:mod:`.refine`), a Gauss–Newton polish of RoPE attention
on last-row answers (:mod:`.polish`, measured only) and the learner that chains them (:func:`.learner.extract_block`);
the post-norm (BERT) route's stages built so far (:mod:`.post_norm`: output norm, first-norm centre, first-norm input,
and the pair-curvature levers toward the attention), which ``extract_block`` runs on a post-norm block before
refusing it in one line at the stage not built (the FFN).
"""

from attnprobe.errors import ConfigError
from attnprobe.learners.block.learner import extract_block, block_queries
from attnprobe.learners.core.estimate import QueryCount
from attnprobe.learners.core.registry import Capabilities, Option, register
from attnprobe.learners.multihead.options import HEADS
from attnprobe.learners.positional import WALK_OPTION
from attnprobe.learners.positional.rope import WALK
from attnprobe.models.gated_ffn import GATED_FAMILIES


def _block(oracle, *, seed, progress, heads=None, hidden=None, activation=None, walk=WALK):
    if heads is None:
        raise ConfigError("the block learner needs the attention's number of heads H (the 'heads' parameter)",
                          param="heads")
    return extract_block(oracle, heads=heads, hidden=hidden, activation=activation, seed=seed, progress=progress,
                         walk=walk)


def block_estimate(setting) -> QueryCount:
    """:func:`~.learner.block_queries`: exact given the FFN's width (``hidden``), a lower bound at ``4d`` without."""
    H = setting.needs("heads", "a block estimate needs the attention's number of heads H")
    if setting.coarse:
        raise ConfigError(f"the block learner reads float64 answers without noise; {setting.precision} answers would "
                          "be refused, so there is nothing to estimate", param="precision")
    m = setting.option("hidden")
    walk = setting.option("walk") or WALK
    q = block_queries(setting.d, H, m or 4 * setting.d, walk=walk, check=setting.check)
    what = (f"linear part 1 + 6d, ε, the gated FFN learner (m = {m or 4 * setting.d}), the RoPE learner at a fixed "
            f"query rms, the logit refit 8d, the check")
    high = q if m else block_queries(setting.d, H, 8 * setting.d, walk=walk, check=setting.check)
    return QueryCount(q, q, high, what + ("" if m else " (m not given: 4d … 8d assumed)"))


register("block", _block, recovers="block", needs_one_of=("heads",),
         capabilities=Capabilities(vector_answers=True, fine_answers=True), estimate=block_estimate,
         help="a whole pre-norm RMSNorm block (LLaMA decoder layer: RMSNorm → RoPE GQA attention → residual → "
              "RMSNorm → SwiGLU/GeGLU → residual, no biases) from hidden states in and every position out; norm "
              "weights folded into the next projections (only the products are identifiable), ε learned",
         options=[HEADS, Option("hidden", int, "the FFN's hidden width if known (skips the width search)", low=1,
                                metavar="M"),
                  Option("activation", str, "the block FFN's gated activation (default: read from the answers)",
                         choices=tuple(GATED_FAMILIES)),
                  WALK_OPTION])

__all__ = ["extract_block", "block_estimate"]
