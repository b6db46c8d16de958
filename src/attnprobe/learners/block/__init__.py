"""Whole transformer blocks (docs/block.md): not learned yet.

What is built: the model (:class:`attnprobe.models.block.TransformerBlock`, pre-norm, parallel and post-norm
layouts, checked against transformers' layer modules), its gauges (:func:`attnprobe.models.block.fold_norm_weights`,
:func:`attnprobe.models.block.flip_post_norm_sign`: what the answers cannot fix), the victims
(:mod:`attnprobe.oracles.hf_block`, served whole by the CLI) and measured prototypes of the levers a learner would pull
(:mod:`.levers`: the last token driven out, zero keys that leave the FFN alone — a pre-norm block split into its
attention and FFN oracles — and the output LayerNorm read from the answers; measured in
``benchmarks/block_levers.py``). No learner is registered: the CLI refuses the method ``block`` before any query and
says why.
"""
