"""Write a recovered attention layer back into a Hugging Face folder of the victim's family.

A recovered layer (vector layout, App. C) holds per head ``W_h = s·K_hᵀQ_h``, ``u_h = s·K_hᵀ b_Q,h``,
``V_h = W_O[:, h] W_V[h]`` and the shared ``c = W_O b_V + b_O``. The factors are not identifiable (any invertible
``d_h × d_h`` map between ``Q_h`` and ``K_h``, or between ``W_V[h]`` and ``W_O[:, h]``, gives the same layer), so
any gauge reproduces the victim: :func:`factor_layer` takes the balanced SVD factors at the head width ``d_h``
(``W_h/s = U Σ Vᵀ``: ``K_h = (U√Σ)ᵀ``, ``Q_h = √Σ Vᵀ``; ``V_h = A Σ Bᵀ``: ``W_O[:, h] = AΣ``, ``W_V[h] = Bᵀ``),
``b_Q,h`` the least-squares solution of ``s·K_hᵀ b = u_h``, ``b_K = b_V = 0`` and ``b_O = c`` (or ``b_V`` with
``W_O b_V = c`` where the family has no output bias). :func:`export_layer` loads the victim's folder with
``transformers``, puts those weights into layer ``L`` in the family's own layout
(:func:`~attnprobe.oracles.hf_families.join_projections`) and saves the folder (all layers, or one).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.io import load_arrays
from attnprobe.oracles.hf_families import LayerSpec, join_projections, layer_spec

#: relative size of the singular values beyond the head width that may be dropped (noise of the recovery)
RANK_SLACK = 1e-2
#: how far (relative) recovered RoPE frequencies may be from the folder's (the learner's spread is ~1e-6)
THETA_TOLERANCE = 1e-3
#: a bias the family lacks may be this small (relative to its weights) and is dropped
BIAS_FLOOR = 1e-8
#: how far (relative) a recovered block's norm ε may be from the folder's (the block learner reads it to ~1e-12)
EPS_TOLERANCE = 1e-6


def _truncated(M: np.ndarray, r: int, what: str, dropped: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rank-``r`` SVD factors of ``M``; the relative size of what is cut off is appended to ``dropped``."""
    U, S, Vt = np.linalg.svd(M, full_matrices=False)
    top = S[0] if S.size and S[0] > 0 else 1.0
    if S.size > r and S[r] > RANK_SLACK * top:
        raise ConfigError(f"{what} has rank above the head width {r} (singular value {r + 1} is "
                          f"{S[r] / top:.2g} of the largest); the recovered layer does not fit this folder's heads",
                          param="result")
    dropped.append(float(S[r] / top) if S.size > r else 0.0)
    return U[:, :r], S[:r], Vt[:r]


def factor_layer(arrays: dict, spec: LayerSpec, layer: int) -> dict:
    """Per-head projections of the family (:func:`~attnprobe.oracles.hf_families.split_projections`'s layout,
    KV heads = query heads) that compute the recovered layer ``arrays`` (``W (H, d, d)``, ``u (H, d)``,
    ``v (H, K, d)``, ``c (K,)``). Fewer recovered heads than the folder has are padded with heads that add
    nothing (``V_h = 0``). ``"dropped"``: the largest relative singular value cut off at the head width (the
    recovery's noise beyond rank d_h)."""
    W, u, v, c = (np.asarray(arrays[k], dtype=np.float64) for k in ("W", "u", "v", "c"))
    if W.ndim != 3 or v.ndim != 3:
        raise ConfigError("the result must hold a whole-row multi-head layer (W (H, d, d), v (H, K, d)); extract "
                          "it with --method multihead from the whole output row", param="result")
    H, d, K = W.shape[0], W.shape[1], v.shape[1]
    dh, s = spec.head_dim, spec.logit_scale(layer)
    if d != spec.hidden or K != spec.hidden:
        raise ConfigError(f"the result has d = {d}, K = {K} outputs; {spec.folder} has width {spec.hidden}",
                          param="result")
    if H > spec.heads:
        raise ConfigError(f"the result has {H} heads; a {spec.name} layer of {spec.folder} has {spec.heads}",
                          param="result")
    if spec.kv_heads != spec.heads:
        raise ConfigError(f"{spec.folder} shares keys and values between query heads ({spec.heads} query heads, "
                          f"{spec.kv_heads} KV heads); writing independent heads into it needs their groups",
                          param="hf_dir")
    Q, Kp, Vp = (np.zeros((spec.heads, dh, d)) for _ in range(3))
    bQ = np.zeros((spec.heads, dh))
    WO = np.zeros((K, spec.heads, dh))
    dropped: list[float] = [0.0]
    for h in range(H):
        U, S, Vt = _truncated(W[h] / s, dh, f"head {h}'s W_h", dropped)
        r = S.size
        Kp[h, :r], Q[h, :r] = (U * np.sqrt(S)).T, np.sqrt(S)[:, None] * Vt
        bQ[h, :r] = np.linalg.lstsq(s * Kp[h, :r].T, u[h], rcond=None)[0]
        A, S2, Bt = _truncated(v[h], dh, f"head {h}'s V_h", dropped)
        WO[:, h, :S2.size], Vp[h, :S2.size] = A * S2, Bt
    WO = WO.reshape(K, spec.heads * dh)
    bV, bO = None, c
    if "o" not in spec.biases:  # put c into the value biases: W_O b_V = c
        bV = np.linalg.lstsq(WO, c, rcond=None)[0]
        if np.abs(WO @ bV - c).max() > 1e-8 * max(np.abs(c).max(), 1e-300):
            raise ConfigError(f"a {spec.name} layer has no output bias and c is not in the span of W_O; it does not "
                              "fit this family", param="result")
        bV, bO = bV.reshape(spec.heads, dh), None
    return {"Q": Q, "K": Kp, "V": Vp, "bQ": bQ if "q" in spec.biases or np.any(bQ) else None, "bK": None,
            "bV": bV, "WO": WO, "bO": bO, "dropped": max(dropped)}


