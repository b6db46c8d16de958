"""Torch adapters (optional extra ``torch``): oracles from torch modules, and recovered models written back.

The one-layer transformer of Sec. 4.1 in torch is ``nn.MultiheadAttention(d, 1, bias=False)`` read at the last
position (query = last token) followed by bias-free ``Linear(d, m)``, ``ReLU``, ``Linear(m, 1)``.
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import ConfigError, OracleError
from attnprobe.models.transformer import OneLayerTransformer
from attnprobe.oracles.base import Oracle

try:
    import torch
    from torch import nn
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the torch adapters need torch: pip install 'attnprobe[torch]' "
                      "(CPU build: pip install torch==2.13.0)") from exc


class TorchOneLayerTransformer(nn.Module):
    """``TF(X) = w_oᵀ ReLU(W₁ · MHA(x_N, X, X))``: one attention head (no biases) queried by the last token,
    then a bias-free two-layer ReLU FFN with a scalar output. Input (B, N, d), output (B,)."""

    def __init__(self, d: int, m: int, dtype=torch.float32):
        super().__init__()
        self.d, self.m = int(d), int(m)
        self.attn = nn.MultiheadAttention(d, 1, bias=False, batch_first=True, dtype=dtype)
        self.fc1 = nn.Linear(d, m, bias=False, dtype=dtype)
        self.fc2 = nn.Linear(m, 1, bias=False, dtype=dtype)

    def forward(self, X):
        out, _ = self.attn(X[:, -1:, :], X, X, need_weights=False)
        return self.fc2(torch.relu(self.fc1(out[:, 0, :])))[:, 0]


def _dtype_of(module) -> torch.dtype:
    for p in module.parameters():
        return p.dtype
    return torch.float32


class TorchFunction:
    """Calls a torch module ``(B, N, d) -> (B,)`` (or ``(B, 1)``) on numpy batches, without gradients, in the
    module's own dtype; answers come back as float64 numpy arrays."""

    def __init__(self, module, d: int):
        self.module = module.eval()
        self.d = int(d)
        self.dtype = _dtype_of(module)
        self.__name__ = type(module).__name__

    def __call__(self, X: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = self.module(torch.as_tensor(np.ascontiguousarray(X), dtype=self.dtype))
        out = out.detach().to(torch.float64).cpu().numpy()
        if out.ndim == 2 and out.shape[1] == 1:
            out = out[:, 0]
        return out


def oracle_from_torch(module, d: int | None = None, **kwargs) -> Oracle:
    """An :class:`Oracle` answering with a torch module; its precision is the module's dtype unless given
    (:func:`~attnprobe.oracles.base.answer_precision` reads it from the function's ``dtype``)."""
    if not isinstance(module, nn.Module):
        raise OracleError(f"expected a torch.nn.Module; got {type(module).__name__}")
    d = d if d is not None else getattr(module, "d", None)
    if d is None:
        raise ConfigError("give the input width d of the torch module", param="d")
    fn = TorchFunction(module, d)
    return Oracle(fn, d, name=kwargs.pop("name", fn.__name__), **kwargs)


def transformer_from_torch(module: TorchOneLayerTransformer) -> OneLayerTransformer:
    """The paper's parameters of a torch one-layer transformer: ``W = W_Kᵀ W_Q / √d``, ``A = (W₁ W_O W_V)ᵀ``,
    ``w_o`` = the output row (computed in float64 from the module's weights)."""
    a = module.attn
    d = a.embed_dim
    if a.num_heads != 1 or a.in_proj_weight is None or a.in_proj_bias is not None:
        raise ConfigError("need nn.MultiheadAttention(d, 1, bias=False) with a packed in_proj_weight", param="module")
    P = a.in_proj_weight.detach().to(torch.float64).numpy()
    Wq, Wk, Wv = P[:d], P[d:2 * d], P[2 * d:]
    Wo = a.out_proj.weight.detach().to(torch.float64).numpy()
    W1 = module.fc1.weight.detach().to(torch.float64).numpy()
    w2 = module.fc2.weight.detach().to(torch.float64).numpy()[0]
    return OneLayerTransformer(Wk.T @ Wq / math.sqrt(d), (W1 @ Wo @ Wv).T, w2)


def transformer_to_torch(model: OneLayerTransformer, dtype=torch.float32) -> TorchOneLayerTransformer:
    """A torch module computing ``model``: ``W_Q = √d·W``, ``W_K = W_V = W_O = I``, ``W₁ = Aᵀ``, ``w₂ = w_oᵀ``.
    ``module.state_dict()`` is the recovered state dict."""
    d, m = model.d, model.m
    mod = TorchOneLayerTransformer(d, m, dtype=dtype)
    eye = np.eye(d)
    packed = np.concatenate([math.sqrt(d) * model.W, eye, eye])
    with torch.no_grad():
        mod.attn.in_proj_weight.copy_(torch.as_tensor(packed, dtype=dtype))
        mod.attn.out_proj.weight.copy_(torch.as_tensor(eye, dtype=dtype))
        mod.fc1.weight.copy_(torch.as_tensor(np.array(model.A.T), dtype=dtype))
        mod.fc2.weight.copy_(torch.as_tensor(np.array(model.w_o[None, :]), dtype=dtype))
    return mod.eval()
