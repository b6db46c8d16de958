"""Multi-head attention whose logits depend on the offset between positions (docs/positional.md).

Query position ``i``, key position ``j ≤ i`` (or any ``j`` without a causal mask), offset ``δ = j − i``:

    ``s_h(i, j) = scale · q_h(x_i)ᵀ R(δ) k_g(x_j) + b_h(δ)``

with ``q_h(x) = W_Q,h x + b_Q,h``, ``k_g(x) = W_K,g x + b_K,g``, ``g = g(h)`` the key/value group of head ``h``
(GQA: ``H/G`` heads share one key and value projection) and one of three position terms:

- **RoPE** (LLaMA, Qwen2, Mistral, GPT-NeoX): ``R(δ)`` rotates pair ``k`` of the first ``rotary_dim`` coordinates of
  a head by the angle ``δ θ_k`` (``θ_k`` = ``inv_freq[k]``); pair ``k`` is ``(k, k + rotary_dim/2)`` in Hugging Face's
  rotate-half layout and ``(2k, 2k + 1)`` in the interleaved (GPT-J) layout; coordinates past ``rotary_dim`` are
  not rotated. ``b_h(δ) = 0``. Rotating the query at ``i`` by ``R(i)`` and the key at ``j`` by ``R(j)`` is the same
  score, which is how the modules compute it.
- **relative bias** (T5): ``R = I``, ``b_h(δ)`` = ``rel_bias[h, bucket(δ)]`` with T5's buckets (exact below half
  the buckets, logarithmic up to ``max_distance``; one half per direction when bidirectional).
- **ALiBi** (BLOOM): ``R = I``, ``b_h(δ) = slopes[h] · δ``.

The output row at position ``i`` is ``Σ_h W_O,h Σ_j α_h(i, j) (W_V,g x_j + b_V,g) + b_O`` (softmax over the
visible ``j``). ``__call__`` answers the last position ``(B, K)``; :meth:`every_position` answers ``(B, N, K)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from attnprobe._validation import as_batch, real_array
from attnprobe.errors import ConfigError
from attnprobe.models.precision import resolve_dtype
from attnprobe.models.softmax import softmax_last
from attnprobe.properties import axis_length

#: position terms, stored in model files as their index
POSITIONS = ("none", "rope", "t5", "alibi")
#: RoPE pair layouts: Hugging Face's rotate-half (pair k = (k, k + r/2)) and the interleaved one (pair k = (2k, 2k+1))
LAYOUTS = ("half", "interleaved")


# ------------------------------------------------------------------------------------------ frequencies
def rope_frequencies(rotary_dim: int, base: float = 10000.0, *, scaling: str = "default", factor: float = 1.0,
                     low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                     original_max_position_embeddings: int = 8192) -> np.ndarray:
    """``θ_k = base^(−2k/r)`` for ``k < r/2`` (float64), with Hugging Face's ``linear`` scaling (every θ divided
    by ``factor``) or ``llama3`` scaling (long wavelengths divided by ``factor``, short ones kept, the band between
    interpolated smoothly)."""
    if rotary_dim < 2 or rotary_dim % 2:
        raise ConfigError(f"rotary_dim must be a positive even number; got {rotary_dim}", param="rotary_dim")
    if not base > 1:
        raise ConfigError(f"the RoPE base must be > 1; got {base}", param="base")
    theta = 1.0 / base ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    if scaling == "default":
        return theta
    if not factor > 0:
        raise ConfigError(f"the RoPE scaling factor must be > 0; got {factor}", param="factor")
    if scaling == "linear":
        return theta / factor
    if scaling == "llama3":
        if not high_freq_factor > low_freq_factor:
            raise ConfigError(f"llama3 scaling needs high_freq_factor > low_freq_factor; got {high_freq_factor} and "
                              f"{low_freq_factor}", param="high_freq_factor")
        low_wavelen = original_max_position_embeddings / low_freq_factor
        high_wavelen = original_max_position_embeddings / high_freq_factor
        wavelen = 2 * math.pi / theta
        out = np.where(wavelen > low_wavelen, theta / factor, theta)
        smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, out)
    raise ConfigError(f"unknown RoPE scaling {scaling!r}; choose default, linear or llama3", param="scaling")


def t5_buckets(offsets: np.ndarray, num_buckets: int, max_distance: int, bidirectional: bool) -> np.ndarray:
    """T5's bucket of each offset ``δ = j − i`` (the logarithmic part computed in float32, as the module does)."""
    rel = np.asarray(offsets, dtype=np.int64)
    buckets = np.zeros_like(rel)
    n = int(num_buckets)
    if bidirectional:
        n //= 2
        buckets = buckets + (rel > 0).astype(np.int64) * n
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    exact = n // 2
    small = rel < exact
    far = np.maximum(rel, exact).astype(np.float32)  # the logarithmic branch is read only where rel ≥ exact
    ratio = np.log(far / np.float32(exact)) / np.float32(math.log(max_distance / exact))
    large = exact + (ratio * np.float32(n - exact)).astype(np.int64)
    large = np.minimum(large, n - 1)
    return buckets + np.where(small, rel, large)


