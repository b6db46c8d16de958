"""Single heads of any BERT-family attention layer stored as safetensors (MiniLM, BERT, RoBERTa, ...).

A layer's keys are ``{prefix}encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}`` and
``{prefix}encoder.layer.{i}.attention.output.dense.{weight,bias}`` (``prefix`` empty, ``bert.``, ``roberta.``
...). The tensors are read with ``safetensors.numpy`` (no torch, no network).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError, MissingDependencyError
from attnprobe.models.attention import AttentionHead

SAFETENSORS_HINT = "pip install 'attnprobe[minilm]' (safetensors)"
#: the attention tensors of a layer (under ``encoder.layer.L.attention.``)
_TENSORS = ("self.query.weight", "self.query.bias", "self.key.weight", "self.value.weight", "self.value.bias",
            "output.dense.weight", "output.dense.bias")
_QUERY = re.compile(r"^(.*?)encoder\.layer\.(\d+)\.attention\.self\.query\.weight$")


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict[str, np.ndarray]:
    try:
        from safetensors.numpy import load_file
    except ImportError as exc:
        raise MissingDependencyError("reading safetensors checkpoints needs safetensors; run: "
                                     f"{SAFETENSORS_HINT}") from exc
    if not Path(path).exists():
        raise ConfigError(f"checkpoint {path} does not exist", param="path")
    if not Path(path).is_file():  # a FIFO or device would block the reader for good
        raise ConfigError(f"checkpoint {path} is not a regular file; give a .safetensors file", param="path")
    try:
        return load_file(path)
    except Exception as exc:
        raise ConfigError(f"cannot read {path} as a safetensors file: {exc}", param="path") from exc


def read_safetensors(path) -> dict[str, np.ndarray]:
    """Every tensor of the ``.safetensors`` file ``path`` as numpy arrays (read once per process, no torch)."""
    return _load(str(path))


def index_param(layer: int, layers: int, head: int, heads: int) -> str:
    """Which part of a head's address (layer, head, output row) is out of range, checked in that order."""
    return "layer" if not 0 <= layer < layers else "head" if not 0 <= head < heads else "output_row"


