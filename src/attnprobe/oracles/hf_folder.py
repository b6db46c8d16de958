"""A Hugging Face model folder (``config.json`` + ``model.safetensors``), checked and read without torch."""

from __future__ import annotations

import json
from pathlib import Path

from attnprobe.errors import ConfigError

def check_model_dir(model_dir) -> Path:
    """``model_dir`` if it holds a ``config.json`` and ``model.safetensors``."""
    path = Path(model_dir)
    if not path.exists():
        raise ConfigError(f"{path} does not exist; give the folder of a Hugging Face model (config.json and "
                          "model.safetensors)", param="model_dir")
    if not path.is_dir():
        raise ConfigError(f"{path} is not a folder; give the folder of a Hugging Face model (config.json and "
                          "model.safetensors)", param="model_dir")
    for name in ("config.json", "model.safetensors"):
        if not (path / name).is_file():
            raise ConfigError(f"{path} has no {name}; a Hugging Face model folder holds config.json and "
                              "model.safetensors (export one with model.save_pretrained(folder))", param="model_dir")
    return path


def read_config(model_dir) -> dict:
    """The model's ``config.json`` as a dict (a readable JSON object); what its keys must say is the family's
    business (:func:`attnprobe.oracles.hf_families.layer_spec`)."""
    path = check_model_dir(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path} as JSON: {exc}", param="model_dir") from exc
    if not isinstance(config, dict):
        raise ConfigError(f"{path} must hold a JSON object; got {type(config).__name__}", param="model_dir")
    return config
