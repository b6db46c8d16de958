"""Pure numpy forward maps; parameters as frozen dataclasses; batched (B, N, d) -> (B,)."""

from attnprobe.models.attention import AttentionHead, as_batch
from attnprobe.models.block import TransformerBlock
from attnprobe.models.gated_ffn import GatedFFN
from attnprobe.models.ffn import ReLUNet, canonical_neurons, neuron_errors
from attnprobe.models.io import load_model, register, save_model
from attnprobe.models.multihead import HeadMatch, MultiHeadAttention, match_heads
from attnprobe.models.positional import PositionalAttention
from attnprobe.models.precision import PRECISIONS, resolve_dtype, unit_roundoff
from attnprobe.models.smooth_ffn import SmoothFFN
from attnprobe.models.transformer import MultiHeadTransformer, OneLayerTransformer

register(AttentionHead)
register(ReLUNet)
register(OneLayerTransformer)
register(MultiHeadAttention)
register(MultiHeadTransformer)
register(PositionalAttention)
register(SmoothFFN)
register(GatedFFN)
register(TransformerBlock)

__all__ = ["AttentionHead", "MultiHeadAttention", "HeadMatch", "match_heads", "ReLUNet", "SmoothFFN", "GatedFFN",
           "TransformerBlock", "OneLayerTransformer", "MultiHeadTransformer", "PositionalAttention",
           "canonical_neurons", "neuron_errors",
           "as_batch", "load_model", "save_model", "register", "PRECISIONS", "resolve_dtype", "unit_roundoff"]
