"""Positional families through ``extract --hf-dir`` (nothing declared) and a recovered LLaMA layer written back.

1. ``extract --hf-dir DIR --layer 1`` on small random-init LLaMA, Mistral, Qwen2, GPT-NeoX, T5 and BLOOM folders
   (d = 64, 4 heads, 2 KV heads where the family has them, weights N(0, 0.125²), float64 modules): exit code,
   sequences, the check's error or the refusal.
2. ``export``: a LLaMA folder (d = 128, 8 heads, 2 KV heads, weights N(0, 1/128)) whose layer 1, with its rotary
   angles computed in float64 (transformers computes them in float32), is learned by ``--method positional``; the
   result written back into the folder (``export``), loaded with ``transformers`` and compared with the victim at
   every row of sequences up to 256.

    PYTHONPATH=src python benchmarks/positional_hf.py --write
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from hf_models import tiny_family_dir  # noqa: E402

from attnprobe.cli import main as cli  # noqa: E402
from attnprobe.reports import Table  # noqa: E402
from sections import command_line, write_section  # noqa: E402

DOC = "hf-families"
FAMILIES = ("llama", "mistral", "qwen2", "gpt_neox", "t5", "bloom")
LENGTHS = (1, 2, 8, 64, 256)


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli(argv)
    return code, out.getvalue(), err.getvalue().strip()


def hf_dir_table(root: Path) -> Table:
    table = Table(["family", "exit", "sequences", "check error", "what extract says", "seconds"])
    for fam in FAMILIES:
        extra = {"attention_bias": False} if fam == "llama" else {}
        folder = tiny_family_dir(root / fam, fam, hidden=64, heads=4, layers=2, seed=0, std=0.125,
                                 kv_heads=2 if fam in ("llama", "mistral", "qwen2") else None, **extra)
        t0 = time.perf_counter()
        code, out, err = run_cli(["extract", "--hf-dir", str(folder), "--layer", "1", "--out",
                                  str(root / f"{fam}.npz"), "--quiet"])
        secs = time.perf_counter() - t0
        if code == 0:
            queries = out.split("queries ")[1].split()[0]
            error = out.split("relative error ")[1].split()[0]
            notes = [ln[6:] for ln in out.splitlines() if ln.startswith("note: ")]
            table.add(fam, code, queries, error, "; ".join(notes), f"{secs:.0f}")
        else:
            queries = err.split(" queries spent")[0].rsplit(" ", 1)[-1] if "queries spent" in err else "0"
            table.add(fam, code, queries, "", err.replace("attnprobe: error: ", ""), f"{secs:.0f}")
        print(table.markdown().splitlines()[-1], flush=True)
    return table


def export_table(root: Path, seed: int) -> Table:
    import torch
    import transformers

    from attnprobe.learners.positional.route import extract_any_positional
    from attnprobe.models import load_model
    from attnprobe.models.positional import rope_frequencies
    from attnprobe.oracles.base import Oracle
    from attnprobe.oracles.hf_attention import HFAttentionLayer
    from attnprobe.oracles.hf_families import layer_spec
    from attnprobe.oracles.torch_adapter import TorchFunction
    from attnprobe.targets.hf_export import export_layer

    folder = tiny_family_dir(root / "llama128", "llama", hidden=128, heads=8, layers=2, kv_heads=2, seed=seed,
                             std=1 / math.sqrt(128), attention_bias=False)
    spec = layer_spec(folder)
    theta = rope_frequencies(spec.rotary.dims, spec.rotary.base)

    class Float64Angles(HFAttentionLayer):
        """The folder's layer with its rotary angles computed in float64 (the module takes them as given)."""

        def _arguments(self, X):
            N = X.shape[1]
            f = np.arange(N)[:, None] * theta[None]
            emb = np.concatenate([f, f], -1)[None]
            return {"attention_mask": self._mask(N, X.dtype),
                    "position_embeddings": (torch.as_tensor(np.cos(emb)), torch.as_tensor(np.sin(emb)))}

    def load(path):
        return transformers.AutoModel.from_pretrained(path, local_files_only=True, dtype=torch.float64,
                                                      attn_implementation="sdpa").eval()

    victim = load(folder)
    fn = TorchFunction(Float64Angles(victim, spec, 1), spec.hidden)
    fn.position_term = "rope"
    t0 = time.perf_counter()
    res = extract_any_positional(Oracle(fn, spec.hidden, precision="float64"), heads=spec.heads, seed=seed)
    res.save(root / "llama.npz")
    secs = time.perf_counter() - t0
    model = load_model(root / "llama.npz")
    out, misfit = export_layer(root / "llama.npz", folder, 1, root / "llama_out")
    stolen = load(out)
    rng = np.random.default_rng(100 + seed)
    err_model = err_out = 0.0
    for N in LENGTHS:
        X = rng.standard_normal((4, N, spec.hidden))
        with torch.no_grad():
            y = Float64Angles(victim, spec, 1, every_position=True)(torch.as_tensor(X)).numpy()
            y2 = Float64Angles(stolen, spec, 1, every_position=True)(torch.as_tensor(X)).numpy()
        scale = np.abs(y - y.mean(axis=(0, 1))).max()
        err_model = max(err_model, float(np.abs(model.every_position(X) - y).max() / scale))
        err_out = max(err_out, float(np.abs(y2 - y).max() / scale))
    shared = res.details.get("kv_shared", {})
    table = Table(["victim", "sequences", "check", "result K/V", "load_model every row ≤ 256",
                   "exported folder every row ≤ 256", "group misfit", "seconds"])
    table.add("llama d=128, GQA 8/2 (float64 angles)", res.queries, f"{res.check.error:.1e}",
              f"{model.Wk.shape[0]} groups" + (f" (answers moved {shared['answers_moved']:.1e})" if shared else ""),
              f"{err_model:.1e}", f"{err_out:.1e}", f"{misfit:.1e}", f"{secs:.0f}")
    print(table.markdown())
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--skip-export", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = hf_dir_table(Path(tmp))
        print(table.markdown())
        if args.write:
            write_section("extract --hf-dir on the positional families", table.markdown(), command_line(), doc=DOC)
        if not args.skip_export:
            ex = export_table(Path(tmp), args.seed)
            if args.write:
                write_section("export: a recovered LLaMA (RoPE + GQA) layer written back", ex.markdown(),
                              command_line(), doc=DOC)


if __name__ == "__main__":
    main()
