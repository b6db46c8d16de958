"""Ready-made victims: seeded random heads and heads of the real MiniLM-L6 model."""

from attnprobe.targets.minilm import minilm_head
from attnprobe.targets.random_heads import random_head

__all__ = ["minilm_head", "random_head"]