def export_layer(result, hf_dir, layer: int, out, *, layers: int | None = None, dtype: str = "float64"
                 ) -> tuple[Path, float]:
    """Write ``out``: the folder ``hf_dir`` (config + ``model.safetensors``, every other weight kept) whose
    attention at layer ``layer`` is the recovered layer in ``result`` (an ``extract`` result ``.npz``). With
    ``layers=1`` the folder has one layer (the victim's layer ``layer``, attention recovered). Saved in ``dtype``.
    Returns the folder and the largest relative singular value cut off at the head width (:func:`factor_layer`)."""
    from attnprobe.oracles.hf_attention import DTYPES

    spec = layer_spec(hf_dir)
    spec.check_layer(layer)
    if dtype not in DTYPES:
        raise ConfigError(f"The 'dtype' parameter must be one of {', '.join(DTYPES)}; got {dtype!r}", param="dtype")
    if layers not in (None, 1, spec.layers):
        raise ConfigError(f"The 'layers' parameter is 1 (one layer) or {spec.layers} (the victim's); got {layers}",
                          param="layers")
    arrays = load_arrays(result, what="result file")
    if str(arrays.get("kind", "")) == "transformer_block":
        weights, dropped, within = block_weights(result, hf_dir, spec, layer)
        return _write(weights, hf_dir, layer, out, layers, dtype, spec, within=within), dropped
    if str(arrays.get("kind", "")) == "positional_attention":
        weights, dropped = rope_weights(result, spec, layer)
        return _write(weights, hf_dir, layer, out, layers, dtype, spec), dropped
    spec.refuse_positional()
    if str(arrays.get("kind", "")) != "multi_head":
        raise ConfigError(f"{result} holds a {str(arrays.get('kind', 'attention_head'))!r} model; export writes a "
                          "whole-row multi-head layer (extract --method multihead from the whole output row)",
                          param="result")
    factors = factor_layer(arrays, spec, layer)
    dropped = factors.pop("dropped")
    return _write(join_projections(spec, factors), hf_dir, layer, out, layers, dtype, spec), dropped


def rope_weights(result, spec: LayerSpec, layer: int) -> tuple[dict[str, np.ndarray], float]:
    """A recovered RoPE layer (``positional_attention``) as the tensors of a Hugging Face folder of ``spec``'s
    family: the pairs matched to the folder's frequencies (refused when they differ by more than
    :data:`THETA_TOLERANCE`), the logit scale moved into ``W_Q``, heads sharing keys and values written once per
    KV group in the RoPE gauge (:func:`~attnprobe.models.positional_gauge.share_kv`), biases the family lacks
    refused unless they vanish. Returns the tensors and the largest misfit of a head to its group."""
    from attnprobe.models import load_model

    model = load_model(result)
    return rope_parts(getattr(model, "model", model), spec, layer, result)  # the model under every-position rows


