"""transformers model folders (LLaMA, Qwen2) whose decoder layer the block learner (docs/block.md) and the
``--hf-dir`` routes read: random-init via the config class and ``save_pretrained``, offline."""

from __future__ import annotations

from pathlib import Path


def llama_block_folder(folder, *, d: int = 32, heads: int = 2, kv_heads: int = 1, hidden: int = 64, layers: int = 2,
                       seed: int = 0, norm_spread: float = 0.3, eps: float = 1e-6) -> Path:
    """Save a ``LlamaModel`` (``layers`` decoder layers, vocabulary 8) to ``folder`` and return it: width ``d``,
    ``heads``/``kv_heads`` heads, SwiGLU ``hidden``, no attention biases, attention weights N(0, 1/d), the other
    weights N(0, 0.18²) (the config's initializer), norm weights ``1 + norm_spread·N(0, 1)`` (not 1, so folding them
    matters), RMSNorm ε ``eps``."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=hidden, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, num_hidden_layers=layers, vocab_size=8,
                                      rms_norm_eps=eps, attention_bias=False, initializer_range=0.18)
    return _saved(config, folder, d=d, seed=seed, norm_spread=norm_spread)


def qwen2_block_folder(folder, *, d: int = 32, heads: int = 2, kv_heads: int = 1, hidden: int = 64, layers: int = 2,
                       seed: int = 0, norm_spread: float = 0.3, eps: float = 1e-6, bias_std: float = 0.5,
                       base: float = 1e4) -> Path:
    """Save a ``Qwen2Model`` to ``folder`` as :func:`llama_block_folder` does, with Qwen2's q/k/v biases drawn
    N(0, ``bias_std``²) (the research victims' :func:`~.positional_modules.positional_victim` draw them so) and
    rotary base ``base``."""
    import transformers

    config = transformers.Qwen2Config(hidden_size=d, intermediate_size=hidden, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, num_hidden_layers=layers, vocab_size=8,
                                      rms_norm_eps=eps, initializer_range=0.18,
                                      rope_parameters={"rope_type": "default", "rope_theta": base})
    return _saved(config, folder, d=d, seed=seed, norm_spread=norm_spread, bias_std=bias_std)


def _saved(config, folder, *, d: int, seed: int, norm_spread: float, bias_std: float = 0.0) -> Path:
    """``config``'s random-init model with norm weights ``1 + norm_spread·N(0, 1)``, attention weights N(0, 1/d) and
    attention biases N(0, ``bias_std``²), saved to ``folder``."""
    import torch
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(config)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + norm_spread * torch.randn(p.shape, generator=g))
            elif "attn" in name and name.endswith("bias"):
                p.copy_(bias_std * torch.randn(p.shape, generator=g))
            elif "attn" in name:
                p.copy_(torch.randn(p.shape, generator=g) / d**0.5)
    model.save_pretrained(folder)
    return Path(folder)
