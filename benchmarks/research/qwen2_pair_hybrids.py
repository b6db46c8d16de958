"""Research: where a learned Qwen2 (or LLaMA-family) RoPE layer's function error sits, measured by the function
(docs/positional.md, "The every-row route with biases"): the error over every length 1 … 256 (two seeds of four
sequences a length; the worst length and the median), then of hybrids — the learned model with chosen rotation
pairs' query/key coordinates (rows of ``W_Q``, ``W_K`` and their biases) taken from the float64 module, heads and
key/value groups matched by their value maps. A pair's logit term ``Re(conj(q_k) k_k e^{iδθ_k})`` is its own, so a
hybrid swaps exactly that pair's part of every logit; a per-pair form's distance says less (the slow pairs act
together: see ``slow_mixing``):

    PYTHONPATH=src python benchmarks/research/qwen2_pair_hybrids.py /tmp/qwen2/final_lead_128_8_2_m0.npz

(``--d 128 --heads 8 --kv-heads 2`` by default, the module of ``qwen2_rows_route.py``'s setup, seed 0.)
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention, rotation_pairs
from attnprobe.targets.positional_modules import positional_victim, reference_model

ALL = tuple(range(1, 257))
SWAPS = ((), (7,), (6,), (6, 7), (5,), (5, 6, 7), (0, 1, 2, 3, 4), tuple(range(8)))


def load(path):
    p = dict(np.load(path))
    return PositionalAttention(p.pop("Wq"), p.pop("Wk"), p.pop("Wv"), p.pop("Wo"), position="rope", layout="half",
                               scale=1.0, causal=True, **p)


def matched(model, truth):
    """Each learned head's float64 head (nearest value map), and each group's."""
    Vt, Vm = truth.value_maps(), model.value_maps()
    heads = [int(np.argmin([np.linalg.norm(Vm[h] - Vt[t]) for t in range(truth.H)])) for h in range(model.H)]
    per = model.H // model.G
    return heads, [heads[g * per] // per for g in range(model.G)]


def hybrid(model, truth, pairs, heads, groups):
    """``model`` with the rotation pairs ``pairs`` of every head and group taken from ``truth`` (its logit scale
    moved into the query and key rows)."""
    a, b = rotation_pairs(model.rotary_dim, model.layout)
    rows = np.concatenate([a[list(pairs)], b[list(pairs)]]).astype(int) if pairs else np.zeros(0, int)
    s = np.sqrt(truth.scale / model.scale)
    Wq, bq, Wk, bk = (np.array(x, dtype=np.float64) for x in (model.Wq, model.bq, model.Wk, model.bk))
    for h, t in enumerate(heads):
        Wq[h, rows], bq[h, rows] = truth.Wq[t, rows] * s, truth.bq[t, rows] * s
    for g, t in enumerate(groups):
        Wk[g, rows], bk[g, rows] = truth.Wk[t, rows] * s, truth.bk[t, rows] * s
    return replace(model, Wq=Wq, bq=bq, Wk=Wk, bk=bk)


def by_length(model, truth, seed):
    """The relative error of each length 1 … 256 (``function_error_over_lengths`` one length at a time)."""
    rng = np.random.default_rng(seed)
    return np.array([function_error_over_lengths(model, truth, rng, (N,)) for N in ALL])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--family", default="qwen2")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    kw = dict(d=args.d, heads=args.heads, kv_heads=args.kv_heads, seed=0)
    truth = reference_model(positional_victim(args.family, dtype="float64", **kw))
    served = reference_model(positional_victim(args.family, dtype="bfloat16", **kw))
    model = load(args.model)
    for name, m in (("learned", model), ("served weights (rounded)", served)):
        for seed in (5, 6):
            e = by_length(m, truth, seed)
            print(f"{name}, seed {seed}: worst {e.max():.2e} (length {e.argmax() + 1}), median {np.median(e):.2e}, "
                  "worst by quarter " + " ".join(f"{e[i * 64:(i + 1) * 64].max():.2e}" for i in range(4)))
    heads, groups = matched(model, truth)
    print(f"heads matched {heads}, groups {groups}")
    print("| pairs from the float64 module | every length, seed 5 | seed 6 |\n|---|---|---|")
    for pairs in SWAPS:
        m = hybrid(model, truth, pairs, heads, groups)
        e = [function_error_over_lengths(m, truth, np.random.default_rng(s), ALL) for s in (5, 6)]
        print(f"| {', '.join(map(str, pairs)) or 'none'} | {e[0]:.2e} | {e[1]:.2e} |", flush=True)


if __name__ == "__main__":
    main()
