"""Whole transformer blocks (docs/block.md): a learner in progress, not registered yet (the CLI refuses the
method ``block`` before any query and says why).

What is built: the model (:class:`attnprobe.models.block.TransformerBlock`, pre-norm, parallel and post-norm
layouts, checked against transformers' layer modules), its gauges (:func:`attnprobe.models.block.fold_norm_weights`,
:func:`attnprobe.models.block.flip_post_norm_sign`), the victims (:mod:`attnprobe.oracles.hf_block`), the measured
levers (:mod:`.levers`), the sublayer oracles a pre-norm RMSNorm block splits into through its norm's inverse
(:mod:`.sublayers`), a Gauss–Newton polish of RoPE attention on last-row answers (:mod:`.polish`) and the learner
that chains them (:func:`.learner.extract_block`: bias-free LLaMA blocks; measured in docs/block.md, not within the
issue's 1e-6 yet, hence not registered).
"""
