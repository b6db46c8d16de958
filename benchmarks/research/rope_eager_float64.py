"""Research: how far a float64 LLaMA folder's eager attention (transformers computes its softmax and the rotary
angles in float32 whatever the module's dtype) answers from the float64 function of its own weights, and what
``extract --hf-dir`` says on it with nothing declared. Random-init ``LlamaConfig`` folders (no attention biases,
weights N(0, 0.3²)), saved with ``save_pretrained`` in float64; relative error = max ‖f_eager − f‖∞ / ‖f‖∞ (no
output bias) at the last position over Gaussian sequences of lengths up to 256.

    PYTHONPATH=src:tests python benchmarks/research/rope_eager_float64.py --d 32

The extraction runs with ``--polish never`` (the float32 route's start, then its check) or ``--polish auto`` (the
default: the route's polish too); "result vs float64
function" is the written model's largest relative error at the last position over the same lengths.
"""

from __future__ import annotations

import argparse
import io
import tempfile
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import torch
import transformers
from hf_models import tiny_family_dir

from attnprobe.cli import main as cli
from attnprobe.models.io import load_model
from attnprobe.models.positional import PositionalAttention, rope_frequencies
from attnprobe.oracles.hf_attention import hf_attention_layer
from attnprobe.oracles.hf_families import layer_spec

LENGTHS = (1, 2, 8, 64, 256)


def float64_llama(folder: Path, d: int, heads: int, kv: int) -> Path:
    tiny_family_dir(folder, "llama", hidden=d, heads=heads, kv_heads=kv, layers=1, attention_bias=False, std=0.3)
    transformers.AutoModel.from_pretrained(folder).to(torch.float64).save_pretrained(folder)
    return folder


SHAPES = {32: (2, 1), 128: (8, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[32], choices=tuple(SHAPES))
    ap.add_argument("--polish", default="never", choices=("never", "auto"), help="the extraction's --polish")
    args = ap.parse_args()
    print(f"| d | heads (KV) | eager float64 vs its float64 function (≤ 256) | `extract --hf-dir --polish "
          f"{args.polish}` (nothing declared) | result vs float64 function (≤ 256) |")
    print("|---|---|---|---|---|")
    for d in args.d:
        heads, kv = SHAPES[d]
        with tempfile.TemporaryDirectory() as tmp:
            folder = float64_llama(Path(tmp) / "m", d, heads, kv)
            spec = layer_spec(folder)
            layer = hf_attention_layer(folder, 0, positional=True)
            p = layer.projections()
            truth = PositionalAttention(p["Q"], p["K"], p["V"], p["WO"], position="rope", scale=spec.scale,
                                        inv_freq=rope_frequencies(spec.rotary.dims, spec.rotary.base))
            rng = np.random.default_rng(0)
            worst, tests = 0.0, []
            for N in LENGTHS:
                X = rng.standard_normal((4, N, d))
                with torch.no_grad():
                    got = layer(torch.as_tensor(X)).numpy()
                want = truth(X)
                tests.append((X, want))
                worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))  # no output bias: c = 0
            err = io.StringIO()
            with redirect_stderr(err):
                code = cli(["extract", "--hf-dir", str(folder), "--layer", "0", "--polish", args.polish,
                            "--out", str(Path(tmp) / "r.npz")])
            line = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""
            got = "–"
            if (Path(tmp) / "r.npz").exists():
                model = load_model(Path(tmp) / "r.npz")
                got = f"{max(float(np.abs(model(X) - want).max() / np.abs(want).max()) for X, want in tests):.1e}"
            print(f"| {d} | {heads} ({kv}) | {worst:.1e} | exit {code}: {line or 'passed'} | {got} |", flush=True)


if __name__ == "__main__":
    main()
