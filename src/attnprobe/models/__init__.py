"""Pure numpy forward maps; parameters as frozen dataclasses; batched (B, N, d) -> (B,)."""

from attnprobe.models.attention import AttentionHead, as_batch
from attnprobe.models.io import load_model, register, save_model
from attnprobe.models.precision import PRECISIONS, resolve_dtype, unit_roundoff

register(AttentionHead)

__all__ = ["AttentionHead", "as_batch", "load_model", "save_model", "register", "PRECISIONS",
           "resolve_dtype", "unit_roundoff"]
