"""A Hugging Face model's whole block ``L`` as an oracle: hidden states ``(B, N, d)`` in, the block's output
``(B, N, d)`` out at every position — what a block server (decentralised or split inference) answers.

The victim is the real layer module (``BertLayer``, ``LlamaDecoderLayer``, ``Qwen2DecoderLayer``,
``MistralDecoderLayer``, ``GPTNeoXLayer``) of a model loaded offline from its folder, in eval mode, without
gradients, in ``dtype``. Two of transformers' float32 detours are taken out of a **float64** victim, so that it is
float64 throughout (as :mod:`attnprobe.targets.positional_modules` does for the rotary angles): the rotary angles
are computed in float64 from the config's frequencies and passed as ``position_embeddings``, and the RMSNorms
compute in the input's dtype (``LlamaRMSNorm`` casts to float32 whatever the module's dtype); attention runs
through SDPA (the eager LLaMA kernel takes its softmax in float32). Float32 and bfloat16 victims run unchanged.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.block import TransformerBlock
from attnprobe.models.gated_ffn import GatedFFN
from attnprobe.models.positional import PositionalAttention
from attnprobe.models.smooth_ffn import SmoothFFN
from attnprobe.oracles.base import Oracle
from attnprobe.oracles.hf_attention import DTYPES, additive_mask, load_hf_model
from attnprobe.oracles.hf_families import LayerSpec, layer_spec, split_projections
from attnprobe.oracles.torch_adapter import TorchFunction, nn, torch

#: sequences per forward pass of a block (its FFN's activations are 4× wider than the attention's)
MAX_BATCH = 1024


@dataclass(frozen=True)
class BlockParts:
    """Where a family keeps a block's parts, relative to the base model and to the layer module."""

    layer: str
    layout: str
    norm: str
    norm1: str
    norm2: str
    up: str
    down: str
    gate: str | None = None
    eps_key: str = "layer_norm_eps"


_BERT = BlockParts("encoder.layer.{i}", "post", "layer", "attention.output.LayerNorm", "output.LayerNorm",
                   "intermediate.dense", "output.dense")
_LLAMA = BlockParts("layers.{i}", "pre", "rms", "input_layernorm", "post_attention_layernorm", "mlp.up_proj",
                    "mlp.down_proj", gate="mlp.gate_proj", eps_key="rms_norm_eps")
#: the families whose whole blocks attnprobe reads (model_type -> parts)
BLOCK_FAMILIES: dict[str, BlockParts] = {
    "bert": _BERT, "roberta": _BERT, "electra": _BERT,
    "llama": _LLAMA, "qwen2": _LLAMA, "mistral": _LLAMA,
    "gpt_neox": BlockParts("layers.{i}", "parallel", "layer", "input_layernorm", "post_attention_layernorm",
                           "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
}
#: transformers' activation names -> attnprobe's smooth activations
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu",
                  "swish": "silu"}


def block_spec(model_dir) -> tuple[LayerSpec, BlockParts, str]:
    """The folder's attention spec, its family's block parts and layout (GPT-NeoX's ``use_parallel_residual``)."""
    spec = layer_spec(model_dir)
    if spec.name not in BLOCK_FAMILIES:
        raise ConfigError(f"{spec.folder} is a {spec.name} model; attnprobe serves and reads whole blocks of "
                          f"{', '.join(BLOCK_FAMILIES)} models", param="hf_dir")
    parts = BLOCK_FAMILIES[spec.name]
    layout = parts.layout
    if spec.name == "gpt_neox" and not spec.config.get("use_parallel_residual", True):
        layout = "pre"
    act = spec.config.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ConfigError(f"{spec.folder}: the FFN's activation {act!r} is none of {', '.join(HF_ACTIVATIONS)}",
                          param="hf_dir")
    return spec, parts, layout


def post_norm_width(model_dir) -> int | None:
    """The FFN's width (config.json's ``intermediate_size``) of a folder whose blocks are post-norm (BERT,
    RoBERTa, ELECTRA): the post-norm block learner's neurons stage reads the first layer given it; None for other
    layouts (a pre-norm block's learner searches its width)."""
    spec, _, layout = block_spec(model_dir)
    width = spec.config.get("intermediate_size")
    return int(width) if layout == "post" and width else None


def inv_freq(spec: LayerSpec) -> np.ndarray | None:
    """The rotary frequencies of the folder's config (float64), None without RoPE."""
    if spec.rotary is None:
        return None
    return spec.rotary.frequencies()


