"""Random-init ``transformers`` attention modules with a position term, as victims (optional extras ``torch``, ``hf``).

Each victim wraps the family's own attention module (built from its config class, eval mode, no gradients):
``LlamaAttention`` (RoPE + GQA), ``Qwen2Attention`` (RoPE + GQA + q/k/v biases), ``GPTNeoXAttention`` (partial
rotary, fused q/k/v with biases), ``T5Attention`` (relative position bias, bidirectional) and ``BloomAttention``
(ALiBi, fused q/k/v with biases; it computes its softmax in float32 whatever the module's dtype). The input is the
sublayer's hidden states ``X (B, N, d)``; the answer is the output row before the residual: ``(B, K)`` at the last
position, or ``(B, N, K)`` from :meth:`every_position`. Rotary angles are computed in float64 from the frequencies
of the config (the modules take them as ``position_embeddings=(cos, sin)``), so a float64 module is float64
throughout; :func:`reference_model` reads the same function into a :class:`PositionalAttention`.
"""

from __future__ import annotations

import math
import os

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.positional import PositionalAttention, rope_frequencies
from attnprobe.oracles.torch_adapter import nn, torch

#: the families this module builds
FAMILIES = ("llama", "qwen2", "gpt_neox", "t5", "bloom")
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    return transformers


class PositionalVictim(nn.Module):
    """``X (B, N, d) ↦`` the attention module's output row at the last position ``(B, K)``."""

    def __init__(self, family: str, module, config, inv_freq: np.ndarray | None, rotary_dim: int | None):
        super().__init__()
        self.family, self.attn, self.config = family, module.eval(), config
        self.inv_freq = None if inv_freq is None else np.asarray(inv_freq, dtype=np.float64)
        self.rotary_dim = rotary_dim
        self.d = int(config.hidden_size if family != "t5" else config.d_model)
        self.dtype = next(module.parameters()).dtype

    def _rope(self, N: int, dtype):
        freqs = np.arange(N, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1)[None]  # HF rotate-half: (1, N, rotary_dim)
        return (torch.as_tensor(np.cos(emb), dtype=dtype), torch.as_tensor(np.sin(emb), dtype=dtype))

    def every_position(self, X):
        """The output row at every position: (B, N, K) (a tensor in, a tensor out)."""
        X = torch.as_tensor(X, dtype=self.dtype)
        B, N, _ = X.shape
        with torch.no_grad():
            if self.family in ("llama", "qwen2"):
                out = self.attn(X, position_embeddings=self._rope(N, X.dtype), attention_mask=None)[0]
            elif self.family == "gpt_neox":
                out = self.attn(X, attention_mask=None, position_embeddings=self._rope(N, X.dtype))[0]
            elif self.family == "t5":
                out = self.attn(X, mask=None)[0]
            else:  # bloom: ALiBi from the key positions, causal mask as an additive -inf
                from transformers.models.bloom.modeling_bloom import build_alibi_tensor

                ones = torch.ones(B, N, dtype=torch.long)
                alibi = build_alibi_tensor(ones, self.attn.num_heads, X.dtype)
                mask = torch.triu(torch.full((N, N), float("-inf"), dtype=X.dtype), diagonal=1)[None, None]
                out = self.attn(X, torch.zeros_like(X), alibi, mask)[0]
        return out

    def forward(self, X):
        return self.every_position(X)[:, -1, :]


def _config(family: str, d: int, heads: int, kv_heads: int, rope: dict | None, rotary_pct: float, buckets: int,
            max_distance: int):
    t = _transformers()
    if family in ("llama", "qwen2"):
        cls = t.LlamaConfig if family == "llama" else t.Qwen2Config
        kw = dict(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=4 * d,
                  num_hidden_layers=1, rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0})
        if family == "llama":
            kw["attention_bias"] = False
        cfg = cls(**kw)
    elif family == "gpt_neox":
        cfg = t.GPTNeoXConfig(hidden_size=d, num_attention_heads=heads, intermediate_size=4 * d, num_hidden_layers=1,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": rotary_pct}, attention_bias=True)
    elif family == "t5":
        cfg = t.T5Config(d_model=d, d_kv=d // heads, num_heads=heads, d_ff=4 * d, num_layers=1,
                         relative_attention_num_buckets=buckets, relative_attention_max_distance=max_distance,
                         is_decoder=False)
    elif family == "bloom":
        cfg = t.BloomConfig(hidden_size=d, n_head=heads, n_layer=1)
    else:
        raise ConfigError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}", param="family")
    cfg._attn_implementation = "sdpa" if family in ("llama", "qwen2", "gpt_neox") else "eager"
    return cfg


