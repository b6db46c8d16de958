"""Hugging Face ``transformers`` attention sublayers as oracles (optional extras ``torch`` and ``hf``).

The victim is the real attention module of layer ``L`` of a model loaded from a local folder (``config.json`` +
``model.safetensors``; no hub, no network), of any family in :mod:`attnprobe.oracles.hf_families` (BERT, RoBERTa,
ELECTRA, DistilBERT, ALBERT, GPT-2, LLaMA, Qwen2, Mistral, GPT-NeoX, T5, BLOOM). The module runs its own forward
and kernel (eager attention), in eval mode (no dropout), without gradients, in its own dtype (``float64``,
``float32`` or ``bfloat16``), with the family's causal mask and position terms; the answer is the output of its
output projection (``W_O``), read by a forward hook, before any residual or normalisation (ALBERT's attention
returns ``LayerNorm(X + attn)``: the hook reads ``attn``). For a family without position terms that is the
multi-head sum of App. C with ``K`` outputs,

    ``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ X V_hᵀ + c``,  ``V_h = W_O[:, h] W_V[g(h)]``,

answered as the whole output row ``(B, K)`` at the last position, every row ``(B, N, K)``
(``every_position=True``), or one number ``(B,)`` through a readout (an output row ``row`` or a vector
``readout``) for the scalar learners.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError, MissingDependencyError
from attnprobe.oracles.base import Oracle
from attnprobe.models.precision import coarser
from attnprobe.oracles.hf_families import LayerSpec, layer_spec, split_projections
from attnprobe.oracles.hf_folder import check_model_dir
from attnprobe.oracles.torch_adapter import TorchFunction, nn, torch

#: the positional learner's name for each family position scheme
POSITION_TERMS = {"rope": "rope", "relative_bias": "t5", "alibi": "alibi"}

HF_HINT = "pip install 'attnprobe[hf]' (transformers; torch==2.13.0 first)"
#: torch dtypes by the precision names the rest of attnprobe uses
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
#: sequences per forward pass: a MiniLM batch of 4096 length-2 rows in float64 holds ~100 MB of activations
MAX_BATCH = 4096


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, even for a missing file
    try:
        import transformers
    except ImportError as exc:
        raise MissingDependencyError(f"Hugging Face models need transformers; run: {HF_HINT}") from exc
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


@functools.lru_cache(maxsize=4)
def _load(path: str, dtype: str, attention: str = "eager"):
    transformers = _transformers()
    try:
        model = transformers.AutoModel.from_pretrained(path, local_files_only=True, dtype=DTYPES[dtype],
                                                       attn_implementation=attention)
    except Exception as exc:
        raise ConfigError(f"transformers cannot load {path} offline: {type(exc).__name__}: {exc}",
                          param="model_dir") from exc
    return model.to(DTYPES[dtype]).eval()  # whatever the transformers version did with ``dtype``


def load_hf_model(model_dir, dtype: str = "float64", attention: str = "eager"):
    """The base model (``AutoModel``) in ``model_dir``, offline, in eval mode and ``dtype``, with transformers'
    ``attention`` implementation (``eager``, the default, or ``sdpa``; cached per process)."""
    if dtype not in DTYPES:
        raise ConfigError(f"The 'dtype' parameter must be one of {', '.join(DTYPES)}; got {dtype!r}", param="dtype")
    if attention not in ("eager", "sdpa"):
        raise ConfigError(f"The 'attention' parameter must be eager or sdpa; got {attention!r}", param="attention")
    return _load(str(check_model_dir(model_dir).resolve()), dtype, attention)


def additive_mask(spec: LayerSpec, N: int, dtype):
    """The family's additive mask ``(1, 1, N, N)``: causal (and windowed), or ``None``."""
    if not spec.causal:
        return None
    i = torch.arange(N)
    hidden = i[None, :] > i[:, None]
    if spec.window:
        hidden |= i[None, :] <= i[:, None] - int(spec.window)
    zero = torch.zeros((N, N), dtype=dtype)
    return zero.masked_fill(hidden, torch.finfo(dtype).min)[None, None]


