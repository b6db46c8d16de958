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


class LlamaRows:
    """``X (B, N, d) ↦ (B, N, d)``: a ``transformers`` ``LlamaAttention`` (eager, float64 weights, seeded random
    projections with biases) with its rotation turned off (cos = 1, sin = 0) and no mask: a bidirectional layer
    of ``heads`` query heads sharing ``kv_heads`` key/value heads. Its kernel computes the softmax in float32, so
    its answers are float32-accurate. ``truth()`` is the layer as a :class:`MultiHeadAttention`."""

    def __init__(self, d: int = 64, heads: int = 8, kv_heads: int = 2, seed: int = 0):
        import torch
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaAttention

        self.dh = d // heads
        cfg = LlamaConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv_heads,
                          attention_bias=True, head_dim=self.dh)
        cfg._attn_implementation = "eager"
        gen = torch.Generator().manual_seed(seed)
        self.attn = LlamaAttention(cfg, layer_idx=0).double().eval()
        with torch.no_grad():
            for lin in (self.attn.q_proj, self.attn.k_proj, self.attn.v_proj, self.attn.o_proj):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen, dtype=torch.float64) * 0.3)
                lin.bias.copy_(torch.randn(lin.bias.shape, generator=gen, dtype=torch.float64) * 0.1)
        self.d, self.heads, self.kv_heads = d, heads, kv_heads
        self.__name__ = f"LlamaAttention {heads} query / {kv_heads} KV heads, no rotation"

    def __call__(self, X):
        import torch

        h = torch.as_tensor(np.asarray(X, dtype=np.float64))
        B, N, _ = h.shape
        ones = torch.ones(B, N, self.dh, dtype=h.dtype)
        with torch.no_grad():
            out = self.attn(h, position_embeddings=(ones, torch.zeros_like(ones)), attention_mask=None)[0]
        return out.numpy()

    def truth(self) -> MultiHeadAttention:
        """``W_h = K_gᵀQ_h/√d_h``, ``u_h = K_gᵀb_Q,h/√d_h``, ``V_h = W_O[:, h] W_V,g``, ``c = W_O b_V,g(h) + b_O``."""
        a, H, G, dh, d = self.attn, self.heads, self.kv_heads, self.dh, self.d
        w = {n: getattr(a, n).weight.detach().numpy() for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
        b = {n: getattr(a, n).bias.detach().numpy() for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
        g = np.arange(H) // (H // G)
        Q, bQ = w["q_proj"].reshape(H, dh, d), b["q_proj"].reshape(H, dh)
        K, Vw, bV = w["k_proj"].reshape(G, dh, d)[g], w["v_proj"].reshape(G, dh, d)[g], b["v_proj"].reshape(G, dh)[g]
        WO = w["o_proj"].reshape(d, H, dh)
        W = np.einsum("hrd,hre->hde", K, Q) / np.sqrt(dh)
        u = np.einsum("hrd,hr->hd", K, bQ) / np.sqrt(dh)
        V = np.einsum("khr,hrd->hkd", WO, Vw)
        c = np.einsum("khr,hr->k", WO, bV) + b["o_proj"]
        return MultiHeadAttention(W, V, u, c)