def rope_parts(model, spec: LayerSpec, layer: int, result) -> tuple[dict[str, np.ndarray], float]:
    """:func:`rope_weights` of a :class:`~attnprobe.models.positional.PositionalAttention` (``result`` names it in
    the messages)."""
    from attnprobe.models.positional_gauge import share_kv

    if model.position != "rope" or spec.family.position != "rope" or spec.rotary is None:
        raise ConfigError(f"{result} holds a {model.position} layer; {spec.folder} is a {spec.name} model "
                          f"({spec.family.position}): export writes a RoPE layer into a RoPE family", param="result")
    if (model.d, model.outputs, model.H, model.head_dim) != (spec.hidden, spec.hidden, spec.heads, spec.head_dim):
        raise ConfigError(f"the result has d = {model.d}, K = {model.outputs}, {model.H} heads of width "
                          f"{model.head_dim}; {spec.folder} has width {spec.hidden}, {spec.heads} heads of width "
                          f"{spec.head_dim}", param="result")
    rot = spec.rotary
    theta = rot.frequencies()
    if model.rotary_dim != rot.dims or model.layout != "half":
        raise ConfigError(f"the result rotates {model.rotary_dim} coordinates per head ({model.layout} layout); "
                          f"{spec.folder} rotates {rot.dims} (rotate-half)", param="result")
    # pair k of the result goes where the folder's nearest frequency is (coordinates k and k + r/2 move together)
    match = np.array([int(np.argmin(np.abs(theta - t))) for t in model.inv_freq])
    off = float(np.max(np.abs(theta[match] - model.inv_freq) / theta[match]))
    if len(set(match.tolist())) != len(match) or off > THETA_TOLERANCE:
        raise ConfigError(f"the recovered frequencies differ from {spec.folder}'s rotary base {rot.base:g} by "
                          f"{off:.1e} (relative); the layer does not fit this folder", param="hf_dir")
    half = rot.dims // 2
    perm = np.empty(model.head_dim, dtype=int)
    perm[match], perm[match + half] = np.arange(half), np.arange(half) + half
    perm[rot.dims:] = np.arange(rot.dims, model.head_dim)
    model, misfit = share_kv(_permuted(model, perm, theta), spec.kv_heads)
    s = spec.logit_scale(layer)
    c = model.output_bias()
    parts = {"Q": model.Wq * (model.scale / s), "K": model.Wk, "V": model.Wv, "WO": model.Wo,
             "bQ": model.bq * (model.scale / s), "bK": model.bk, "bV": model.bv, "bO": model.bo}
    size = float(np.abs(model.Wo).max() * max(np.abs(model.Wv).max(), 1e-300))
    for key, letter in (("bQ", "q"), ("bK", "k")):
        if letter not in spec.biases:
            if np.abs(parts[key]).max() > BIAS_FLOOR * max(np.abs(parts[key[1:]]).max(), 1e-300):
                raise ConfigError(f"the recovered layer has a {letter} bias; a {spec.name} layer of this config has "
                                  "none", param="hf_dir")
            parts[key] = None
    if "o" not in spec.biases or "v" not in spec.biases:  # c = W_O b_V + b_O goes where the family has room
        if np.abs(c).max() <= BIAS_FLOOR * size:
            parts["bV"], parts["bO"] = (None if "v" not in spec.biases else np.zeros_like(model.bv)), None
        elif "v" in spec.biases:
            dv, share = model.Wv.shape[1], model.H // model.G  # W_O (b_V of each head's group) = c
            A = model.Wo.reshape(-1, model.G, share, dv).sum(axis=2).reshape(-1, model.G * dv)
            parts["bV"], parts["bO"] = np.linalg.lstsq(A, c, rcond=None)[0].reshape(model.G, dv), None
        else:
            raise ConfigError(f"the recovered layer adds a constant ({np.abs(c).max():.1e}) to its output; a "
                              f"{spec.name} layer of this config has no value or output bias", param="hf_dir")
    return join_projections(spec, parts), misfit


