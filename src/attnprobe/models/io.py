"""Save and load models as ``.npz`` files: the parameter arrays plus a ``kind`` tag."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError

_KINDS: dict[str, type] = {}


def register(cls: type) -> type:
    """Make a model class loadable by its ``kind``; each model class has ``arrays``/``from_arrays``."""
    _KINDS[cls.kind] = cls
    return cls


def save_model(model, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_suffix(".npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, kind=np.asarray(model.kind), **model.arrays())
    return path


def load_model(path: str | Path, dtype: str = "float64"):
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"model file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:
        raise ConfigError(f"cannot read {path} as an .npz model file: {exc}") from exc
    kind = str(arrays.pop("kind", "attention_head"))
    if kind not in _KINDS:
        raise ConfigError(f"{path} holds a model of unknown kind {kind!r}; known: {sorted(_KINDS)}")
    return _KINDS[kind].from_arrays(arrays, dtype=dtype)
