"""How each Hugging Face family builds its attention sublayer: one table, read without torch.

A family names its projections, stores them separately, fused per head or fused in blocks (GPT-2's ``Conv1D``
stores ``(in, out)``), scales the logits, has or lacks biases, shares keys and values between query heads (GQA),
masks causally or not, and injects position into the logits (RoPE, a relative bias, ALiBi) or not. Every
reader of a folder — the live module (:mod:`attnprobe.oracles.hf_attention`), the numpy weights
(:mod:`attnprobe.targets.hf`) and the writer of a recovered layer (:mod:`attnprobe.targets.hf_export`) — asks
:func:`layer_spec` and nothing else. A sublayer is, for query heads ``h`` and KV heads ``g(h) = h // (H/H_kv)``,

    ``out_i = Σ_h W_O[:, h] Σ_j softmax_j(s·(Q_h x_i + b_Q)ᵀ(K_g x_j + b_K) + pos_h(i, j) + mask(i, j))
    (V_g x_j + b_V) + b_O``,

and ``pos_h`` is zero exactly for the families whose ``position`` is ``"none"`` (position enters through the
embeddings, before the first layer): those are App. C's multi-head sum, the others wait for a positional learner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.oracles.hf_folder import read_config
from attnprobe.properties import alias

#: what a position scheme does to the logits (the cause a refusal names)
POSITION_CAUSES = {"rope": "rotary position embeddings (RoPE) rotate queries and keys by their positions",
                   "relative_bias": "a learned relative-position bias is added to every logit",
                   "alibi": "ALiBi adds a per-head linear penalty on the query-key distance"}


@dataclass(frozen=True)
class Family:
    """One row of the table: names are relative to the base model (``AutoModel``) and to its attention module."""

    name: str
    #: config.json keys: width, query heads, layers (first found wins); KV heads and head width where they exist
    hidden: tuple[str, ...]
    heads: tuple[str, ...]
    layers: tuple[str, ...]
    #: the attention module of layer ``{i}`` (``{g}``/``{j}``: ALBERT's shared group and its inner layer)
    module: str
    #: projections under the module: ``(q, k, v)`` separate, or one fused name with ``fused`` set
    qkv: tuple[str, ...]
    out: str
    #: ``None`` (separate), ``"per_head"`` (``[q_h; k_h; v_h]`` per head: GPT-NeoX, BLOOM), ``"blocks"``
    #: (``[q; k; v]``: GPT-2)
    fused: str | None = None
    #: weights stored ``(in, out)`` (GPT-2's ``Conv1D``) instead of ``nn.Linear``'s ``(out, in)``
    conv1d: bool = False
    causal: bool = False
    position: str = "none"
    kv_heads: str | None = None
    head_dim: tuple[str, ...] = ()
    #: which of q, k, v, o carry biases: a fixed set, or a config key that switches all four on
    biases: frozenset = frozenset("qkvo")
    bias_key: str | None = None
    #: the logit scale: "rsqrt" (1/√d_h), "one" (T5: folded into the weights)
    scale: str = "rsqrt"
    #: the dtype the kernel computes its softmax in, when it is not the module's own (``None``: the module's)
    softmax_dtype: str | None = None
    #: how the module is called: the keyword of its mask and the extras its forward needs
    call: str = "plain"


_BERT = dict(hidden=("hidden_size",), heads=("num_attention_heads",), layers=("num_hidden_layers",),
             module="encoder.layer.{i}.attention", qkv=("self.query", "self.key", "self.value"), out="output.dense")
_LLAMA = dict(hidden=("hidden_size",), heads=("num_attention_heads",), layers=("num_hidden_layers",),
              module="layers.{i}.self_attn", qkv=("q_proj", "k_proj", "v_proj"), out="o_proj", causal=True,
              position="rope", kv_heads="num_key_value_heads", head_dim=("head_dim",), softmax_dtype="float32",
              call="rope")

#: the table (model_type -> family)
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("bert", **_BERT),
    Family("roberta", **_BERT),
    Family("electra", **_BERT),
    Family("distilbert", hidden=("dim",), heads=("n_heads",), layers=("n_layers",),
           module="transformer.layer.{i}.attention", qkv=("q_lin", "k_lin", "v_lin"), out="out_lin"),
    Family("albert", hidden=("hidden_size",), heads=("num_attention_heads",), layers=("num_hidden_layers",),
           module="encoder.albert_layer_groups.{g}.albert_layers.{j}.attention", qkv=("query", "key", "value"),
           out="dense"),
    Family("gpt2", hidden=("n_embd", "hidden_size"), heads=("n_head", "num_attention_heads"),
           layers=("n_layer", "num_hidden_layers"), module="h.{i}.attn", qkv=("c_attn",), out="c_proj",
           fused="blocks", conv1d=True, causal=True),
    Family("llama", **_LLAMA, biases=frozenset(), bias_key="attention_bias"),
    Family("qwen2", **_LLAMA, biases=frozenset("qkv")),
    Family("mistral", **_LLAMA, biases=frozenset()),
    Family("gpt_neox", hidden=("hidden_size",), heads=("num_attention_heads",), layers=("num_hidden_layers",),
           module="layers.{i}.attention", qkv=("query_key_value",), out="dense", fused="per_head", causal=True,
           position="rope", softmax_dtype="float32", call="rope", bias_key="attention_bias"),
    Family("t5", hidden=("d_model",), heads=("num_heads",), layers=("num_layers",),
           module="encoder.block.{i}.layer.0.SelfAttention", qkv=("q", "k", "v"), out="o", position="relative_bias",
           head_dim=("d_kv",), biases=frozenset(), scale="one", call="t5"),
    Family("bloom", hidden=("hidden_size", "n_embed"), heads=("n_head", "num_attention_heads"),
           layers=("n_layer", "num_hidden_layers"), module="h.{i}.self_attention", qkv=("query_key_value",),
           out="dense", fused="per_head", causal=True, position="alibi", softmax_dtype="float32", call="bloom"),
)}


@dataclass(frozen=True)
class Rotary:
    """The rotary parameters a positional learner needs: ``θ_k = base^(−2k/dims)`` on the first ``dims`` of each
    head's ``d_h`` coordinates, laid out as two halves (``rotate_half``: pairs ``(k, k + dims/2)``), and the
    config's scaling dict (``None``: plain RoPE)."""

    base: float
    dims: int
    layout: str = "halves"
    scaling: dict | None = None

    def frequencies(self) -> np.ndarray:
        """The ``dims/2`` angular frequencies the folder rotates by: ``base^(−2k/dims)`` under its config's
        scaling (``linear``, ``llama3``; :func:`~attnprobe.models.positional.rope_frequencies`)."""
        from attnprobe.models.positional import rope_frequencies

        scaling = dict(self.scaling or {})
        kind = scaling.pop("rope_type", scaling.pop("type", "default"))
        return rope_frequencies(self.dims, self.base, scaling=kind, **{k: scaling[k] for k in (
            "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings") if k in scaling})


