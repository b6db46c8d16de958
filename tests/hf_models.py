"""Small Hugging Face BERT folders (config.json + model.safetensors) with seeded random weights, for tests."""

from __future__ import annotations

from pathlib import Path


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