class HFAttentionLayer(nn.Module):
    """``X (B, N, d) ↦`` the output projection of layer ``layer``'s attention module on ``X``: the whole output
    row ``(B, K)`` at the last position, every row ``(B, N, K)`` (``every_position``), or one number per sequence
    through ``readout`` (a ``(K,)`` vector: ``out · readout``)."""

    def __init__(self, model, spec: LayerSpec, layer: int, readout=None, every_position: bool = False):
        super().__init__()
        self.spec, self.layer = spec, spec.check_layer(layer)
        object.__setattr__(self, "base", getattr(model, "base_model", model))  # not a submodule: not in state_dict
        self.attention = self.base.get_submodule(spec.module_path(layer)).eval()
        self.out = self.attention.get_submodule(spec.family.out)
        self.d, self.heads = spec.hidden, spec.heads
        self.K = int(self.out.weight.shape[1] if spec.family.conv1d else self.out.weight.shape[0])
        self.every_position = bool(every_position)
        dtype = self.out.weight.dtype
        self.readout = None if readout is None else torch.as_tensor(np.asarray(readout, dtype=np.float64),
                                                                    dtype=dtype)
        if self.readout is not None and self.readout.shape != (self.K,):
            raise ConfigError(f"the readout must be a vector of the layer's {self.K} outputs; got shape "
                              f"{tuple(self.readout.shape)}", param="readout")

    @property
    def positions(self) -> str:
        """What the rows are: ``"positional"`` (the logits depend on position), ``"causal"`` (row i answers
        ``X[:i+1]``) or ``"bidirectional"`` (row i answers ``X`` with ``x_i`` moved last)."""
        if self.spec.causal:  # RoPE and ALiBi are relative: row i is still the answer on the prefix X[:i+1]
            return "causal"
        return "positional" if self.spec.positional else "bidirectional"

    def projections(self) -> dict:
        """The live module's float64 weights per head
        (:func:`~attnprobe.oracles.hf_families.split_projections`)."""
        state = {k: v.detach().to(torch.float64).cpu().numpy() for k, v in self.attention.state_dict().items()}
        return split_projections(self.spec, state.get, f"{self.spec.folder} layer {self.layer}")

    def _mask(self, N: int, dtype):
        return additive_mask(self.spec, N, dtype)

    def _arguments(self, X) -> dict:
        """What the family's attention forward needs besides the hidden states: mask, position terms."""
        B, N, _ = X.shape
        mask, call = self._mask(N, X.dtype), self.spec.family.call
        if call == "rope":
            positions = torch.arange(N)[None].expand(B, N)
            return {"attention_mask": mask, "position_embeddings": self.base.rotary_emb(X, positions)}
        if call == "t5":  # the relative bias lives in block 0 and is shared by every layer
            first = self.base.encoder.block[0].layer[0].SelfAttention
            return {"mask": None, "position_bias": first.compute_bias(N, N).to(X.dtype)}
        if call == "bloom":
            alibi = self.base.build_alibi_tensor(torch.ones((B, N), dtype=torch.long), self.heads, X.dtype)
            return {"residual": torch.zeros_like(X), "alibi": alibi, "attention_mask": mask}
        return {"attention_mask": mask}

    def forward(self, X):
        captured = []
        handle = self.out.register_forward_hook(lambda module, args, output: captured.append(output))
        try:
            self.attention(X, **self._arguments(X))
        finally:
            handle.remove()
        out = captured[-1] if self.every_position else captured[-1][:, -1]
        return out if self.readout is None else out @ self.readout


def hf_attention_layer(model_dir, layer: int, *, dtype: str = "float64", row: int | None = None,
                       readout=None, every_position: bool = False, positional: bool = False) -> HFAttentionLayer:
    """Layer ``layer`` of the model in ``model_dir`` as an :class:`HFAttentionLayer`; ``row`` (an output index) or
    ``readout`` (a ``(K,)`` vector) make it answer one number per sequence. A family whose logits depend on
    position is refused unless ``positional`` (a learner that models position asks for it)."""
    spec = layer_spec(model_dir)
    if not positional:
        spec.refuse_positional()
    spec.check_layer(layer)
    model = load_hf_model(model_dir, dtype)
    if row is not None:
        if readout is not None:
            raise ConfigError("give an output row or a readout vector, not both", param="readout")
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= int(row) < spec.hidden:
            raise ConfigError(f"The 'row' parameter must be an output index in 0..{spec.hidden - 1}; got {row}",
                              param="row")
        readout = np.eye(spec.hidden)[int(row)]
    return HFAttentionLayer(model, spec, layer, readout, every_position)


def oracle_from_hf(model_dir, layer: int, *, dtype: str = "float64", row: int | None = None, readout=None,
                   every_position: bool = False, positional: bool = False, **kwargs) -> Oracle:
    """An :class:`Oracle` answering with the live torch module of layer ``layer`` (:func:`hf_attention_layer`);
    its precision is the module's dtype, coarsened to the kernel's softmax dtype where the family computes its
    softmax in float32 (LLaMA-family eager attention, BLOOM), unless ``precision`` is given."""
    module = hf_attention_layer(model_dir, layer, dtype=dtype, row=row, readout=readout,
                                every_position=every_position, positional=positional)
    fn = TorchFunction(module, module.d)
    fn.__name__ = f"{Path(model_dir).name} layer {layer}" + ("" if row is None else f" row {row}")
    if every_position:  # what the rows are, declared from the family (an Oracle need not probe for it)
        fn.positions = module.positions
    if module.spec.positional:  # the position term, declared from the family (the positional learner's route)
        fn.position_term = POSITION_TERMS[module.spec.family.position]
        fn.heads = module.heads  # the config's heads (a route that cannot read them from coarse answers)
        fn.qk_biases = bool({"q", "k"} & set(module.spec.biases))
        fn.biases = "".join(sorted(module.spec.biases))  # the letters of the biases it has (the polish holds the rest)
        if module.spec.rotary is not None:  # the config's rotation (public, as its heads): a route may hold it
            fn.rotary_frequencies = module.spec.rotary.frequencies()
    if kwargs.get("precision") is None:
        kwargs["precision"] = coarser(dtype, module.spec.softmax_dtype or dtype)
        if kwargs["precision"] != dtype:  # said with every message that names the precision (cli.common)
            rotary = " (and transformers its rotary angles)" if module.spec.family.position == "rope" else ""
            fn.precision_cause = (f"the {dtype} module's eager kernel computes its softmax{rotary} in "
                                  f"{module.spec.softmax_dtype}")
    kwargs.setdefault("max_batch", MAX_BATCH)
    if module.readout is None:
        kwargs.setdefault("outputs", module.K)
    return Oracle(fn, module.d, name=kwargs.pop("name", fn.__name__), **kwargs)