def block_weights(result, hf_dir, spec: LayerSpec, layer: int) -> tuple[dict[str, np.ndarray], float, str]:
    """A recovered block (``transformer_block``) as the tensors of a layer module of ``hf_dir``'s family: a pre-norm
    block (RMSNorm, RoPE attention, gated FFN) into LLaMA, Qwen2 or Mistral — the attention as :func:`rope_parts`
    writes it, the norms' weights (1 in the learner's canonical form, the victim's folded into the projections after
    them), the gate, up and down projections — or a post-norm block (BERT: ``h = n1(x + A(X))``,
    ``y = n2(h + F(h))``, LayerNorms, a smooth FFN) into BERT, RoBERTa or ELECTRA — the attention as
    :func:`plain_parts` writes it, both LayerNorms' weights and biases, the FFN's two layers. The folder's ε is kept
    (refused when the result's differs by more than :data:`EPS_TOLERANCE`), as are its activation and FFN width
    (refused when they differ). Returns the tensors by name under the layer module, the attention's misfit
    (:func:`rope_parts`; 0 for a post-norm block, whose heads are written as they are) and the layer module's
    path."""
    from attnprobe.models import load_model
    from attnprobe.models.gated_ffn import GatedFFN
    from attnprobe.models.smooth_ffn import SmoothFFN
    from attnprobe.oracles.hf_block import HF_ACTIVATIONS, block_spec

    _, parts, layout = block_spec(hf_dir)
    block = load_model(result)
    block = getattr(block, "model", block)
    post = layout == "post"
    writable = post or (layout == "pre" and parts.gate is not None)
    if not writable or (block.layout, block.norm) != (layout, parts.norm):
        raise ConfigError(f"{result} holds a {block.layout}-norm block with {block.norm} norms; {spec.folder}'s are "
                          f"{layout}-norm with {parts.norm} norms: export writes pre-norm RMSNorm blocks with a gated "
                          "FFN into LLaMA, Qwen2 or Mistral folders and post-norm LayerNorm blocks into BERT, RoBERTa "
                          "or ELECTRA folders", param="result")
    ffn, cfg = block.ffn, spec.config
    act, width = HF_ACTIVATIONS.get(cfg.get("hidden_act", "")), cfg.get("intermediate_size")
    if not isinstance(ffn, SmoothFFN if post else GatedFFN) or ffn.activation != act or ffn.m != width:
        raise ConfigError(f"the result's FFN ({type(ffn).__name__}, {ffn.activation}, width {ffn.m}) is not "
                          f"{spec.folder}'s ({'' if post else 'gated '}{act} FFN, width {width})", param="result")
    eps = float(cfg.get(parts.eps_key, block.eps))
    if abs(block.eps / eps - 1) > EPS_TOLERANCE:
        raise ConfigError(f"the result's norm ε = {block.eps:.3e} differs from {spec.folder}'s {parts.eps_key} = "
                          f"{eps:.3e}; the block does not fit this folder", param="hf_dir")
    if post:
        attention, misfit = plain_parts(block.attention, spec, layer, result), 0.0
        mlp = {f"{parts.norm1}.bias": block.norm1_b, f"{parts.norm2}.bias": block.norm2_b,
               f"{parts.up}.weight": ffn.W1, f"{parts.up}.bias": ffn.b1,
               f"{parts.down}.weight": ffn.W2, f"{parts.down}.bias": ffn.b2}
    else:
        attention, misfit = rope_parts(block.attention, spec, layer, result)
        mlp_bias = bool(cfg.get("mlp_bias", False))
        size = max(float(np.abs(ffn.W2).max()), 1e-300)
        if not mlp_bias and max(float(np.abs(b).max()) for b in (ffn.bg, ffn.bu, ffn.b2)) > BIAS_FLOOR * size:
            raise ConfigError(f"the recovered FFN has biases; a {spec.name} MLP of this config has none",
                              param="hf_dir")
        mlp = {f"{parts.gate}.weight": ffn.Wg, f"{parts.up}.weight": ffn.Wu, f"{parts.down}.weight": ffn.W2}
        if mlp_bias:
            mlp.update({f"{parts.gate}.bias": ffn.bg, f"{parts.up}.bias": ffn.bu, f"{parts.down}.bias": ffn.b2})
    within = parts.layer.format(i=layer)
    rel = spec.module_path(layer)[len(within) + 1:]  # the attention under the layer module
    weights = {f"{rel}.{k}": v for k, v in attention.items()}
    weights.update({f"{parts.norm1}.weight": block.norm1_w, f"{parts.norm2}.weight": block.norm2_w, **mlp})
    return weights, misfit, parts.layer


def plain_parts(attn, spec: LayerSpec, layer: int, result) -> dict[str, np.ndarray]:
    """A recovered attention without a position term (a post-norm block's) as the tensors of ``spec``'s attention
    module: every head's maps as the family stores them, the result's logit scale moved into ``W_Q`` and its bias
    (a key bias the result lacks is written as 0: it shifts each query's logits alike). Refused unless its heads,
    their width and the key/value maps are the folder's (``result`` names it in the message)."""
    if attn.position != "none" or (attn.d, attn.outputs, attn.H, attn.G, attn.head_dim) != (
            spec.hidden, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim):
        raise ConfigError(f"{result}: the attention ({attn.position} position term, {attn.H} heads of width "
                          f"{attn.head_dim}, {attn.G} key/value maps) is not {spec.folder}'s ({spec.heads} heads of "
                          f"width {spec.head_dim}, no position term)", param="result")
    q = attn.scale / spec.logit_scale(layer)
    return join_projections(spec, {"Q": attn.Wq * q, "K": attn.Wk, "V": attn.Wv, "WO": attn.Wo,
                                   "bQ": attn.bq * q, "bK": attn.bk, "bV": attn.bv, "bO": attn.bo})