def _rms_in_dtype(self, hidden_states):
    """RMSNorm computed in the input's dtype (transformers' casts to float32 first)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


class HFBlock(nn.Module):
    """``X (B, N, d) ↦`` layer ``block``'s output at every position ``(B, N, d)`` (module docstring)."""

    def __init__(self, model, spec: LayerSpec, parts: BlockParts, layout: str, block: int):
        super().__init__()
        self.spec, self.parts, self.layout = spec, parts, layout
        self.block = spec.check_layer(block)
        object.__setattr__(self, "base", getattr(model, "base_model", model))
        self.layer = self.base.get_submodule(parts.layer.format(i=block)).eval()
        self.d = spec.hidden
        self.dtype = next(self.layer.parameters()).dtype
        self.inv_freq = inv_freq(spec)
        if self.dtype == torch.float64 and parts.norm == "rms":
            for name in (parts.norm1, parts.norm2):
                norm = self.layer.get_submodule(name)
                norm.forward = types.MethodType(_rms_in_dtype, norm)

    @property
    def positions(self) -> str:
        if self.spec.positional:
            return "positional"
        return "causal" if self.spec.causal else "bidirectional"

    def forward(self, X):
        B, N, _ = X.shape
        kw = {"attention_mask": additive_mask(self.spec, N, X.dtype)}
        if self.inv_freq is not None:
            freqs = np.arange(N, dtype=np.float64)[:, None] * self.inv_freq[None, :]
            emb = np.concatenate([freqs, freqs], axis=-1)[None]  # rotate-half: (1, N, rotary_dim)
            kw["position_embeddings"] = (torch.as_tensor(np.cos(emb), dtype=X.dtype),
                                         torch.as_tensor(np.sin(emb), dtype=X.dtype))
            kw["position_ids"] = torch.arange(N)[None].expand(B, N)
        out = self.layer(X, **kw)
        return out[0] if isinstance(out, tuple) else out


def _np(t) -> np.ndarray | None:
    return None if t is None else t.detach().to(torch.float64).cpu().numpy()


def block_model(victim: HFBlock, dtype: str = "float64") -> TransformerBlock:
    """The victim's function as a :class:`~attnprobe.models.block.TransformerBlock` read from the live module's
    float64 weights (the truth tests and benchmarks compare with). A sliding window (Mistral's ``sliding_window``,
    Qwen2's with ``use_sliding_window``) is not in the model: it answers like the layer for ``N ≤ window`` only."""
    spec, parts, layer = victim.spec, victim.parts, victim.layer
    attn = victim.base.get_submodule(spec.module_path(victim.block))
    state = {k: v.detach().to(torch.float64).cpu().numpy() for k, v in attn.state_dict().items()}
    p = split_projections(spec, state.get, f"{spec.folder} layer {victim.block}")
    position = "rope" if spec.rotary is not None else "none"
    attention = PositionalAttention(p["Q"], p["K"], p["V"], p["WO"], p["bQ"], p["bK"], p["bV"], p["bO"],
                                    position=position, inv_freq=victim.inv_freq, layout="half",
                                    scale=spec.logit_scale(victim.block), causal=spec.causal, dtype=dtype)
    n1, n2 = layer.get_submodule(parts.norm1), layer.get_submodule(parts.norm2)
    up, down = layer.get_submodule(parts.up), layer.get_submodule(parts.down)
    gate = None if parts.gate is None else layer.get_submodule(parts.gate)
    eps = getattr(n1, "variance_epsilon", getattr(n1, "eps", None))
    ffn = block_ffn(up, down, gate, HF_ACTIVATIONS[spec.config.get("hidden_act", "gelu")])
    return TransformerBlock(attention, ffn, _np(n1.weight), _np(n2.weight), norm1_b=_np(getattr(n1, "bias", None)),
                            norm2_b=_np(getattr(n2, "bias", None)), norm=parts.norm, eps=float(eps),
                            layout=victim.layout, dtype=dtype)


def block_ffn(up, down, gate, activation: str) -> SmoothFFN | GatedFFN:
    """The FFN of a block from its ``nn.Linear`` projections (``gate`` None for a plain FFN; absent biases zeros)."""
    def bias(linear):
        return np.zeros(linear.out_features) if linear.bias is None else _np(linear.bias)

    if gate is None:
        return SmoothFFN(_np(up.weight), bias(up), _np(down.weight), bias(down), activation)
    return GatedFFN(_np(gate.weight), bias(gate), _np(up.weight), bias(up), _np(down.weight), bias(down), activation)


def hf_block(model_dir, block: int, *, dtype: str = "float64") -> HFBlock:
    """Block ``block`` of the model in ``model_dir`` as an :class:`HFBlock`."""
    spec, parts, layout = block_spec(model_dir)
    spec.check_layer(block)
    model = load_hf_model(model_dir, dtype, attention="sdpa")
    return HFBlock(model, spec, parts, layout, block)


def oracle_from_hf_block(model_dir, block: int, *, dtype: str = "float64", **kwargs) -> Oracle:
    """An :class:`Oracle` answering every position with block ``block`` of the model in ``model_dir``."""
    if dtype not in DTYPES:
        raise ConfigError(f"The 'dtype' parameter must be one of {', '.join(DTYPES)}; got {dtype!r}", param="dtype")
    module = hf_block(model_dir, block, dtype=dtype)
    fn = TorchFunction(module, module.d)
    fn.__name__ = f"{Path(model_dir).name} block {block}"
    fn.positions = module.positions
    kwargs.setdefault("precision", dtype)
    kwargs.setdefault("max_batch", MAX_BATCH)
    kwargs.setdefault("outputs", module.d)
    return Oracle(fn, module.d, name=kwargs.pop("name", fn.__name__), **kwargs)
