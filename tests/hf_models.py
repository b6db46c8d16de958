"""Small Hugging Face model folders (config.json + model.safetensors) with seeded random weights, for tests: BERT
and every family attnprobe reads (:data:`FAMILY_CONFIGS`), built with ``transformers``' config classes, offline."""

from __future__ import annotations

from pathlib import Path

#: per family: the config class name and its arguments for a model of width ``hidden`` with ``heads`` heads and
#: ``layers`` layers (``kv`` KV heads where the family has them)
FAMILY_CONFIGS = {
    "bert": ("BertConfig", lambda h, H, L, kv: dict(hidden_size=h, num_attention_heads=H, num_hidden_layers=L,
                                                     intermediate_size=2 * h)),
    "roberta": ("RobertaConfig", lambda h, H, L, kv: dict(hidden_size=h, num_attention_heads=H, num_hidden_layers=L,
                                                           intermediate_size=2 * h)),
    "electra": ("ElectraConfig", lambda h, H, L, kv: dict(hidden_size=h, num_attention_heads=H, num_hidden_layers=L,
                                                           intermediate_size=2 * h, embedding_size=h)),
    "distilbert": ("DistilBertConfig", lambda h, H, L, kv: dict(dim=h, n_heads=H, n_layers=L, hidden_dim=2 * h)),
    "albert": ("AlbertConfig", lambda h, H, L, kv: dict(hidden_size=h, num_attention_heads=H, num_hidden_layers=L,
                                                         intermediate_size=2 * h, embedding_size=h)),
    "gpt2": ("GPT2Config", lambda h, H, L, kv: dict(n_embd=h, n_head=H, n_layer=L, n_positions=16)),
    "llama": ("LlamaConfig", lambda h, H, L, kv: dict(hidden_size=h, num_attention_heads=H, num_key_value_heads=kv,
                                                       num_hidden_layers=L, intermediate_size=2 * h,
                                                       attention_bias=True, head_dim=h // H)),
    "qwen2": ("Qwen2Config", lambda h, H, L, kv: dict(hidden_size=h, num_attention_heads=H, num_key_value_heads=kv,
                                                       num_hidden_layers=L, intermediate_size=2 * h)),
    "mistral": ("MistralConfig", lambda h, H, L, kv: dict(hidden_size=h, num_attention_heads=H,
                                                           num_key_value_heads=kv, num_hidden_layers=L,
                                                           intermediate_size=2 * h, head_dim=h // H)),
    "gpt_neox": ("GPTNeoXConfig", lambda h, H, L, kv: dict(hidden_size=h, num_attention_heads=H, num_hidden_layers=L,
                                                            intermediate_size=2 * h)),
    "t5": ("T5Config", lambda h, H, L, kv: dict(d_model=h, num_heads=H, num_layers=L, d_kv=h // H, d_ff=2 * h,
                                                 num_decoder_layers=1)),
    "bloom": ("BloomConfig", lambda h, H, L, kv: dict(hidden_size=h, n_head=H, n_layer=L)),
}


def tiny_family_dir(folder, family: str, *, hidden: int = 16, heads: int = 2, layers: int = 2, kv_heads=None,
                    seed: int = 0, std: float = 0.5, **extra) -> Path:
    """Save a random-init base model of ``family`` to ``folder`` (attention weights and biases N(0, std²), so
    attention is far from uniform) and return the folder; ``extra`` goes to the config class."""
    import torch
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    cls_name, make = FAMILY_CONFIGS[family]
    kw = make(hidden, heads, layers, kv_heads or heads)
    kw.update(vocab_size=8, initializer_range=std, **extra)
    config = getattr(transformers, cls_name)(**kw)
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(config)
    with torch.no_grad():  # biases are zero at init: give them values too
        for name, p in model.named_parameters():
            low = name.lower()
            if ("attn" in low or "attention" in low) and "norm" not in low:
                p.normal_(0.0, std)
    folder = Path(folder)
    model.save_pretrained(folder)
    return folder


def tiny_bert_dir(folder, *, hidden: int = 16, heads: int = 2, layers: int = 2, seed: int = 0,
                  std: float = 0.5) -> Path:
    """Save a ``BertModel`` of width ``hidden`` with ``heads`` heads per layer to ``folder`` (weights N(0, std²),
    so attention is far from uniform) and return the folder."""
    import torch
    from transformers import BertConfig, BertModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    config = BertConfig(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                        intermediate_size=2 * hidden, vocab_size=8, max_position_embeddings=8,
                        initializer_range=std)
    torch.manual_seed(seed)
    model = BertModel(config)
    with torch.no_grad():  # biases are zero at init: give them values too
        for name, p in model.named_parameters():
            if "attention" in name and name.endswith("bias"):
                p.normal_(0.0, std)
    folder = Path(folder)
    model.save_pretrained(folder)
    return folder