def rotation_pairs(rotary_dim: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(a_k, b_k)`` of the coordinates rotated together by ``θ_k`` (``R`` maps ``(a, b)`` to
    ``(a cos − b sin, b cos + a sin)``)."""
    half = rotary_dim // 2
    if layout == "half":
        return np.arange(half), np.arange(half) + half
    if layout == "interleaved":
        return 2 * np.arange(half), 2 * np.arange(half) + 1
    raise ConfigError(f"unknown RoPE layout {layout!r}; choose one of {', '.join(LAYOUTS)}", param="layout")


def rotate(x: np.ndarray, angles: np.ndarray, pairs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """``R(angle) x`` on the last axis of ``x`` (..., d_h): pair ``k`` rotated by ``angles[..., k]``."""
    a, b = pairs
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    out = x.copy()
    xa, xb = x[..., a], x[..., b]
    out[..., a] = xa * cos - xb * sin
    out[..., b] = xb * cos + xa * sin
    return out


def rotation_matrix(delta: float, inv_freq: np.ndarray, head_dim: int, layout: str = "half",
                    rotary_dim: int | None = None) -> np.ndarray:
    """``R(δ)`` as a ``(d_h, d_h)`` matrix (identity past ``rotary_dim``)."""
    r = 2 * len(inv_freq) if rotary_dim is None else rotary_dim
    return rotate(np.eye(head_dim), np.broadcast_to(delta * np.asarray(inv_freq), (head_dim, r // 2)),
                  rotation_pairs(r, layout)).T


# ----------------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class PositionalAttention:
    """Multi-head attention with a position term (module docstring), in the projections' own layout.

    ``Wq (H, d_h, d)``, ``Wk (G, d_h, d)``, ``Wv (G, d_v, d)``, ``Wo (K, H·d_v)``; biases ``bq (H, d_h)``,
    ``bk (G, d_h)``, ``bv (G, d_v)``, ``bo (K,)`` (zeros when None); ``position`` one of :data:`POSITIONS` with its
    parameters (``inv_freq``, ``rotary_dim``, ``layout``; ``rel_bias (H, buckets)``, ``max_distance``,
    ``bidirectional``; ``slopes (H,)``); ``scale`` multiplies ``qᵀR k`` (default ``1/√d_h``); ``causal``: position
    ``i`` sees ``j ≤ i`` only. ``dtype`` is the precision the forward pass is computed in; answers are float64.
    """

    Wq: np.ndarray
    Wk: np.ndarray
    Wv: np.ndarray
    Wo: np.ndarray
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    position: str = "rope"
    inv_freq: np.ndarray | None = None
    rotary_dim: int | None = None
    layout: str = "half"
    rel_bias: np.ndarray | None = None
    max_distance: int = 128
    bidirectional: bool = True
    slopes: np.ndarray | None = None
    scale: float | None = None
    causal: bool = True
    dtype: str = "float64"
    kind: ClassVar[str] = "positional_attention"
    DESCRIPTION: ClassVar[str] = "a positional attention model"
    _cast: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        Wq = real_array("Wq", self.Wq, 3)
        Wk = real_array("Wk", self.Wk, 3)
        Wv = real_array("Wv", self.Wv, 3)
        Wo = real_array("Wo", self.Wo, 2)
        H, dh, d = Wq.shape
        G = Wk.shape[0]
        if min(H, dh, d, G) < 1 or Wk.shape != (G, dh, d):
            raise ConfigError(f"Wk must have shape (G, d_h, d) = (G, {dh}, {d}) to match Wq {Wq.shape}; got {Wk.shape}",
                              param="Wk")
        if H % G:
            raise ConfigError(f"the {H} query heads must split evenly into the {G} key/value groups (GQA)", param="Wk")
        if Wv.ndim != 3 or Wv.shape[0] != G or Wv.shape[2] != d:
            raise ConfigError(f"Wv must have shape (G, d_v, d) = ({G}, d_v, {d}); got {Wv.shape}", param="Wv")
        dv = Wv.shape[1]
        if Wo.shape[1] != H * dv:
            raise ConfigError(f"Wo must have shape (K, H·d_v) = (K, {H * dv}); got {Wo.shape}", param="Wo")
        K = Wo.shape[0]
        set_ = {"Wq": Wq, "Wk": Wk, "Wv": Wv, "Wo": Wo}
        for name, shape in (("bq", (H, dh)), ("bk", (G, dh)), ("bv", (G, dv)), ("bo", (K,))):
            value = getattr(self, name)
            arr = np.zeros(shape) if value is None else real_array(name, value).reshape(-1)
            if arr.size != int(np.prod(shape)):
                raise ConfigError(f"{name} must have {int(np.prod(shape))} numbers (shape {shape}); "
                                  f"got {np.shape(value)}", param=name)
            set_[name] = arr.reshape(shape)
        if self.position not in POSITIONS:
            raise ConfigError(f"unknown position term {self.position!r}; choose one of {', '.join(POSITIONS)}",
                              param="position")
        if self.position == "rope":
            if self.inv_freq is None:
                raise ConfigError("a RoPE model needs inv_freq (the rotation frequencies θ_k)", param="inv_freq")
            inv = real_array("inv_freq", self.inv_freq, 1)
            r = 2 * inv.size if self.rotary_dim is None else int(self.rotary_dim)
            if r != 2 * inv.size or r > dh or r < 2:
                raise ConfigError(f"rotary_dim must be 2·len(inv_freq) = {2 * inv.size} and at most d_h = {dh}; "
                                  f"got {r}", param="rotary_dim")
            rotation_pairs(r, self.layout)
            set_["inv_freq"] = inv
            object.__setattr__(self, "rotary_dim", r)
        if self.position == "t5":
            rb = real_array("rel_bias", self.rel_bias, 2) if self.rel_bias is not None else None
            if rb is None or rb.shape[0] != H or rb.shape[1] < 2:
                raise ConfigError(f"a T5 model needs rel_bias of shape (H, buckets) = ({H}, buckets ≥ 2)",
                                  param="rel_bias")
            if int(self.max_distance) <= rb.shape[1] // (4 if self.bidirectional else 2):
                raise ConfigError(f"max_distance must exceed the exact buckets; got {self.max_distance}",
                                  param="max_distance")
            set_["rel_bias"] = rb
        if self.position == "alibi":
            sl = real_array("slopes", self.slopes, 1) if self.slopes is not None else None
            if sl is None or sl.shape != (H,):
                raise ConfigError(f"an ALiBi model needs one slope per head: slopes of shape ({H},)", param="slopes")
            set_["slopes"] = sl
        resolve_dtype(self.dtype)
        for name, arr in set_.items():
            arr = np.array(arr, dtype=np.float64)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "scale", 1.0 / math.sqrt(dh) if self.scale is None else float(self.scale))
        object.__setattr__(self, "causal", bool(self.causal))
        object.__setattr__(self, "bidirectional", bool(self.bidirectional))

    # ------------------------------------------------------------------------------------------- shape
    H = axis_length("Wq", 0, "The query heads.")
    G = axis_length("Wk", 0, "The key/value groups (GQA).")
    head_dim = axis_length("Wq", 1, "The width d_h of a head's queries and keys.")
    d = axis_length("Wq", 2, "The input width.")
    outputs = axis_length("Wo", 0, "The output width K.")

    @property
    def vector(self) -> bool:
        return True

    def group(self, h: int) -> int:
        """The key/value group of query head ``h``."""
        return h // (self.H // self.G)

    @staticmethod
    def unknowns(d: int, H: int, G: int, head_dim: int, K: int, *, bias: bool = False, position: str = "rope",
                 buckets: int = 32) -> int:
        """Numbers that determine the function: per head and rotation pair ``W_Q, W_K`` up to a scaled rotation of
        the pair (``2 d_h d − d_h`` for a head's ``W_Q`` given its group's ``W_K``), ``V_h = W_O,h W_V,g``
        (``d_h(d + K) − d_h²`` each), biases, and the position term's own numbers."""
        n = H * head_dim * d + G * head_dim * d - H * head_dim  # W_Q, W_K up to a scaled rotation per pair and head
        n += H * (head_dim * (d + K) - head_dim * head_dim) + K
        if bias:
            n += H * head_dim + G * head_dim
        n += {"rope": head_dim // 2, "t5": H * buckets, "alibi": H}.get(position, 0)
        return n

    # -------------------------------------------------------------------------------------------- terms
    def _params(self) -> dict:
        if not self._cast:
            dt = resolve_dtype(self.dtype)
            self._cast.update(dt=dt, **{k: getattr(self, k).astype(dt) for k in
                                        ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")})
        return self._cast

    def position_bias(self, offsets: np.ndarray) -> np.ndarray | None:
        """``b_h(δ)`` for an array of offsets: shape ``(H, *offsets.shape)`` (None for RoPE and none)."""
        if self.position == "t5":
            return self.rel_bias[:, t5_buckets(offsets, self.rel_bias.shape[1], self.max_distance, self.bidirectional)]
        if self.position == "alibi":
            return self.slopes.reshape((-1,) + (1,) * np.ndim(offsets)) * np.asarray(offsets, dtype=np.float64)
        return None

    def logit_matrix(self, h: int, delta: int) -> np.ndarray:
        """``B_h(δ) = scale · W_Q,hᵀ R(δ) W_K,g`` (d × d): the score of query ``x`` and key ``y`` at offset ``δ`` is
        ``xᵀ B_h(δ) y`` plus bias terms."""
        g = self.group(h)
        R = np.eye(self.head_dim)
        if self.position == "rope":
            R = rotation_matrix(delta, self.inv_freq, self.head_dim, self.layout, self.rotary_dim)
        return self.scale * self.Wq[h].T @ R @ self.Wk[g]

    def value_maps(self) -> np.ndarray:
        """``V_h = W_O,h W_V,g`` for every head: (H, K, d)."""
        dv = self.Wv.shape[1]
        WO = self.Wo.reshape(self.outputs, self.H, dv)
        return np.stack([WO[:, h] @ self.Wv[self.group(h)] for h in range(self.H)])

    def output_bias(self) -> np.ndarray:
        """``c = W_O b_V + b_O`` (the value biases pass through the softmax unchanged)."""
        bv = np.concatenate([self.bv[self.group(h)] for h in range(self.H)])
        return self.Wo @ bv + self.bo

    # ------------------------------------------------------------------------------------------ forward
    def _rotated(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """RoPE on the last axis of ``x`` (B, heads, N, d_h) at ``positions`` (N,)."""
        if self.position != "rope":
            return x
        angles = positions[:, None].astype(np.float64) * self.inv_freq[None, :]  # (N, r/2), float64
        return rotate(x, angles, rotation_pairs(self.rotary_dim, self.layout))

    def _scores(self, Xc, queries: np.ndarray):
        """Scores of query rows ``queries`` (indices) against every key: (B, H, n_q, N), masked."""
        p = self._params()
        B, N, d = Xc.shape
        H, G = self.H, self.G
        pos = np.arange(N)
        q = np.einsum("bnd,hkd->bhnk", Xc[:, queries], p["Wq"]) + p["bq"][None, :, None, :]
        k = np.einsum("bnd,gkd->bgnk", Xc, p["Wk"]) + p["bk"][None, :, None, :]
        q = self._rotated(q, pos[queries])
        k = self._rotated(k, pos)
        k = np.repeat(k, H // G, axis=1)
        s = np.matmul(q, k.transpose(0, 1, 3, 2)) * p["dt"].type(self.scale)
        offsets = pos[None, :] - pos[queries][:, None]  # (n_q, N): δ = j − i
        bias = self.position_bias(offsets)
        if bias is not None:
            s = s + bias.astype(p["dt"])[None]
        if self.causal:
            s = np.where(offsets[None, None] > 0, -np.inf, s)
        return s

    def _answer(self, X, queries) -> np.ndarray:
        p = self._params()
        Xc = as_batch(X, self.d).astype(p["dt"])
        alpha = softmax_last(self._scores(Xc, queries))  # (B, H, n_q, N)
        v = np.einsum("bnd,gkd->bgnk", Xc, p["Wv"]) + p["bv"][None, :, None, :]
        v = np.repeat(v, self.H // self.G, axis=1)
        ctx = np.matmul(alpha, v)  # (B, H, n_q, d_v)
        B, H, nq, dv = ctx.shape
        out = ctx.transpose(0, 2, 1, 3).reshape(B, nq, H * dv) @ p["Wo"].T + p["bo"]
        return out.astype(np.float64)

    def attention(self, X: np.ndarray) -> np.ndarray:
        """Attention weights of the last position, every head: (B, H, N)."""
        p = self._params()
        Xc = as_batch(X, self.d).astype(p["dt"])
        return softmax_last(self._scores(Xc, np.array([Xc.shape[1] - 1])))[:, :, 0].astype(np.float64)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """The output row at the last position: (B, K)."""
        N = as_batch(X, self.d).shape[1]
        return self._answer(X, np.array([N - 1]))[:, 0]

    def every_position(self, X: np.ndarray) -> np.ndarray:
        """The output row at every position: (B, N, K)."""
        N = as_batch(X, self.d).shape[1]
        return self._answer(X, np.arange(N))

    def with_dtype(self, dtype: str) -> "PositionalAttention":
        return PositionalAttention(**{**self._fields(), "dtype": dtype})

    def _fields(self) -> dict:
        names = ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo", "position", "inv_freq", "rotary_dim", "layout",
                 "rel_bias", "max_distance", "bidirectional", "slopes", "scale", "causal", "dtype")
        return {n: getattr(self, n) for n in names}

    # -------------------------------------------------------------------------------------------- files
    def arrays(self) -> dict[str, np.ndarray]:
        out = {k: getattr(self, k) for k in ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo")}
        out.update(position=np.asarray(POSITIONS.index(self.position)), scale=np.asarray(self.scale),
                   causal=np.asarray(int(self.causal)))
        if self.position == "rope":
            out.update(inv_freq=self.inv_freq, layout=np.asarray(LAYOUTS.index(self.layout)))
        if self.position == "t5":
            out.update(rel_bias=self.rel_bias, max_distance=np.asarray(self.max_distance),
                       bidirectional=np.asarray(int(self.bidirectional)))
        if self.position == "alibi":
            out.update(slopes=self.slopes)
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dtype: str = "float64") -> "PositionalAttention":
        missing = {"Wq", "Wk", "Wv", "Wo", "position"} - set(arrays)
        if missing:
            raise ConfigError(f"{cls.DESCRIPTION} needs arrays {sorted(missing)}", param="arrays")

        def code(name, names, default=0):
            i = int(np.asarray(arrays.get(name, default)).reshape(()))
            if not 0 <= i < len(names):
                raise ConfigError(f"array {name!r} must be an index into {names}; got {i}", param="arrays")
            return names[i]

        kw = {k: arrays.get(k) for k in ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo", "inv_freq", "rel_bias",
                                        "slopes")}
        kw["position"] = code("position", POSITIONS)
        kw["layout"] = code("layout", LAYOUTS)
        if "scale" in arrays:
            kw["scale"] = float(np.asarray(arrays["scale"]).reshape(()))
        kw["causal"] = bool(int(np.asarray(arrays.get("causal", 1)).reshape(())))
        kw["bidirectional"] = bool(int(np.asarray(arrays.get("bidirectional", 1)).reshape(())))
        kw["max_distance"] = int(np.asarray(arrays.get("max_distance", 128)).reshape(()))
        return cls(**kw, dtype=dtype)