@dataclass(frozen=True)
class LayerSpec:
    """What one folder's attention sublayer is: its family's row filled in from ``config.json``."""

    family: Family
    folder: Path
    config: dict
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    scale: float
    biases: frozenset
    rotary: Rotary | None = None
    #: ALBERT: layers per shared group (layer i runs group ``i // group_size``)
    group_size: int = 1
    #: a causal window (Mistral, Qwen2 with ``use_sliding_window``): keys older than this are masked
    window: int | None = None
    #: GPT-2's ``scale_attn_by_inverse_layer_idx``: layer i's logits are also divided by i + 1
    inverse_layer_scale: bool = False
    #: the dtype the kernel computes its softmax in when it is not the module's (``None``: the module's own)
    softmax_dtype: str | None = None

    name = alias("family.name", "The family's name (the config's model_type, e.g. gpt2).")
    causal = alias("family.causal", "Whether a position sees only the ones before it.")

    @property
    def positional(self) -> bool:
        return self.family.position != "none"

    @property
    def groups(self) -> int:
        """Query heads per KV head (1: no sharing)."""
        return self.heads // self.kv_heads

    def logit_scale(self, layer: int) -> float:
        """The factor ``s`` of layer ``layer``'s logits (``1/√d_h``, T5's 1, GPT-2's optional ``1/(i+1)``)."""
        return self.scale / (self.check_layer(layer) + 1 if self.inverse_layer_scale else 1)

    def module_path(self, layer: int) -> str:
        """The attention module of layer ``layer`` under the base model."""
        self.check_layer(layer)
        return self.family.module.format(i=layer, g=layer // self.group_size, j=0)

    def check_layer(self, layer: int) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.layers:
            raise ConfigError(f"The 'layer' parameter must be in 0..{self.layers - 1} (the layers of {self.folder}); "
                              f"got {layer!r}", param="layer")
        return layer

    def refuse_positional(self) -> None:
        """Refuse a family whose logits depend on the key's position, before any query."""
        if self.positional:
            raise ConfigError(f"{self.folder} is a {self.name} model: its attention logits depend on the key's "
                              f"position ({POSITION_CAUSES[self.family.position]}), which the multi-head learner "
                              "does not model; use --method positional (the default for this folder)",
                              param="model_dir")


def _get(config: dict, keys: tuple[str, ...], what: str, path: Path, default=None):
    for key in keys:
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{path} gives {key} = {value!r}; {what} must be a positive integer",
                                  param="model_dir")
            return value
    if default is not None:
        return default
    raise ConfigError(f"{path} gives no {what} (none of {', '.join(keys)})", param="model_dir")


