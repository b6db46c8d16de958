"""Whole blocks: measured prototypes of the levers a block learner would pull (docs/block.md), on a LLaMA decoder
layer (d = 128, 8/2 heads, SwiGLU 256, RMSNorm weights not 1; transformers' module, float64) and MiniLM layer 2's
BertLayer (float64), both queried as every-position oracles (hidden states in, every row out).

1. a repeated token: every row equals the length-1 answer (attention on identical keys is the value map);
2. the pre-norm per-token map at scale t: ``r(t) = g(t u) − t u`` tends to a limit, so the FFN cannot be driven
   far from the origin (the norm caps its input);
3. the post-norm output LayerNorm from answers alone: its weight and bias, up to the sign gauge, by one null vector
   and one linear least-squares fit on the answers' rows.

    python benchmarks/block_levers.py [--write]
"""

from __future__ import annotations

import argparse
import math
import tempfile

import numpy as np
import torch

from attnprobe.learners.block.levers import driven_out, ffn_on_sphere, output_layernorm, value_map
from attnprobe.models.block import fold_norm_weights
from attnprobe.oracles.hf_block import block_model, hf_block, oracle_from_hf_block
from attnprobe.reports import Table
from attnprobe.targets.hf import minilm_dir
from sections import command_line, write_section

DOC = "block"


def llama_folder(folder: str, seed: int = 0) -> str:
    """A LLaMA model of one decoder layer: d = 128, 8 heads, 2 KV heads, SwiGLU 256, weights N(0, 1/d), RMSNorm
    weights 1 + N(0, 0.3²)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cfg = transformers.LlamaConfig(hidden_size=128, num_attention_heads=8, num_key_value_heads=2,
                                   intermediate_size=256, num_hidden_layers=1, vocab_size=8, head_dim=16)
    torch.manual_seed(seed)
    model = transformers.LlamaModel(cfg).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif "embed" not in name:
                p.normal_(0.0, 1 / math.sqrt(128))
    model.save_pretrained(folder)
    return folder


def repeated_token(oracle, d: int, rng) -> float:
    x = rng.standard_normal((8, 1, d))
    one = oracle.answer_rows(x)
    worst = 0.0
    for N in (2, 8, 64):
        rows = oracle.answer_rows(np.repeat(x, N, axis=1))
        worst = max(worst, float(np.abs(rows - one).max() / np.abs(one).max()))
    return worst


def scale_limit(oracle, d: int, rng) -> list[tuple[float, float]]:
    u = rng.standard_normal((8, 1, d))
    ts = (1.0, 10.0, 100.0, 1e3, 1e4)

    def r(t):
        return oracle.answer_rows(t * u)[:, 0] - t * u[:, 0]
    far = r(1e7)
    return [(t, float(np.abs(r(t) - far).max() / np.abs(far).max())) for t in ts]


def output_norm(oracle, d: int, rng, sequences: int, N: int = 8):
    """(w, b) of the last LayerNorm from the answers' rows (:func:`output_layernorm`)."""
    Y = oracle.answer_rows(rng.standard_normal((sequences, N, d))).reshape(-1, d)
    w, b = output_layernorm(Y)
    return w, b, len(Y)


def attention_isolated(oracle, ref, d: int, rng) -> list[tuple[int, float, float]]:
    """``L(X) − L(X')`` for prefixes X, X' sharing the last token against the true ``A_N(n1(X̃)) − A_N(n1(X̃'))``."""
    out = []
    for N in (2, 8, 64):
        u = rng.standard_normal((4, 1, d))
        X, X2 = (np.concatenate([rng.standard_normal((4, N - 1, d)), u], axis=1) for _ in range(2))
        got = driven_out(oracle.answer_rows, X) - driven_out(oracle.answer_rows, X2)

        def attn(Z):
            Zl = Z.copy()
            Zl[:, -1] *= 1e8  # n1 of the driven-out row: its direction only
            return ref.attention.every_position(ref._norm(Zl, 1))[:, -1]
        true = attn(X) - attn(X2)
        out.append((N, float(np.abs(got - true).max() / np.abs(true).max()), float(np.abs(true).max())))
    return out


