"""Whole transformer blocks (docs/block.md): registers ``block``, a pre-norm RMSNorm block with RoPE attention and a
bias-free gated FFN (LLaMA's decoder layer) from hidden states in and every position out.

What is built: the model (:class:`attnprobe.models.block.TransformerBlock`, pre-norm, parallel and post-norm
layouts, checked against transformers' layer modules), its gauges (:func:`attnprobe.models.block.fold_norm_weights`,
:func:`attnprobe.models.block.flip_post_norm_sign`), the victims (:mod:`attnprobe.oracles.hf_block`), the measured
levers (:mod:`.levers`), the sublayer oracles a pre-norm RMSNorm block splits into through its norm's inverse
(:mod:`.sublayers`), the attention's per-head logit refit (:mod:`.refine`), the joint polish of the attention
through the block (:mod:`.polish`) and the learner that chains them (:func:`.learner.extract_block`);
the post-norm (BERT) route's stages built so far (:mod:`.post_norm`: output norm, first-norm centre, first-norm input,
and the pair-curvature levers toward the attention; :mod:`.post_norm_attention`: the attention through both norms
and the unknown FFN; :mod:`.post_norm_neurons`: the FFN's neurons through n2's per-row scale; :mod:`.post_norm_ffn`:
the rest of the FFN given them; :mod:`.post_norm_polish`: the block assembled and polished), which
:mod:`.post_norm_learner` chains end to end: ``extract_block`` runs it on a block told apart as post-norm (given
the FFN's width, up to the neurons stage's measured size; beyond it, refused in one line naming that stage).
"""

from attnprobe.errors import ConfigError
from attnprobe.learners.block import post_norm_learner
from attnprobe.learners.block.learner import CHECK_LENGTHS, CHECK_PER_LENGTH, extract_block, block_queries
from attnprobe.learners.block.post_norm_store import StageStore
from attnprobe.learners.core.estimate import QueryCount
from attnprobe.learners.core.registry import Capabilities, Option, register
from attnprobe.learners.multihead.options import HEADS
from attnprobe.learners.positional import WALK_OPTION
from attnprobe.learners.positional.rope import WALK
from attnprobe.models.gated_ffn import GATED_FAMILIES


def _block(oracle, *, seed, progress, heads=None, hidden=None, activation=None, walk=WALK, stages=None,
           sitting=None):
    if heads is None:
        raise ConfigError("the block learner needs the attention's number of heads H (the 'heads' parameter)",
                          param="heads")
    if sitting is not None and stages is None:
        raise ConfigError("a sitting pauses a run with its stages saved: give the stages folder too (the 'stages' "
                          "parameter)", param="sitting")
    store = None if stages is None else StageStore(stages, sitting)
    return extract_block(oracle, heads=heads, hidden=hidden, activation=activation, seed=seed, progress=progress,
                         walk=walk, store=store)


def block_estimate(setting) -> QueryCount:
    """:func:`~.learner.block_queries`: exact given the FFN's width (``hidden``), a lower bound at ``4d`` without; a
    block declared post-norm (``setting.layout``): :func:`_post_norm_estimate`."""
    H = setting.needs("heads", "a block estimate needs the attention's number of heads H")
    if setting.coarse:
        raise ConfigError(f"the block learner reads float64 answers without noise; {setting.precision} answers would "
                          "be refused, so there is nothing to estimate", param="precision")
    m = setting.option("hidden")
    if setting.layout == "post":
        return _post_norm_estimate(setting.d, H, m, setting.check)
    walk = setting.option("walk") or WALK
    d = setting.d
    if m:
        q = block_queries(d, H, m, walk=walk, check=setting.check)
        return QueryCount(q, q, q, f"linear part 1 + 6d, ε, the gated FFN learner (m = {m}), the RoPE learner at a "
                                   "fixed query rms, the logit refit 8d, the attention polish, the check")
    # gated FFNs as deployed: LLaMA 8d/3 (11008 at d = 4096), LLaMA-3 3.5d; the width search spans 2d … 8d
    low, typical, high = (block_queries(d, H, m, walk=walk, check=setting.check) for m in (2 * d, 8 * d // 3, 8 * d))
    return QueryCount(typical, low, high, f"linear part 1 + 6d, ε, the gated FFN learner (m not given: {8 * d // 3} "
                                          f"= 8d/3 assumed, 2d … 8d in the range), the RoPE learner at a fixed query "
                                          "rms, the logit refit 8d, the attention polish, the check")


def _post_norm_estimate(d: int, H: int, m: int | None, check: bool) -> QueryCount:
    """The post-norm route's queries (:func:`~.post_norm_learner.post_norm_queries` and the check), or its one-line
    refusal where the run refuses after the 3 queries that tell the layout apart (the neurons stage's size)."""
    cause = post_norm_learner.neurons_refusal(d, m)
    if cause is not None:
        raise ConfigError(f"a post-norm block (its layout declared by the target) is refused by the post-norm route "
                          f"after the 3 queries that tell it apart: {cause}; nothing more to estimate",
                          param="hidden" if m is None else None)
    low, typical, high = (q + (len(CHECK_LENGTHS) * CHECK_PER_LENGTH if check else 0)
                          for q in post_norm_learner.post_norm_queries(d, H, m))
    return QueryCount(typical, low, high, f"the post-norm route (m = {m}): the layout told apart 3, output norm, "
                                          f"first-norm centre and input, attention {post_norm_learner.pairs(d, H)} "
                                          "pairs (1 … 3 Jacobians a row), neurons (4m points, or through probes "
                                          "past the d² span's size), ffn, the polish's sequences, the check")


register("block", _block, recovers="block", needs_one_of=("heads",),
         capabilities=Capabilities(vector_answers=True, fine_answers=True), estimate=block_estimate,
         help="a whole pre-norm RMSNorm block (LLaMA decoder layer: RMSNorm → RoPE GQA attention → residual → "
              "RMSNorm → SwiGLU/GeGLU → residual, no biases) from hidden states in and every position out; norm "
              "weights folded into the next projections (only the products are identifiable), ε learned; a "
              "post-norm BERT block (LayerNorm after each residual, GELU FFN) by the post-norm route given its FFN "
              "width (layers up to MiniLM's m·d = 589,824: the neurons stage's size)",
         options=[HEADS, Option("hidden", int, "the FFN's hidden width if known (skips the width search)", low=1,
                                metavar="M"),
                  Option("activation", str, "the block FFN's gated activation (default: read from the answers)",
                         choices=tuple(GATED_FAMILIES)),
                  WALK_OPTION,
                  Option("stages", str, "a folder keeping each stage of the post-norm route as it is read: a "
                                        "run that stops (Ctrl-C, a crash, the end of a sitting) resumes there when "
                                        "run again with the same folder (MiniLM's layer takes ~70 min)",
                         metavar="DIR"),
                  Option("sitting", float, "with a stages folder: pause after about this many seconds, the stages "
                                           "so far saved (exit 75: run the same command again)", low=0,
                         open_low=True, metavar="SECONDS")])

__all__ = ["extract_block", "block_estimate"]