def _rotary(config: dict, head_dim: int) -> Rotary:
    rope = config.get("rope_parameters") or {}
    base = rope.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", config.get("rotary_pct", 1.0)))
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    scaling = None if scaling.get("rope_type", "default") == "default" else scaling
    return Rotary(float(base), int(head_dim * float(factor)), "halves", scaling)


def layer_spec(model_dir) -> LayerSpec:
    """The :class:`LayerSpec` of the model in ``model_dir`` (its ``config.json``'s ``model_type`` picks the row)."""
    config = read_config(model_dir)
    path = Path(model_dir) / "config.json"
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(f"{path} has model_type {model_type!r}; attnprobe reads the attention of "
                          f"{', '.join(FAMILIES)} models", param="model_dir")
    fam = FAMILIES[model_type]
    hidden = _get(config, fam.hidden, "the hidden width", path)
    heads = _get(config, fam.heads, "the number of attention heads", path)
    layers = _get(config, fam.layers, "the number of layers", path)
    kv = _get(config, (fam.kv_heads,), "the number of KV heads", path, heads) if fam.kv_heads else heads
    if fam.head_dim:
        head_dim = _get(config, fam.head_dim, "the head width", path, max(hidden // heads, 1))
    else:
        if hidden % heads:
            raise ConfigError(f"{path}: the width {hidden} is not a multiple of the {heads} heads", param="model_dir")
        head_dim = hidden // heads
    if heads % kv:
        raise ConfigError(f"{path}: {heads} query heads cannot share {kv} KV heads (not a multiple)", param="model_dir")
    biases = fam.biases | (frozenset("qkvo") if fam.bias_key and config.get(fam.bias_key, True) else frozenset())
    scale = 1.0 if fam.scale == "one" else head_dim ** -0.5
    softmax_dtype = fam.softmax_dtype
    if fam.name == "gpt2":
        scale = scale if config.get("scale_attn_weights", True) else 1.0
        softmax_dtype = "float32" if config.get("reorder_and_upcast_attn") else None
    group_size = 1
    if fam.name == "albert":
        groups = _get(config, ("num_hidden_groups",), "the number of layer groups", path, 1)
        if _get(config, ("inner_group_num",), "layers per group", path, 1) != 1:
            raise ConfigError(f"{path} has inner_group_num > 1 (several attention sublayers per ALBERT layer); "
                              "attnprobe reads ALBERT models with one attention sublayer per layer", param="model_dir")
        group_size = max(layers // groups, 1)
    window = None
    if fam.name == "mistral" or (fam.name == "qwen2" and config.get("use_sliding_window")):
        window = config.get("sliding_window")
    rotary = _rotary(config, head_dim) if fam.position == "rope" else None
    return LayerSpec(fam, Path(model_dir), config, hidden, heads, kv, head_dim, layers, float(scale), biases,
                     rotary, group_size, window, bool(config.get("scale_attn_by_inverse_layer_idx", False)),
                     softmax_dtype)




def split_projections(spec: LayerSpec, get: Callable[[str], object], where: str) -> dict:
    """One attention sublayer's float64 weights per head, whatever its family stores (separate, fused per head or
    in blocks, ``Conv1D``'s ``(in, out)``): ``Q (H, d_h, d)``, ``K, V (H_kv, d_h, d)``, ``bQ (H, d_h)``,
    ``bK, bV (H_kv, d_h)``, ``WO (K, H·d_h)``, ``bO (K,)`` (a bias is ``None`` where the layer has none).
    ``get(name)`` returns the stored tensor ``name`` under the attention module (``"q_proj.weight"``) or ``None``;
    ``where`` names the source in errors."""
    fam = spec.family
    H, G, dh, d = spec.heads, spec.kv_heads, spec.head_dim, spec.hidden

    def tensor(name, shape, optional=False):
        a = get(name)
        if a is None:
            if optional:
                return None
            raise ConfigError(f"{where} has no tensor {name!r}; it is not a complete {fam.name} layer",
                              param="model_dir")
        a = np.asarray(a, dtype=np.float64)
        a = a.T if fam.conv1d and a.ndim == 2 else a  # Conv1D stores (in, out)
        if a.shape != shape:
            raise ConfigError(f"{where}: tensor {name!r} has shape {a.shape}, not {shape} as config.json says (a "
                              f"{fam.name} layer of width {d}, {H} heads of width {dh}, {G} KV heads); the folder "
                              "mixes two models", param="model_dir")
        return a

    rows = (H * dh, G * dh, G * dh)
    if fam.fused is None:
        parts = [(tensor(f"{n}.weight", (r, d)), tensor(f"{n}.bias", (r,), True)) for n, r in zip(fam.qkv, rows)]
    else:
        W = tensor(f"{fam.qkv[0]}.weight", (3 * H * dh, d))
        b = tensor(f"{fam.qkv[0]}.bias", (3 * H * dh,), True)
        if fam.fused == "per_head":  # rows ordered (head, [q, k, v], d_h)
            W, b = W.reshape(H, 3, dh, d), None if b is None else b.reshape(H, 3, dh)
            parts = [(W[:, i].reshape(H * dh, d), None if b is None else b[:, i].reshape(-1)) for i in range(3)]
        else:  # blocks [q; k; v]
            parts = [(W[i * H * dh:(i + 1) * H * dh], None if b is None else b[i * H * dh:(i + 1) * H * dh])
                     for i in range(3)]
    out = {}
    for name, (w, b), n in zip("QKV", parts, (H, G, G)):
        out[name], out["b" + name] = w.reshape(n, dh, d), None if b is None else b.reshape(n, dh)
    out["WO"] = tensor(f"{fam.out}.weight", (d, H * dh))
    out["bO"] = tensor(f"{fam.out}.bias", (d,), True)
    return out


def join_projections(spec: LayerSpec, p: dict) -> dict[str, np.ndarray]:
    """The inverse of :func:`split_projections`: per-head ``Q (H, d_h, d)``, ``K, V (H_kv, d_h, d)``, biases
    (``None``: none) and ``WO (K, H·d_h)``, ``bO`` as the family stores them, by tensor name under the attention
    module (fused per head or in blocks, ``Conv1D`` transposed). A bias the family lacks must be ``None`` or zero."""
    fam = spec.family
    H, G, dh, d = spec.heads, spec.kv_heads, spec.head_dim, spec.hidden
    for key, letter in (("bQ", "q"), ("bK", "k"), ("bV", "v"), ("bO", "o")):
        b = p.get(key)
        if letter not in spec.biases and b is not None and np.any(np.asarray(b) != 0):
            raise ConfigError(f"a {fam.name} layer (this config) has no {letter} bias, but the layer needs one "
                              f"({key} ≠ 0); write it into a family with biases", param="hf_dir")
    zero = {"bQ": np.zeros(H * dh), "bK": np.zeros(G * dh), "bV": np.zeros(G * dh), "bO": np.zeros(d)}
    flat = {k: np.asarray(p[k], dtype=np.float64).reshape(-1, d) for k in "QKV"}
    bias = {k: zero[k] if p.get(k) is None else np.asarray(p[k], dtype=np.float64).reshape(-1) for k in zero}
    out: dict[str, np.ndarray] = {}
    t = (lambda a: a.T) if fam.conv1d else (lambda a: a)  # Conv1D stores (in, out)
    if fam.fused is None:
        for name, k in zip(fam.qkv, "QKV"):
            out[f"{name}.weight"] = flat[k]
            if k.lower() in spec.biases:
                out[f"{name}.bias"] = bias["b" + k]
    elif fam.fused == "per_head":
        W = np.stack([flat[k].reshape(H, dh, d) for k in "QKV"], axis=1)  # (H, 3, d_h, d)
        b = np.stack([bias["b" + k].reshape(H, dh) for k in "QKV"], axis=1)
        out[f"{fam.qkv[0]}.weight"] = W.reshape(3 * H * dh, d)
        if spec.biases:
            out[f"{fam.qkv[0]}.bias"] = b.reshape(-1)
    else:
        out[f"{fam.qkv[0]}.weight"] = t(np.concatenate([flat[k] for k in "QKV"]))
        if spec.biases:
            out[f"{fam.qkv[0]}.bias"] = np.concatenate([bias["b" + k] for k in "QKV"])
    out[f"{fam.out}.weight"] = t(np.asarray(p["WO"], dtype=np.float64))
    if "o" in spec.biases:
        out[f"{fam.out}.bias"] = bias["bO"]
    return out
