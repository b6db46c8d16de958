"""Whole transformer blocks: norms, attention, residuals and the FFN, hidden states in and out at every position
(docs/block.md).

Three layouts, with ``n1``, ``n2`` RMSNorm or LayerNorm with their weights (and LayerNorm's bias), ``A`` the
attention sublayer (:class:`~attnprobe.models.positional.PositionalAttention`: RoPE + GQA, or no position term)
and ``F`` the FFN (:class:`~attnprobe.models.smooth_ffn.SmoothFFN` ``W2 σ(W1 x + b1) + b2`` or
:class:`~attnprobe.models.gated_ffn.GatedFFN` ``W2 (σ(Wg x + bg) ⊙ (Wu x + bu)) + b2``, d outputs), applied row by
row:

- ``pre`` (LLaMA, Qwen2, Mistral; GPT-NeoX with ``use_parallel_residual=False``):
  ``h = x + A(n1(X))``, ``y = h + F(n2(h))``;
- ``parallel`` (GPT-NeoX, GPT-J): ``y = x + A(n1(X)) + F(n2(x))``;
- ``post`` (BERT): ``h = n1(x + A(X))``, ``y = n2(h + F(h))``.

``RMSNorm(x) = w ⊙ x / √(mean(x²) + ε)``; ``LayerNorm(x) = w ⊙ (x − mean x) / √(var x + ε) + b``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from attnprobe._validation import as_batch, real_array
from attnprobe.errors import ConfigError
from attnprobe.models.gated_ffn import GatedFFN
from attnprobe.models.positional import PositionalAttention
from attnprobe.models.precision import resolve_dtype
from attnprobe.models.smooth_ffn import SmoothFFN

#: norm kinds and block layouts, stored in model files as their index
NORMS = ("rms", "layer")
BLOCK_LAYOUTS = ("pre", "parallel", "post")
#: the FFN models a block may hold, stored in model files as their index (array ``ffn``)
BLOCK_FFNS = (SmoothFFN, GatedFFN)
_ATTN = "attn_"  # prefix of the attention's arrays in a block's file
_FFN = "ffn_"  # prefix of the FFN's arrays


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
    """A block (module docstring): ``attention``, ``ffn`` (a smooth or gated FFN from d to d numbers), the norms
    ``norm1_w, norm1_b, norm2_w, norm2_b`` (biases ``None`` for RMSNorm), ``layout``.

    As an oracle it answers every position: ``X (B, N, d) ↦ (B, N, d)`` (a served block returns every row).
    """

    attention: PositionalAttention
    ffn: SmoothFFN | GatedFFN
    norm1_w: np.ndarray
    norm2_w: np.ndarray
    norm1_b: np.ndarray | None = None
    norm2_b: np.ndarray | None = None
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
        if not isinstance(self.ffn, BLOCK_FFNS):
            raise ConfigError("ffn must be a SmoothFFN or a GatedFFN", param="ffn")
        if (self.ffn.d, self.ffn.outputs) != (d, d):
            raise ConfigError(f"a block's FFN must map d = {d} numbers to d (the residual adds them); got "
                              f"{self.ffn.d} → {self.ffn.outputs}", param="ffn")
        if self.norm not in NORMS:
            raise ConfigError(f"unknown norm {self.norm!r}; choose one of {', '.join(NORMS)}", param="norm")
        if self.layout not in BLOCK_LAYOUTS:
            raise ConfigError(f"unknown block layout {self.layout!r}; choose one of {', '.join(BLOCK_LAYOUTS)}",
                              param="layout")
        resolve_dtype(self.dtype)
        if not (isinstance(self.eps, (int, float)) and self.eps >= 0):
            raise ConfigError(f"eps must be a number ≥ 0; got {self.eps!r}", param="eps")
        names = ("norm1_w", "norm2_w") + (("norm1_b", "norm2_b") if self.norm == "layer" else ())
        for name in ("norm1_b", "norm2_b"):
            if self.norm == "rms" and getattr(self, name) is not None:
                raise ConfigError(f"an RMSNorm has no bias; drop {name}", param=name)
        for name in names:
            value = getattr(self, name)
            arr = np.zeros(d) if value is None else real_array(name, value, 1)
            if arr.shape != (d,):
                raise ConfigError(f"{name} must have {d} numbers; got shape {arr.shape}", param=name)
            arr = np.array(arr, dtype=np.float64)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "eps", float(self.eps))
        for part in ("attention", "ffn"):
            if getattr(self, part).dtype != self.dtype:
                object.__setattr__(self, part, getattr(self, part).with_dtype(self.dtype))

    # ------------------------------------------------------------------------------------------- shape
    @property
    def d(self) -> int:
        return self.attention.d

    @property
    def m(self) -> int:
        """The FFN's hidden width."""
        return self.ffn.m

    @property
    def outputs(self) -> int:
        return self.d

    @property
    def gated(self) -> bool:
        return isinstance(self.ffn, GatedFFN)

    @property
    def activation(self) -> str:
        """The FFN's activation (a gated FFN's gate activation)."""
        return self.ffn.activation

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
        """The FFN on rows ``x (..., d)``, computed (each rounding emulated) and returned in ``x``'s dtype."""
        dt = x.dtype
        return self.ffn.hidden_in(x, dt) @ self.ffn.W2.T.astype(dt) + self.ffn.b2.astype(dt)

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
        return replace(self, dtype=dtype)

    # -------------------------------------------------------------------------------------------- files
    def arrays(self) -> dict[str, np.ndarray]:
        out = {_ATTN + k: v for k, v in self.attention.arrays().items()}
        out.update({_FFN + k: v for k, v in self.ffn.arrays().items()})
        for name in ("norm1_w", "norm2_w", "norm1_b", "norm2_b"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update(ffn=np.asarray(BLOCK_FFNS.index(type(self.ffn))), norm=np.asarray(NORMS.index(self.norm)),
                   eps=np.asarray(self.eps), layout=np.asarray(BLOCK_LAYOUTS.index(self.layout)))
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64") -> "TransformerBlock":
        if "ffn" not in arrays and "W_in" in arrays:
            arrays = {**arrays, **ffn_arrays_of_flat_file(arrays)}
        missing = {"norm1_w", "norm2_w", "ffn", "norm", "layout"} - set(arrays)
        if missing:
            raise ConfigError(f"a transformer block needs arrays {sorted(missing)}", param="arrays")

        def code(name, names):
            i = int(np.asarray(arrays[name]).reshape(()))
            if not 0 <= i < len(names):
                raise ConfigError(f"array {name!r} must be an index into {names}; got {i}", param=name)
            return names[i]

        def part(prefix):
            return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}

        attention = PositionalAttention.from_arrays(part(_ATTN), dtype=dtype)
        ffn = code("ffn", BLOCK_FFNS).from_arrays(part(_FFN), dtype=dtype)
        return cls(attention, ffn, arrays["norm1_w"], arrays["norm2_w"], arrays.get("norm1_b"), arrays.get("norm2_b"),
                   norm=code("norm", NORMS), eps=float(np.asarray(arrays.get("eps", 1e-6)).reshape(())),
                   layout=code("layout", BLOCK_LAYOUTS), dtype=dtype)


