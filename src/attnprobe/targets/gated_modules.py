"""``transformers``' own gated MLPs as victims (optional extras ``torch``, ``hf``): ``LlamaMLP`` (SwiGLU:
``down(silu(gate x) * up x)``) built from ``LlamaConfig`` (``mlp_bias`` for the biased form, ``hidden_act``
``silu`` or ``gelu``/``gelu_pytorch_tanh`` for GeGLU), its weights drawn at ``1/√fan-in`` so the pre-activations
of N(0, I) inputs are of order one (the config's default 0.02 would leave the gates nearly linear).

The victim answers a length-1 query ``(B, 1, d)`` with the MLP's output ``(B, K)`` (the last position's row);
:meth:`LlamaMLPVictim.reference` reads the same function into a :class:`~attnprobe.models.gated_ffn.GatedFFN`.
"""

from __future__ import annotations

import os

import numpy as np

from attnprobe.models.gated_ffn import GATED_FAMILIES, GatedFFN
from attnprobe.oracles.torch_adapter import nn, torch

#: the config's ``hidden_act`` for each gate activation
HF_ACT = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}
DTYPES = {"float64": torch.float64, "float32": torch.float32}


class LlamaMLPVictim(nn.Module):
    """``X (B, N, d) ↦ LlamaMLP(x_N)`` ``(B, K)``."""

    def __init__(self, mlp, gate: str):
        super().__init__()
        self.mlp = mlp.eval()
        self.gate = gate
        self.d = int(mlp.hidden_size)

    def forward(self, X):
        return self.mlp(X[:, -1, :])

    def reference(self) -> GatedFFN:
        """The same function as a :class:`GatedFFN` (float64)."""
        def arr(lin, bias=False):
            t = lin.bias if bias else lin.weight
            if t is None:
                return np.zeros(lin.weight.shape[0])
            return t.detach().to(torch.float64).numpy().copy()

        g, u, dn = self.mlp.gate_proj, self.mlp.up_proj, self.mlp.down_proj
        return GatedFFN(arr(g), arr(g, True), arr(u), arr(u, True), arr(dn), arr(dn, True), self.gate)


def llama_mlp(d: int, m: int, *, family: str = "swiglu", bias: bool = False, seed: int = 0,
              dtype: str = "float64") -> LlamaMLPVictim:
    """A random-init ``LlamaMLP`` (hidden size d, intermediate size m) with weights N(0, 1/fan-in) and, when
    ``bias``, biases N(0, 0.1²); ``family`` ``swiglu``, ``geglu`` or ``geglu_tanh`` sets ``hidden_act``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from transformers.models.llama.modeling_llama import LlamaMLP

    transformers.utils.logging.set_verbosity_error()
    gate = GATED_FAMILIES[family]
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=m, hidden_act=HF_ACT[gate], mlp_bias=bias,
                                      num_attention_heads=1, num_key_value_heads=1, num_hidden_layers=1)
    mlp = LlamaMLP(config).to(DTYPES[dtype])
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            fan_in = lin.weight.shape[1]
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen, dtype=torch.float64) / fan_in ** 0.5)
            if lin.bias is not None:
                lin.bias.copy_(0.1 * torch.randn(lin.bias.shape, generator=gen, dtype=torch.float64))
    return LlamaMLPVictim(mlp, gate)
