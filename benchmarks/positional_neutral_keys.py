"""The zero-key pair probe on RoPE layers with key biases (``Qwen2Attention``, ``GPTNeoXAttention`` with its
``query_key_value`` biases; d = 128, 8 heads, float64): the singular values of ``D`` (the answer's first-order
change when the keys at offsets −1 and −2 move to ``±ηe``) around zero keys and around a *neutral* key ``x₀``
(``W_K,g x₀ + b_K,g = 0`` for every group: logit 0 at every offset, one value), ``x₀`` taken from the module's
weights here — a measurement of the probe, not a learner: it asks whether a rank-H gap comes back once the keys are
neutral. Rows: family, keys, query setting (scale t, extra neutral keys), ``s_H/s_1`` (the weakest head's share),
``s_{H+1}/s_H`` (the gap; bias-free LLaMA measures ~1e-9).

    PYTHONPATH=src python benchmarks/positional_neutral_keys.py --write
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from attnprobe.learners.positional.heads import STEP, pair_jacobian
from attnprobe.reports import Table
from attnprobe.targets.positional_modules import positional_victim, reference_model
from sections import command_line, write_section

DOC = "positional"
CASES = (("qwen2", {"kv_heads": 2}), ("gpt_neox", {}))
SETTINGS = ((1.0, 0), (1.5, 8))


def neutral_key(model) -> np.ndarray:
    """A token whose key is zero in every group: ``W_K x₀ = −b_K`` (least squares; exact when ``G·d_h ≤ d``)."""
    Wk = model.Wk.reshape(-1, model.d)
    return -np.linalg.lstsq(Wk, model.bk.reshape(-1), rcond=None)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/positional.md")
    args = ap.parse_args()
    table = Table(["module", "keys", "t, extra keys", "s_H / s_1", "s_(H+1) / s_H"])
    for family, kw in CASES:
        truth = reference_model(positional_victim(family, d=128, heads=8, seed=args.seed, **kw))
        d, H = truth.d, truth.H
        rng = np.random.default_rng(args.seed)
        z = rng.standard_normal(d)
        E = np.linalg.qr(rng.standard_normal((d, d)))[0][: 2 * H + 8]
        x0 = neutral_key(truth)

        def around_x0(X, x0=x0, truth=truth):
            X = X.copy()
            X[:, :-1] += x0
            return truth(X)

        for keys, layer in (("zero", truth), ("neutral x₀", around_x0)):
            for t, extra in SETTINGS:
                s = np.linalg.svd(pair_jacobian(layer, t * z, E, STEP * math.sqrt(d), zeros=extra), compute_uv=False)
                table.add(family, keys, f"{t}, {extra}", f"{s[H - 1] / s[0]:.1e}", f"{s[H] / s[H - 1]:.1e}")
    print(table.markdown())
    if args.write:
        write_section("Positional: the pair probe with key biases, zero vs neutral keys (d = 128, float64)",
                      table.markdown(), command_line(), doc=DOC)


if __name__ == "__main__":
    main()
