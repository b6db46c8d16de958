"""Whole transformer blocks: norms, attention, residuals and the FFN, hidden states in and out at every position
(docs/block.md).

Three layouts, with ``n1``, ``n2`` RMSNorm or LayerNorm with their weights (and LayerNorm's bias), ``A`` the
attention sublayer (:class:`~attnprobe.models.positional.PositionalAttention`: RoPE + GQA, or no position term)
and ``F`` the FFN (plain ``W_out σ(W_in x + b_in) + b_out`` or gated ``W_out (σ(W_gate x + b_gate) ⊙ (W_in x +
b_in)) + b_out``), applied row by row:

- ``pre`` (LLaMA, Qwen2, Mistral; GPT-NeoX with ``use_parallel_residual=False``):
  ``h = x + A(n1(X))``, ``y = h + F(n2(h))``;
- ``parallel`` (GPT-NeoX, GPT-J): ``y = x + A(n1(X)) + F(n2(x))``;
- ``post`` (BERT): ``h = n1(x + A(X))``, ``y = n2(h + F(h))``.

``RMSNorm(x) = w ⊙ x / √(mean(x²) + ε)``; ``LayerNorm(x) = w ⊙ (x − mean x) / √(var x + ε) + b``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attnprobe._validation import as_batch, real_array
from attnprobe.errors import ConfigError
from attnprobe.models.positional import PositionalAttention
from attnprobe.models.precision import resolve_dtype
from attnprobe.models.smooth_ffn import ACTIVATION_CODES, ACTIVATIONS, activation

#: norm kinds and block layouts, stored in model files as their index
NORMS = ("rms", "layer")
BLOCK_LAYOUTS = ("pre", "parallel", "post")
_ATTN = "attn_"  # prefix of the attention's arrays in a block's file


def normalize(x: np.ndarray, kind: str, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """RMSNorm or LayerNorm over the last axis of ``x`` (in ``x``'s dtype)."""
    if kind == "rms":
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(eps)) * weight
    mu = np.mean(x, axis=-1, keepdims=True)
    c = x - mu
    out = c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + x.dtype.type(eps)) * weight
    return out if bias is None else out + bias


