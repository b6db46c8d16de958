"""Hugging Face ``transformers`` attention layers as oracles (optional extras ``torch`` and ``hf``).

The victim is the real module of a BERT-family model loaded from a local folder (``config.json`` +
``model.safetensors``; no hub, no network): layer ``L``'s ``BertSelfAttention`` followed by its output dense layer
(``BertSelfOutput.dense``, before the residual and LayerNorm), read at the last position. That is the multi-head
sum of App. C with ``K`` outputs,

    ``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ X V_hᵀ + c``,  ``V_h = W_O[:, h] W_V[h]``,

answered as the whole output row ``(B, K)``, or as one number ``(B,)`` through a readout (an output row ``row`` or
a vector ``readout``) for the scalar learners. The module runs in eval mode (no dropout), without gradients, in
its own dtype (``float64`` or the checkpoint's ``float32``), with an attention mask of ones (every row visible).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.oracles.base import Oracle
from attnprobe.oracles.hf_folder import check_model_dir
from attnprobe.oracles.torch_adapter import TorchFunction, nn, torch

HF_HINT = "pip install 'attnprobe[hf]' (transformers; torch==2.13.0 first)"
#: torch dtypes by the precision names the rest of attnprobe uses
DTYPES = {"float64": torch.float64, "float32": torch.float32}
#: sequences per forward pass: a MiniLM batch of 4096 length-2 rows in float64 holds ~100 MB of activations
MAX_BATCH = 4096


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, even for a missing file
    try:
        import transformers
    except ImportError as exc:
        raise ConfigError(f"Hugging Face models need transformers; run: {HF_HINT}") from exc
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


@functools.lru_cache(maxsize=4)
def _load(path: str, dtype: str):
    transformers = _transformers()
    try:
        model = transformers.AutoModel.from_pretrained(path, local_files_only=True, dtype=DTYPES[dtype],
                                                       attn_implementation="eager")
    except Exception as exc:
        raise ConfigError(f"transformers cannot load {path} offline: {type(exc).__name__}: {exc}") from exc
    return model.to(DTYPES[dtype]).eval()  # whatever the transformers version did with ``dtype``


def load_bert(model_dir, dtype: str = "float64"):
    """The BERT-family model in ``model_dir``, offline, in eval mode and ``dtype`` (cached per process)."""
    if dtype not in DTYPES:
        raise ConfigError(f"The 'dtype' parameter must be one of {', '.join(DTYPES)}; got {dtype!r}", param="dtype")
    return _load(str(check_model_dir(model_dir).resolve()), dtype)


def attention_layers(model) -> list:
    """The ``BertAttention`` modules (``.self`` + ``.output.dense``) of every encoder layer of ``model``."""
    encoder = getattr(getattr(model, "base_model", model), "encoder", None)
    layers = getattr(encoder, "layer", None)
    if layers is None or not all(hasattr(getattr(lay, "attention", None), "self") for lay in layers):
        raise ConfigError(f"{type(model).__name__} is not a BERT-family encoder (no encoder.layer[i].attention."
                          "self); attnprobe reads BertSelfAttention + its output dense layer")
    return [lay.attention for lay in layers]


class HFAttentionLayer(nn.Module):
    """``X (B, N, d) ↦ dense(BertSelfAttention(X))[:, -1]``: the whole output row ``(B, K)`` at the last position,
    or one number per sequence through ``readout`` (a ``(K,)`` vector: ``out · readout``)."""

    def __init__(self, attention, readout=None):
        super().__init__()
        self.attention = attention.eval()
        self.d = int(attention.output.dense.in_features)
        self.K = int(attention.output.dense.out_features)
        self.heads = int(attention.self.num_attention_heads)
        dtype = attention.output.dense.weight.dtype
        self.readout = None if readout is None else torch.as_tensor(np.asarray(readout, dtype=np.float64),
                                                                    dtype=dtype)
        if self.readout is not None and self.readout.shape != (self.K,):
            raise ConfigError(f"the readout must be a vector of the layer's {self.K} outputs; got shape "
                              f"{tuple(self.readout.shape)}")

    def forward(self, X):
        context = self.attention.self(X, attention_mask=None)[0]  # no mask = a mask of ones
        out = self.attention.output.dense(context[:, -1, :])
        return out if self.readout is None else out @ self.readout


def hf_attention_layer(model_dir, layer: int, *, dtype: str = "float64", row: int | None = None,
                       readout=None) -> HFAttentionLayer:
    """Layer ``layer`` of the model in ``model_dir`` as an :class:`HFAttentionLayer`; ``row`` (an output index) or
    ``readout`` (a ``(K,)`` vector) make it answer one number per sequence."""
    layers = attention_layers(load_bert(model_dir, dtype))
    if not 0 <= int(layer) < len(layers):
        raise ConfigError(f"The 'layer' parameter must be in 0..{len(layers) - 1} (the layers of {model_dir}); "
                          f"got {layer}", param="layer")
    attention = layers[int(layer)]
    if row is not None:
        if readout is not None:
            raise ConfigError("give an output row or a readout vector, not both")
        K = attention.output.dense.out_features
        if not 0 <= int(row) < K:
            raise ConfigError(f"The 'row' parameter must be an output index in 0..{K - 1}; got {row}", param="row")
        readout = np.eye(K)[int(row)]
    return HFAttentionLayer(attention, readout)


def oracle_from_hf(model_dir, layer: int, *, dtype: str = "float64", row: int | None = None, readout=None,
                   **kwargs) -> Oracle:
    """An :class:`Oracle` answering with the live torch module of layer ``layer`` (:func:`hf_attention_layer`);
    its precision is the module's dtype unless ``precision`` is given."""
    module = hf_attention_layer(model_dir, layer, dtype=dtype, row=row, readout=readout)
    fn = TorchFunction(module, module.d)
    fn.__name__ = f"{Path(model_dir).name} layer {layer}" + ("" if row is None else f" row {row}")
    if kwargs.get("precision") is None:
        kwargs["precision"] = dtype
    kwargs.setdefault("max_batch", MAX_BATCH)
    if module.readout is None:
        kwargs.setdefault("outputs", module.K)
    return Oracle(fn, module.d, name=kwargs.pop("name", fn.__name__), **kwargs)