@dataclass(frozen=True)
class BertCheckpoint:
    """The attention layers of a BERT-family checkpoint; ``heads_per_layer`` splits each layer's hidden width."""

    path: str
    heads_per_layer: int

    def __post_init__(self):
        object.__setattr__(self, "path", str(self.path))
        if int(self.heads_per_layer) < 1:
            raise ConfigError(f"heads_per_layer must be at least 1; got {self.heads_per_layer}",
                              param="heads_per_layer")
        self._check_shapes()
        if self.hidden % self.heads_per_layer:
            raise ConfigError(f"the hidden width {self.hidden} of {self.path} is not divisible by "
                              f"heads_per_layer={self.heads_per_layer}; give the model's number of heads per layer",
                              param="heads_per_layer")

    @functools.cached_property
    def _layout(self) -> tuple[str, int]:
        found = [m for m in map(_QUERY.match, _load(self.path)) if m]
        if not found:
            raise ConfigError(f"{self.path} has no key like 'encoder.layer.0.attention.self.query.weight'; "
                              "it is not a BERT-family checkpoint", param="path")
        prefix = found[0].group(1)
        return prefix, 1 + max(int(m.group(2)) for m in found if m.group(1) == prefix)

    def _check_shapes(self) -> None:
        """Every attention tensor of every layer has its BERT shape (checked up front, without copying)."""
        tensors, prefix, hidden = _load(self.path), self._layout[0], self.hidden
        for layer in range(self.layers):
            for name in _TENSORS:
                key = f"{prefix}encoder.layer.{layer}.attention.{name}"
                want = (hidden,) * (2 if name.endswith("weight") else 1)
                if key not in tensors:
                    raise ConfigError(f"{self.path} has no tensor {key!r}; it is not a BERT-family checkpoint",
                                      param="path")
                if tuple(tensors[key].shape) != want:
                    raise ConfigError(f"{self.path}: tensor {key!r} has shape {tuple(tensors[key].shape)}, not "
                                      f"{want}; it is not a BERT-family checkpoint", param="path")

    @property
    def layers(self) -> int:
        return self._layout[1]

    @property
    def hidden(self) -> int:
        shape = _load(self.path)[f"{self._layout[0]}encoder.layer.0.attention.self.query.weight"].shape
        if len(shape) != 2 or shape[0] != shape[1] or shape[0] < 1:
            raise ConfigError(f"{self.path}: the query weight of layer 0 has shape {shape}, not (hidden, hidden); "
                              "it is not a BERT-family checkpoint", param="path")
        return int(shape[1])

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads_per_layer

    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor of the checkpoint, as stored (read once per process)."""
        return _load(self.path)

    def _get(self, layer: int, name: str) -> np.ndarray:
        key = f"{self._layout[0]}encoder.layer.{layer}.attention.{name}"
        tensors = _load(self.path)
        if key not in tensors:
            raise ConfigError(f"{self.path} has no tensor {key!r}", param="path")
        want = (self.hidden,) * (2 if name.endswith("weight") else 1)
        if tensors[key].shape != want:
            raise ConfigError(f"{self.path}: tensor {key!r} has shape {tensors[key].shape}, not {want}; it is not "
                              "a BERT-family checkpoint", param="path")
        return tensors[key].astype(np.float64)

    def _check_index(self, layer: int, output_row: int, head: int = 0) -> None:
        if not (0 <= layer < self.layers and 0 <= head < self.heads_per_layer and 0 <= output_row < self.hidden):
            raise ConfigError(f"{Path(self.path).name} has layers 0..{self.layers - 1}, heads "
                              f"0..{self.heads_per_layer - 1}, output rows 0..{self.hidden - 1}; got "
                              f"layer={layer}, head={head}, output_row={output_row}",
                              param=index_param(layer, self.layers, head, self.heads_per_layer))

    def layer_projections(self, layer: int, output_row: int) -> dict[str, np.ndarray]:
        """Per-head float64 projections of one layer: ``Q, K, V (H, d_h, d)``, ``bQ, bV (H, d_h)``, the output
        row ``w (H, d_h)`` split by head, and its scalar bias ``b``."""
        self._check_index(layer, output_row)
        split = lambda a: a.reshape((self.heads_per_layer, self.head_dim) + a.shape[1:])  # noqa: E731
        return {"Q": split(self._get(layer, "self.query.weight")), "bQ": split(self._get(layer, "self.query.bias")),
                "K": split(self._get(layer, "self.key.weight")), "V": split(self._get(layer, "self.value.weight")),
                "bV": split(self._get(layer, "self.value.bias")),
                "w": split(self._get(layer, "output.dense.weight")[output_row]),
                "b": self._get(layer, "output.dense.bias")[output_row]}

    def layer_weights(self, layer: int) -> dict[str, np.ndarray]:
        """Every float64 weight of one attention layer: per-head ``Q, K, V (H, d_h, d)`` and ``bQ, bK, bV (H, d_h)``,
        and the whole output dense layer ``WO (K, H·d_h)``, ``bO (K,)`` (``K`` = the hidden width)."""
        self._check_index(layer, 0)
        split = lambda a: a.reshape((self.heads_per_layer, self.head_dim) + a.shape[1:])  # noqa: E731
        out = {}
        for name in ("query", "key", "value"):
            out[name[0].upper()] = split(self._get(layer, f"self.{name}.weight"))
            out["b" + name[0].upper()] = split(self._get(layer, f"self.{name}.bias"))
        out["WO"], out["bO"] = self._get(layer, "output.dense.weight"), self._get(layer, "output.dense.bias")
        return out

    def head(self, layer: int = 0, head: int = 0, output_row: int = 0, dtype: str = "float64") -> AttentionHead:
        """The biased single-head regressor of head ``head`` of layer ``layer`` at output row ``output_row``
        (docs/architecture.md, "Models"): ``W = K_hᵀQ_h/√d_h``, ``u = K_hᵀb_{Q,h}/√d_h``, ``v = V_hᵀw``,
        ``c = b_{V,h}·w + b`` with ``w``, ``b`` row ``output_row`` of the output projection restricted to the
        head's columns."""
        self._check_index(layer, output_row, head)
        p = {k: a[head] if np.ndim(a) else a for k, a in self.layer_projections(layer, output_row).items()}
        scale = 1.0 / np.sqrt(self.head_dim)
        return AttentionHead(p["K"].T @ p["Q"] * scale, p["V"].T @ p["w"], p["K"].T @ p["bQ"] * scale,
                             float(p["bV"] @ p["w"] + p["b"]), dtype)

    def layer(self, layer: int = 0, output_row: int = 0, dtype: str = "float64"):
        """All heads of layer ``layer`` at output row ``output_row`` as one multi-head layer (App. C): head h is
        :meth:`head` ``(layer, h)`` and ``c = Σ_h b_{V,h}·w_h + b`` holds the output bias once."""
        from attnprobe.models.multihead import MultiHeadAttention

        p = self.layer_projections(layer, output_row)
        return MultiHeadAttention.from_projections(p["Q"], p["K"], p["V"], p["w"].reshape(-1), float(p["b"]),
                                                   b_Q=p["bQ"], b_V=p["bV"], scale=1.0 / np.sqrt(self.head_dim),
                                                   dtype=dtype)
