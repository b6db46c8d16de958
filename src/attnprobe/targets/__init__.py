"""Ready-made victims: seeded random heads and heads of the real MiniLM-L6 model."""

from attnprobe.targets.bert import BertCheckpoint
from attnprobe.targets.minilm import minilm_checkpoint, minilm_head
from attnprobe.targets.random_heads import random_head
from attnprobe.targets.transformers import random_relu_net, random_transformer

__all__ = ["BertCheckpoint", "minilm_checkpoint", "minilm_head", "random_head", "random_relu_net", "random_transformer"]