def sublayers_separated(oracle, ref, d: int, rng) -> list[tuple[str, float, int]]:
    """The block split into its sublayers from answers: ``F(n2(u))`` (:func:`ffn_on_sphere`), the value map
    ``L([u]) − F(n2(u)) = A(n1(u))`` and the attention at the last position ``L(X) − F(n2(x_N))``, each against
    the truth, with the sequences each took."""
    U = rng.standard_normal((4, d))
    drive = U * 1e8  # the norms of a driven-out row: its direction only
    out = []
    q0 = oracle.queries
    phi = ffn_on_sphere(oracle.answer_rows, U)
    true_phi = ref.mlp(ref._norm(drive, 2))
    out.append(("F(n2(u)), 4 tokens u", float(np.abs(phi - true_phi).max() / np.abs(true_phi).max()),
                oracle.queries - q0))
    q0 = oracle.queries
    values = driven_out(oracle.answer_rows, U[:, None]) - phi
    true_values = ref.attention.every_position(ref._norm(drive[:, None], 1))[:, -1]
    out.append(("A(n1(u)) (the value map), same u", float(np.abs(values - true_values).max()
                                                         / np.abs(true_values).max()), oracle.queries - q0))
    q0 = oracle.queries
    M = value_map(oracle.answer_rows, d)
    true_M = fold_norm_weights(ref).attention.value_maps().sum(0)
    err = float(np.abs(M - true_M).max() / np.abs(true_M).max())
    out.append(("M diag(w1), every column (d orthonormal tokens)", err, oracle.queries - q0))
    for N in (8, 64):
        q0 = oracle.queries
        X = np.concatenate([rng.standard_normal((4, N - 1, d)), U[:, None]], axis=1)
        attn = driven_out(oracle.answer_rows, X) - phi
        Xl = X.copy()
        Xl[:, -1] *= 1e8
        true = ref.attention.every_position(ref._norm(Xl, 1))[:, -1]
        out.append((f"A_N(n1(X)), N = {N}, same last tokens", float(np.abs(attn - true).max() / np.abs(true).max()),
                    oracle.queries - q0))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks/block.md")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    llama = llama_folder(tempfile.mkdtemp())
    victims = {"LLaMA layer (d 128, 8/2 heads, SwiGLU 256)": (llama, 0), "MiniLM layer 2 (BertLayer)":
               (str(minilm_dir()), 2)}
    t1 = Table(["victim", "sequences", "largest row deviation, N = 2, 8, 64 vs N = 1"])
    for name, (folder, layer) in victims.items():
        o = oracle_from_hf_block(folder, layer)
        dev = repeated_token(o, o.d, rng)
        t1.add(*[name, o.queries, f"{dev:.1e}"])
    t2 = Table(["t", "‖r(t) − r(1e7)‖∞ / ‖r(1e7)‖∞", "largest gate pre-activation (abs)"])
    o = oracle_from_hf_block(llama, 0)
    ref = block_model(hf_block(llama, 0))
    u = np.random.default_rng(1).standard_normal((8, 1, 128))
    for t, err in scale_limit(o, 128, np.random.default_rng(1)):
        x = t * u[:, 0]
        h = x + ref.attention.every_position(ref._norm(t * u, 1))[:, 0]
        pre = ref._norm(h, 2) @ ref.ffn.Wg.T
        t2.add(*[f"{t:g}", f"{err:.1e}", f"{np.abs(pre).max():.2f}"])
    t4 = Table(["N", "rel. error of L(X) − L(X') against the attention's difference", "largest difference"])
    for N, err, size in attention_isolated(o, ref, 128, np.random.default_rng(2)):
        t4.add(*[N, f"{err:.1e}", f"{size:.2f}"])
    t5 = Table(["separated from the block's answers", "rel. error against the truth", "sequences"])
    for what, err, n in sublayers_separated(o, ref, 128, np.random.default_rng(3)):
        t5.add(*[what, f"{err:.1e}", n])
    t3 = Table(["sequences × rows", "answers' rows", "abs(w) rel. error", "b rel. error"])
    mini = oracle_from_hf_block(str(minilm_dir()), 2)
    truth = block_model(hf_block(str(minilm_dir()), 2))
    for seqs in (64, 256):
        w, b, n = output_norm(mini, 384, np.random.default_rng(seqs), seqs)
        w_err = np.abs(np.abs(w) - np.abs(truth.norm2_w)).max() / np.abs(truth.norm2_w).max()
        b_err = np.abs(b - truth.norm2_b).max() / np.abs(truth.norm2_b).max()
        t3.add(*[f"{seqs} × 8", n, f"{w_err:.1e}", f"{b_err:.1e}"])
    body = ("Repeated token (every row against the length-1 answer):\n\n" + t1.markdown()
            + "\n\nPre-norm per-token map at scale t (LLaMA layer; 8 random directions u):\n\n" + t2.markdown()
            + "\n\nThe last token driven out (LLaMA layer; t = 1/s, s = 1e-3 … 5e-3, degree-4 extrapolation to "
              "s = 0; 4 pairs of sequences sharing their last token, 5 + 5 sequences each):\n\n" + t4.markdown()
            + "\n\nThe sublayers separated (LLaMA layer; zero keys k = 200 … 1000 before the driven-out token, "
              "degree-4 extrapolation in 1/k):\n\n" + t5.markdown()
            + "\n\nPost-norm output LayerNorm read from MiniLM layer 2's answers alone (float64):\n\n" + t3.markdown())
    print(body)
    if args.write:
        write_section("Block levers (LLaMA decoder layer, MiniLM BertLayer; float64)", body, command_line(), doc=DOC)


if __name__ == "__main__":
    main()
