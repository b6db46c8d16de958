"""A transformers LLaMA model folder whose decoder layer the block learner reads (docs/block.md): random-init via
the config class and ``save_pretrained``, offline."""

from __future__ import annotations

from pathlib import Path


def llama_block_folder(folder, *, d: int = 32, heads: int = 2, kv_heads: int = 1, hidden: int = 64, layers: int = 2,
                       seed: int = 0, norm_spread: float = 0.3, eps: float = 1e-6) -> Path:
    """Save a ``LlamaModel`` (``layers`` decoder layers, vocabulary 8) to ``folder`` and return it: width ``d``,
    ``heads``/``kv_heads`` heads, SwiGLU ``hidden``, no attention biases, attention weights N(0, 1/d), the other
    weights N(0, 0.18²) (the config's initializer), norm weights ``1 + norm_spread·N(0, 1)`` (not 1, so folding them
    matters), RMSNorm ε ``eps``."""
    import torch
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=hidden, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, num_hidden_layers=layers, vocab_size=8,
                                      rms_norm_eps=eps, attention_bias=False, initializer_range=0.18)
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(config)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + norm_spread * torch.randn(p.shape, generator=g))
            elif "attn" in name:
                p.copy_(torch.randn(p.shape, generator=g) / d**0.5)
    model.save_pretrained(folder)
    return Path(folder)