@dataclass(frozen=True)
class TransformerBlock:
    """A block (module docstring): ``attention``, the norms ``norm1_w, norm1_b, norm2_w, norm2_b`` (biases ``None``
    for RMSNorm), the FFN ``W_in (m, d), b_in (m,), W_out (d, m), b_out (d,)`` and, gated, ``W_gate (m, d),
    b_gate (m,)`` (zeros for absent biases), ``activation`` one of the smooth activations, ``layout``.

    As an oracle it answers every position: ``X (B, N, d) ↦ (B, N, d)`` (a served block returns every row).
    """

    attention: PositionalAttention
    norm1_w: np.ndarray
    norm2_w: np.ndarray
    W_in: np.ndarray
    W_out: np.ndarray
    norm1_b: np.ndarray | None = None
    norm2_b: np.ndarray | None = None
    b_in: np.ndarray | None = None
    b_out: np.ndarray | None = None
    W_gate: np.ndarray | None = None
    b_gate: np.ndarray | None = None
    activation: str = "silu"
    norm: str = "rms"
    eps: float = 1e-6
    layout: str = "pre"
    dtype: str = "float64"
    kind: ClassVar[str] = "transformer_block"

    def __post_init__(self) -> None:
        if not isinstance(self.attention, PositionalAttention):
            raise ConfigError("attention must be a PositionalAttention", param="attention")
        d = self.attention.d
        if self.attention.outputs != d:
            raise ConfigError(f"a block's attention must answer d = {d} numbers (the residual adds them); "
                              f"got {self.attention.outputs}", param="attention")
        if self.norm not in NORMS:
            raise ConfigError(f"unknown norm {self.norm!r}; choose one of {', '.join(NORMS)}", param="norm")
        if self.layout not in BLOCK_LAYOUTS:
            raise ConfigError(f"unknown block layout {self.layout!r}; choose one of {', '.join(BLOCK_LAYOUTS)}",
                              param="layout")
        activation(self.activation)
        resolve_dtype(self.dtype)
        if not (isinstance(self.eps, (int, float)) and self.eps >= 0):
            raise ConfigError(f"eps must be a number ≥ 0; got {self.eps!r}", param="eps")
        W_in, W_out = real_array("W_in", self.W_in, 2), real_array("W_out", self.W_out, 2)
        m = W_in.shape[0]
        if W_in.shape != (m, d) or W_out.shape != (d, m) or m < 1:
            raise ConfigError(f"W_in must be (m, {d}) and W_out ({d}, m); got {W_in.shape}, {W_out.shape}",
                              param="W_in")
        arrays = {"W_in": W_in, "W_out": W_out}
        if self.W_gate is not None:
            arrays["W_gate"] = real_array("W_gate", self.W_gate, 2)
            if arrays["W_gate"].shape != (m, d):
                raise ConfigError(f"W_gate must have the shape of W_in {(m, d)}; got {arrays['W_gate'].shape}",
                                  param="W_gate")
        vectors = {"norm1_w": d, "norm2_w": d, "b_in": m, "b_out": d}
        if self.W_gate is not None:
            vectors["b_gate"] = m
        if self.norm == "layer":
            vectors.update(norm1_b=d, norm2_b=d)
        for name, n in vectors.items():
            value = getattr(self, name)
            arr = np.zeros(n) if value is None else real_array(name, value, 1)
            if arr.shape != (n,):
                raise ConfigError(f"{name} must have {n} numbers; got shape {arr.shape}", param=name)
            arrays[name] = arr
        for name in ("norm1_b", "norm2_b"):
            if self.norm == "rms" and getattr(self, name) is not None:
                raise ConfigError(f"an RMSNorm has no bias; drop {name}", param=name)
        for name, arr in arrays.items():
            arr = np.array(arr, dtype=np.float64)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "eps", float(self.eps))
        if self.attention.dtype != self.dtype:
            object.__setattr__(self, "attention", self.attention.with_dtype(self.dtype))

    # ------------------------------------------------------------------------------------------- shape
    @property
    def d(self) -> int:
        return self.attention.d

    @property
    def m(self) -> int:
        return self.W_in.shape[0]

    @property
    def outputs(self) -> int:
        return self.d

    @property
    def gated(self) -> bool:
        return self.W_gate is not None

    @property
    def positions(self) -> str:
        """What the rows are (docs/every-position.md): ``positional`` under RoPE, else causal or bidirectional."""
        if self.attention.position != "none":
            return "positional"
        return "causal" if self.attention.causal else "bidirectional"

    # ------------------------------------------------------------------------------------------ forward
    def _norm(self, x: np.ndarray, which: int) -> np.ndarray:
        w = getattr(self, f"norm{which}_w").astype(x.dtype)
        b = getattr(self, f"norm{which}_b")
        return normalize(x, self.norm, w, None if b is None else b.astype(x.dtype), self.eps)

    def mlp(self, x: np.ndarray) -> np.ndarray:
        """The FFN on rows ``x (..., d)`` (in ``x``'s dtype)."""
        dt = x.dtype
        act = ACTIVATIONS[self.activation].f
        up = x @ self.W_in.T.astype(dt) + self.b_in.astype(dt)
        if self.gated:
            gate = x @ self.W_gate.T.astype(dt) + self.b_gate.astype(dt)
            hidden = act(gate.astype(np.float64)).astype(dt) * up
        else:
            hidden = act(up.astype(np.float64)).astype(dt)
        return hidden @ self.W_out.T.astype(dt) + self.b_out.astype(dt)

    def every_position(self, X: np.ndarray) -> np.ndarray:
        """The block's output at every position: (B, N, d)."""
        dt = resolve_dtype(self.dtype)
        x = as_batch(X, self.d).astype(dt)
        attend = self.attention.every_position
        if self.layout == "pre":
            h = x + attend(self._norm(x, 1)).astype(dt)
            y = h + self.mlp(self._norm(h, 2))
        elif self.layout == "parallel":
            y = x + attend(self._norm(x, 1)).astype(dt) + self.mlp(self._norm(x, 2))
        else:
            h = self._norm(x + attend(x).astype(dt), 1)
            y = self._norm(h + self.mlp(h), 2)
        return y.astype(np.float64)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """Every position, as a served block answers: (B, N, d)."""
        return self.every_position(X)

    def with_dtype(self, dtype: str) -> "TransformerBlock":
        return TransformerBlock(**{**self._fields(), "dtype": dtype})

    def _fields(self) -> dict:
        names = ("attention", "norm1_w", "norm2_w", "W_in", "W_out", "norm1_b", "norm2_b", "b_in", "b_out", "W_gate",
                 "b_gate", "activation", "norm", "eps", "layout", "dtype")
        return {n: getattr(self, n) for n in names}

    # -------------------------------------------------------------------------------------------- files
    def arrays(self) -> dict[str, np.ndarray]:
        out = {_ATTN + k: v for k, v in self.attention.arrays().items()}
        for name in ("norm1_w", "norm2_w", "W_in", "W_out", "b_in", "b_out", "norm1_b", "norm2_b", "W_gate",
                     "b_gate"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update(activation=np.asarray(ACTIVATION_CODES[self.activation]), norm=np.asarray(NORMS.index(self.norm)),
                   eps=np.asarray(self.eps), layout=np.asarray(BLOCK_LAYOUTS.index(self.layout)))
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64") -> "TransformerBlock":
        missing = {"norm1_w", "norm2_w", "W_in", "W_out", "activation", "norm", "layout"} - set(arrays)
        if missing:
            raise ConfigError(f"a transformer block needs arrays {sorted(missing)}", param="arrays")

        def code(name, names):
            i = int(np.asarray(arrays[name]).reshape(()))
            if not 0 <= i < len(names):
                raise ConfigError(f"array {name!r} must be an index into {names}; got {i}", param=name)
            return names[i]

        attention = PositionalAttention.from_arrays({k[len(_ATTN):]: v for k, v in arrays.items()
                                                     if k.startswith(_ATTN)}, dtype=dtype)
        kw = {k: arrays.get(k) for k in ("norm1_w", "norm2_w", "W_in", "W_out", "norm1_b", "norm2_b", "b_in",
                                        "b_out", "W_gate", "b_gate")}
        return cls(attention, **kw, activation=code("activation", tuple(ACTIVATION_CODES)),
                   norm=code("norm", NORMS), eps=float(np.asarray(arrays.get("eps", 1e-6)).reshape(())),
                   layout=code("layout", BLOCK_LAYOUTS), dtype=dtype)


# ------------------------------------------------------------------------------------------------ gauges
def fold_norm_weights(block: TransformerBlock) -> TransformerBlock:
    """The same function with the norms' weights 1 and LayerNorm biases 0 (a pre-norm or parallel block): each norm
    feeds only the next projections, so ``w`` folds into their columns and ``b`` into their biases (``W_Q diag(w)``,
    ``b_Q + W_Q b``; ``W_in diag(w)``, ...). The answers fix only the products: this is the canonical form."""
    if block.layout == "post":
        raise ConfigError("a post-norm block's norms feed the residual too: their weights do not fold",
                          param="layout")
    a = block.attention
    w1, w2 = block.norm1_w, block.norm2_w
    b1 = np.zeros(block.d) if block.norm1_b is None else block.norm1_b
    b2 = np.zeros(block.d) if block.norm2_b is None else block.norm2_b
    attention = PositionalAttention(**{**a._fields(), "Wq": a.Wq * w1, "Wk": a.Wk * w1, "Wv": a.Wv * w1,
                                       "bq": a.bq + a.Wq @ b1, "bk": a.bk + a.Wk @ b1, "bv": a.bv + a.Wv @ b1})
    ones, zeros = np.ones(block.d), (None if block.norm == "rms" else np.zeros(block.d))
    gate = {} if not block.gated else {"W_gate": block.W_gate * w2, "b_gate": block.b_gate + block.W_gate @ b2}
    return TransformerBlock(**{**block._fields(), "attention": attention, "norm1_w": ones, "norm2_w": ones,
                               "norm1_b": zeros, "norm2_b": zeros, "W_in": block.W_in * w2,
                               "b_in": block.b_in + block.W_in @ b2, **gate})


def flip_post_norm_sign(block: TransformerBlock) -> TransformerBlock:
    """The same function, another post-norm block: LayerNorm is odd (``LN₀(−u) = −LN₀(u)``), so negating the first
    norm's weight and bias (``h → −h``), the FFN's input and output (``F'(x) = −F(−x)``: ``W_in``, ``W_gate``,
    ``W_out``, ``b_out``) and the last norm's weight (not its bias) leaves every answer unchanged."""
    if block.layout != "post" or block.norm != "layer":
        raise ConfigError("the sign gauge is a post-norm LayerNorm block's", param="layout")
    gate = {} if not block.gated else {"W_gate": -block.W_gate}
    return TransformerBlock(**{**block._fields(), "norm1_w": -block.norm1_w, "norm1_b": -block.norm1_b,
                               "norm2_w": -block.norm2_w, "W_in": -block.W_in, "W_out": -block.W_out,
                               "b_out": -block.b_out, **gate})