def positional_victim(family: str, *, d: int = 128, heads: int = 8, kv_heads: int | None = None, seed: int = 0,
                      dtype: str = "float64", bias_std: float = 0.5, rope: dict | None = None,
                      rotary_pct: float = 0.25, buckets: int = 32, max_distance: int = 128,
                      weight_std: float | None = None) -> PositionalVictim:
    """A random-init attention module of ``family`` (:data:`FAMILIES`) at width ``d`` in ``dtype``.

    ``kv_heads``: GQA groups (LLaMA, Qwen2; default ``heads // 4``); ``rope``: the config's ``rope_parameters``
    (default plain RoPE, base 1e4); ``rotary_pct``: GPT-NeoX's rotated share of each head; biases are drawn
    N(0, ``bias_std``²) where the family has them; weights N(0, ``weight_std``²) (default ``1/√d``, logits of order
    one at unit-norm tokens times √d).
    """
    if dtype not in DTYPES:
        raise ConfigError(f"The 'dtype' parameter must be one of {', '.join(DTYPES)}; got {dtype!r}", param="dtype")
    kv = kv_heads if kv_heads is not None else max(1, heads // 4)
    cfg = _config(family, d, heads, kv, rope, rotary_pct, buckets, max_distance)
    torch.manual_seed(seed)
    t = _transformers()
    if family == "llama":
        from transformers.models.llama.modeling_llama import LlamaAttention as cls
    elif family == "qwen2":
        from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention as cls
    elif family == "gpt_neox":
        from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention as cls
    elif family == "t5":
        from transformers.models.t5.modeling_t5 import T5Attention as cls
    else:
        from transformers.models.bloom.modeling_bloom import BloomAttention as cls
    del t
    if family == "t5":
        module = cls(cfg, has_relative_attention_bias=True, layer_idx=0)
    else:
        module = cls(cfg, layer_idx=0)
    module = module.to(torch.float64)
    std = weight_std if weight_std is not None else 1.0 / math.sqrt(d)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * bias_std)
            elif "relative_attention_bias" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std)
    module = module.to(DTYPES[dtype])
    inv_freq, rotary_dim = None, None
    if family in ("llama", "qwen2", "gpt_neox"):
        params = dict(cfg.rope_parameters)
        head_dim = d // heads
        rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        kind = params.get("rope_type", "default")
        inv_freq = rope_frequencies(rotary_dim, float(params["rope_theta"]), scaling=kind,
                                    factor=float(params.get("factor", 1.0)),
                                    low_freq_factor=float(params.get("low_freq_factor", 1.0)),
                                    high_freq_factor=float(params.get("high_freq_factor", 4.0)),
                                    original_max_position_embeddings=int(params.get(
                                        "original_max_position_embeddings", 8192)))
    return PositionalVictim(family, module, cfg, inv_freq, rotary_dim)


class EveryRow:
    """A victim's every row ``(B, N, K)`` as an oracle function, its rows declared positional (a bidirectional
    encoder with position terms: T5's encoder)."""

    positions = "positional"

    def __init__(self, victim: PositionalVictim):
        self.victim = victim

    def __call__(self, X) -> np.ndarray:
        return self.victim.every_position(X).detach().numpy()


def _np(t) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


def reference_model(victim: PositionalVictim, dtype: str = "float64") -> PositionalAttention:
    """The victim's function as a :class:`PositionalAttention` read from its weights (the truth tests compare with)."""
    a, fam = victim.attn, victim.family
    d = victim.d
    if fam in ("llama", "qwen2"):
        H, G = victim.config.num_attention_heads, victim.config.num_key_value_heads
        dh = a.head_dim

        def b(lin, n):
            return None if lin.bias is None else _np(lin.bias).reshape(n, dh)
        return PositionalAttention(_np(a.q_proj.weight).reshape(H, dh, d), _np(a.k_proj.weight).reshape(G, dh, d),
                                   _np(a.v_proj.weight).reshape(G, dh, d), _np(a.o_proj.weight),
                                   b(a.q_proj, H), b(a.k_proj, G), b(a.v_proj, G),
                                   None if a.o_proj.bias is None else _np(a.o_proj.bias), position="rope",
                                   inv_freq=victim.inv_freq, layout="half", scale=a.scaling, causal=True, dtype=dtype)
    if fam in ("gpt_neox", "bloom"):
        H = victim.config.num_attention_heads if fam == "gpt_neox" else a.num_heads
        dh = d // H
        W = _np(a.query_key_value.weight).reshape(H, 3, dh, d)
        bias = _np(a.query_key_value.bias).reshape(H, 3, dh)
        common = dict(Wq=W[:, 0], Wk=W[:, 1], Wv=W[:, 2], Wo=_np(a.dense.weight), bq=bias[:, 0], bk=bias[:, 1],
                      bv=bias[:, 2], bo=_np(a.dense.bias), scale=1.0 / math.sqrt(dh), causal=True, dtype=dtype)
        if fam == "gpt_neox":
            return PositionalAttention(**common, position="rope", inv_freq=victim.inv_freq, layout="half")
        from transformers.models.bloom.modeling_bloom import build_alibi_tensor

        slopes = _np(build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), H, torch.float64)[:, 0, 1])
        return PositionalAttention(**common, position="alibi", slopes=slopes)
    H, dh = a.n_heads, a.key_value_proj_dim
    return PositionalAttention(_np(a.q.weight).reshape(H, dh, d), _np(a.k.weight).reshape(H, dh, d),
                               _np(a.v.weight).reshape(H, dh, d), _np(a.o.weight), position="t5",
                               rel_bias=_np(a.relative_attention_bias.weight).T,
                               max_distance=a.relative_attention_max_distance,
                               bidirectional=not a.is_decoder, scale=1.0, causal=False, dtype=dtype)


def folder_reference(folder, layer: int = 0) -> PositionalAttention:
    """The float64 function of layer ``layer`` of a ``save_pretrained`` LLaMA or Qwen2 folder as a
    :class:`PositionalAttention` (its weights and biases, its config's frequencies): the truth a result of
    ``extract --hf-dir`` is measured against."""
    transformers = _transformers()
    model = transformers.AutoModel.from_pretrained(folder, dtype=torch.float64)
    cfg = model.config
    dh = cfg.hidden_size // cfg.num_attention_heads
    theta = rope_frequencies(dh, float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]))
    return reference_model(PositionalVictim(cfg.model_type, model.layers[layer].self_attn, cfg, theta, dh))
