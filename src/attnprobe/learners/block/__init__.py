"""Whole transformer blocks (docs/block.md): not learned yet.

What is built: the model (:class:`attnprobe.models.block.TransformerBlock`, pre-norm, parallel and post-norm
layouts, checked against transformers' layer modules), its gauges (:func:`attnprobe.models.block.fold_norm_weights`,
:func:`attnprobe.models.block.flip_post_norm_sign`: what the answers cannot fix), the victims (``extract --hf-dir
DIR --block L``, ``serve --hf-dir DIR --block L``) and measured prototypes of the levers a learner would pull
(:mod:`.levers`: the last token driven out, zero keys that leave the FFN alone — a pre-norm block split into its
attention and FFN oracles — and the output LayerNorm read from the answers; measured in
``benchmarks/block_levers.py``). No learner is registered: ``extract --method block`` is refused before any query
with :data:`REFUSAL`, which says why.
"""

#: the one-line refusal of ``--method block`` (the CLI prints it, exit 2, before any query)
REFUSAL = ("--method block: no learner recovers whole blocks yet (a pre-norm block's answers split into its "
           "attention and FFN oracles, but those see only normalised rows, which the attention and FFN learners "
           "do not read yet); docs/block.md says what is identifiable and what the measured levers give; learn the "
           "block's sublayers from their own answers (--method positional / multihead / ffn) where a server "
           "exposes them")
