"""Ready-made victims: seeded random heads and heads of the real MiniLM-L6 model."""

from attnprobe.targets.bert import BertCheckpoint
from attnprobe.targets.minilm import minilm_checkpoint, minilm_ffn, minilm_head, minilm_layer
from attnprobe.targets.multihead import (orthogonal_subspaces, random_multihead, random_orthogonal_multihead,
                                         shared_attention_multihead)
from attnprobe.targets.positional import random_rope_attention
from attnprobe.targets.random_heads import random_head
from attnprobe.targets.smooth_ffn import random_gated_ffn, random_smooth_ffn
from attnprobe.targets.transformers import random_multihead_transformer, random_relu_net, random_transformer

__all__ = ["BertCheckpoint", "minilm_checkpoint", "minilm_ffn", "minilm_head", "minilm_layer", "orthogonal_subspaces",
           "random_multihead", "random_orthogonal_multihead", "shared_attention_multihead", "random_head",
           "random_relu_net", "random_smooth_ffn", "random_gated_ffn", "random_transformer",
           "random_multihead_transformer",
           "random_rope_attention"]