def ffn_arrays_of_flat_file(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``ffn``/``ffn_*`` arrays of a block file written before the block held its FFN model (its arrays
    ``W_in, b_in, W_out, b_out`` and, gated, ``W_gate, b_gate`` beside the block's; absent biases were zeros)."""
    missing = {"W_out", "activation"} - set(arrays)
    if missing:
        raise ConfigError(f"a transformer block needs arrays {sorted(missing)}", param="arrays")
    m, d = np.shape(arrays["W_in"])[:1], np.shape(arrays["W_out"])[:1]
    up = {"W": arrays["W_in"], "b": arrays.get("b_in", np.zeros(m))}
    out = {"W2": arrays["W_out"], "b2": arrays.get("b_out", np.zeros(d)), "activation": arrays["activation"]}
    if "W_gate" in arrays:
        ffn = {"Wg": arrays["W_gate"], "bg": arrays.get("b_gate", np.zeros(m)), "Wu": up["W"], "bu": up["b"], **out}
    else:
        ffn = {"W1": up["W"], "b1": up["b"], **out}
    return {"ffn": np.asarray(BLOCK_FFNS.index(GatedFFN if "W_gate" in arrays else SmoothFFN)),
            **{_FFN + k: v for k, v in ffn.items()}}


# ------------------------------------------------------------------------------------------------ gauges
def fold_norm_weights(block: TransformerBlock) -> TransformerBlock:
    """The same function with the norms' weights 1 and LayerNorm biases 0 (a pre-norm or parallel block): each norm
    feeds only the next projections, so ``w`` folds into their columns and ``b`` into their biases (``W_Q diag(w)``,
    ``b_Q + W_Q b``; the FFN's first layer ``W1 diag(w)``, ``b1 + W1 b``, gated ``Wg`` and ``Wu`` alike). The
    answers fix only the products: this is the canonical form."""
    if block.layout == "post":
        raise ConfigError("a post-norm block's norms feed the residual too: their weights do not fold",
                          param="layout")
    a, f = block.attention, block.ffn
    w1, w2 = block.norm1_w, block.norm2_w
    b1 = np.zeros(block.d) if block.norm1_b is None else block.norm1_b
    b2 = np.zeros(block.d) if block.norm2_b is None else block.norm2_b
    attention = replace(a, Wq=a.Wq * w1, Wk=a.Wk * w1, Wv=a.Wv * w1,
                        bq=a.bq + a.Wq @ b1, bk=a.bk + a.Wk @ b1, bv=a.bv + a.Wv @ b1)
    first = {}
    for W, b in zip(f.FIRST_LAYER, f.FIRST_BIASES):
        first.update({W: getattr(f, W) * w2, b: getattr(f, b) + getattr(f, W) @ b2})
    ones, zeros = np.ones(block.d), (None if block.norm == "rms" else np.zeros(block.d))
    return replace(block, attention=attention, ffn=replace(f, **first), norm1_w=ones, norm2_w=ones, norm1_b=zeros,
                   norm2_b=zeros)


def flip_post_norm_sign(block: TransformerBlock) -> TransformerBlock:
    """The same function, another post-norm block: LayerNorm is odd (``LN₀(−u) = −LN₀(u)``), so negating the first
    norm's weight and bias (``h → −h``), the FFN's input and output (``F'(x) = −F(−x)``: its first-layer weights,
    ``W2`` and ``b2``) and the last norm's weight (not its bias) leaves every answer unchanged."""
    if block.layout != "post" or block.norm != "layer":
        raise ConfigError("the sign gauge is a post-norm LayerNorm block's", param="layout")
    f = block.ffn
    ffn = replace(f, W2=-f.W2, b2=-f.b2, **{W: -getattr(f, W) for W in f.FIRST_LAYER})
    return replace(block, ffn=ffn, norm1_w=-block.norm1_w, norm1_b=-block.norm1_b, norm2_w=-block.norm2_w)


def rescale_post_norm(block: TransformerBlock, scale: float, shift: float = 0.0) -> TransformerBlock:
    """Another post-norm block answering (nearly) the same: the last norm removes its input's mean and rms, so the
    first norm's output ``h`` may be scaled by ``c = scale`` and shifted along the ones vector by ``shift`` if the
    FFN follows (``F'(h') = c F((h' − shift·1)/c)``: ``W1/c``, ``b1 − shift·W1 1/c``, ``c W2``, ``c b2``); then
    ``u' = h' + F'(h') = c u + shift·1`` and ``n2(u') = n2(u)`` up to the last norm's ε (``ε/var u`` against
    ``ε/(c² var u)``: the scale is identifiable only through ε); a negative c also negates the last norm's weight,
    ``c = −1`` being :func:`flip_post_norm_sign` (exact). The shift is exact."""
    if block.layout != "post" or block.norm != "layer":
        raise ConfigError("the scale gauge is a post-norm LayerNorm block's", param="layout")
    c = float(scale)
    if not (np.isfinite(c) and c != 0 and np.isfinite(shift)):
        raise ConfigError(f"scale must be a finite nonzero number and shift finite; got {scale!r}, {shift!r}",
                          param="scale")
    f = block.ffn
    first = {}
    for W, b in zip(f.FIRST_LAYER, f.FIRST_BIASES):
        first.update({W: getattr(f, W) / c, b: getattr(f, b) - shift * getattr(f, W).sum(axis=1) / c})
    ffn = replace(f, W2=c * f.W2, b2=c * f.b2, **first)
    return replace(block, ffn=ffn, norm1_w=c * block.norm1_w, norm1_b=c * block.norm1_b + shift,
                   norm2_w=np.sign(c) * block.norm2_w)
