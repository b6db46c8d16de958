"""Victims answering every position: the real MiniLM-L6 attention sublayer run through ``transformers`` (output
row at every position, or at the last), and LLaMA-style grouped-query layers without rotation."""

from __future__ import annotations

import numpy as np

from attnprobe.models.multihead import MultiHeadAttention


class TransformersRows:
    """``X (B, N, d) ↦`` the attention sublayer of a BERT-family layer (``BertSelfAttention`` then the attention
    output dense, before residual and LayerNorm) computed by ``transformers`` on hidden states ``X``: every row
    ``(B, N, K)``, or the last ``(B, K)`` when ``every`` is False."""

    def __init__(self, model, layer: int, dtype, every: bool = True):
        att = model.encoder.layer[layer].attention
        self.self_attention, self.dense, self.dtype_t = att.self, att.output.dense, dtype
        self.every = bool(every)
        self.__name__ = f"transformers layer {layer} ({'every position' if every else 'last position'})"

    def __call__(self, X):
        import torch

        with torch.no_grad():
            h = torch.as_tensor(np.asarray(X), dtype=self.dtype_t)
            out = self.self_attention(h)
            ctx = out[0] if isinstance(out, tuple) else out
            y = self.dense(ctx if self.every else ctx[:, -1])
        return y.to(torch.float64).numpy()


def minilm_transformers_rows(layer: int = 0, dtype: str = "float32", every: bool = True) -> TransformersRows:
    """The real MiniLM-L6 layer ``layer`` through ``transformers`` in ``dtype`` (needs the torch and hf extras and
    the installed weights package)."""
    from attnprobe.oracles.hf_attention import DTYPES, load_bert
    from attnprobe.targets.hf import minilm_dir

    return TransformersRows(load_bert(str(minilm_dir()), dtype), layer, DTYPES[dtype], every)


def gqa_layer(d: int = 64, heads: int = 8, kv_heads: int = 2, seed: int = 0) -> MultiHeadAttention:
    """A LLaMA-style attention layer without rotation (seeded random projections with biases on the queries):
    ``heads`` query heads sharing ``kv_heads`` key/value heads in groups of ``heads // kv_heads``
    (``kv_heads == heads``: no sharing), head dimension ``d // heads``, output width d."""
    rng = np.random.default_rng(seed)
    dh = d // heads
    Q, Kg = rng.standard_normal((heads, dh, d)) * 0.35, rng.standard_normal((kv_heads, dh, d)) * 0.35
    Vg, WO = rng.standard_normal((kv_heads, dh, d)) / np.sqrt(d), rng.standard_normal((d, heads, dh)) / np.sqrt(d)
    g = np.arange(heads) // (heads // kv_heads)
    W = np.einsum("hrd,hre->hde", Kg[g], Q) / np.sqrt(dh)
    u = np.einsum("hrd,hr->hd", Kg[g], rng.standard_normal((heads, dh)) * 0.3) / np.sqrt(dh)
    return MultiHeadAttention(W, np.einsum("khr,hrd->hkd", WO, Vg[g]), u, rng.standard_normal(d) * 0.1)