def _permuted(model, perm: np.ndarray, theta: np.ndarray):
    """``model`` with each head's coordinates reordered by ``perm`` (pairs moved to the folder's frequencies),
    rotating by the folder's ``theta``."""
    from attnprobe.models.positional import PositionalAttention

    return PositionalAttention(model.Wq[:, perm], model.Wk[:, perm], model.Wv, model.Wo, model.bq[:, perm],
                               model.bk[:, perm], model.bv, model.bo, position="rope", inv_freq=theta,
                               rotary_dim=model.rotary_dim, layout=model.layout, scale=model.scale,
                               causal=model.causal, dtype=model.dtype)


def _write(weights: dict, hf_dir, layer: int, out, layers, dtype: str, spec: LayerSpec,
           within: str | None = None) -> Path:
    """Save ``hf_dir``'s model (all layers, or one) with ``weights`` in layer ``layer``'s attention module (or, with
    ``within``, the module at that path, ``{i}`` the layer: a whole block's)."""
    model = _model_to_write(hf_dir, layer, layers == 1 and spec.layers > 1, dtype, spec)
    target = 0 if layers == 1 else layer
    torch = _torch()
    if within is not None:
        module = model.get_submodule(within.format(i=target))
    else:
        module = model.get_submodule(spec.module_path(target) if layers != 1 else
                                     spec.family.module.format(i=0, g=0, j=0))
    with torch.no_grad():
        for name, value in weights.items():
            param = module.get_parameter(name)
            if tuple(param.shape) != value.shape:  # pragma: no cover - join_projections follows the family
                raise ConfigError(f"{name}: shape {value.shape} does not fit {tuple(param.shape)}", param="result")
            param.copy_(torch.as_tensor(np.array(value), dtype=param.dtype))
    out = check_out_folder(out)
    return _save_whole(model, out)


def check_out_folder(out) -> Path:
    """``out`` as a folder export may write: new or empty; a file or a folder holding files (another model, notes)
    is refused, never overwritten."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} exists and is not a folder; give a folder to write the model into", param="out")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held:
        names = ", ".join(held[:3]) + (" …" if len(held) > 3 else "")
        raise ConfigError(f"{out} already holds files ({names}); export writes a folder of its own and never "
                          "overwrites one: give a new or empty folder", param="out")
    return out


def _save_whole(model, out: Path) -> Path:
    """``save_pretrained`` into a temporary folder beside ``out``, renamed to ``out`` once every file is written: a
    failed write (a full disk) leaves nothing behind."""
    import shutil
    import tempfile

    from safetensors import SafetensorError

    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
        model.save_pretrained(tmp)
        if out.exists():
            out.rmdir()  # empty (check_out_folder)
        tmp.rename(out)
    except BaseException as exc:  # Ctrl-C too: the partial folder goes
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, (OSError, SafetensorError)):
            raise ConfigError(f"cannot write {out}: {exc}; nothing was left behind", param="out") from exc
        raise
    return out


def _torch():
    from attnprobe.oracles.torch_adapter import torch

    return torch


def _model_to_write(hf_dir, layer: int, one_layer: bool, dtype: str, spec: LayerSpec):
    """A fresh copy of the victim's model in ``dtype`` (not the cached oracle module): all its layers, or one
    layer holding the victim's layer ``layer`` with every other weight (embeddings, norms) kept."""
    import copy

    from attnprobe.oracles.hf_attention import DTYPES, load_hf_model

    victim = load_hf_model(hf_dir, "float64")
    if not one_layer:
        return copy.deepcopy(victim).to(DTYPES[dtype])
    config = copy.deepcopy(victim.config)
    config.num_hidden_layers = 1
    if spec.name == "albert":
        config.num_hidden_groups = 1
    model = type(victim)(config).to(DTYPES[dtype]).eval()
    stem = spec.family.module.split("{")[0]  # "encoder.layer." : the layers' container
    index = str(layer // spec.group_size if spec.name == "albert" else layer)
    state = {}
    for name, value in victim.state_dict().items():
        if name.startswith(stem):
            head, _, rest = name[len(stem):].partition(".")
            if head != index:
                continue
            name = f"{stem}0.{rest}"
        state[name] = value
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if not m.endswith("position_ids")]:
        raise ConfigError(f"cannot build a one-layer {spec.name} model from {hf_dir}: missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]}", param="hf_dir")
    return model
