"""``extract --hf-dir`` on every family of the table: random-init folders built with ``transformers``' config
classes, the attention sublayer of one layer as the victim (whole output row at the last position), run through
the command line exactly as a user would, in each module dtype, with nothing declared.

Each row: the family, the module's dtype, the sequences asked, the worst head's error against the folder's weights
(``W_h``, ``u_h``, ``V_h`` matched up to permutation), and the verdict: ``recovered`` (passed and heads within
1e-8 for float64, 2e-3 for float32), ``WRONG`` (passed with worse heads: must never happen), ``check failed``
(exit 3) or the one-line refusal (exit 2).

    PYTHONPATH=src:tests python benchmarks/hf_families.py --write
    PYTHONPATH=src:tests python benchmarks/hf_families.py --export --write    # the stolen layer written back
    PYTHONPATH=src:tests python benchmarks/hf_families.py --retry --write     # marginal misfits, one retry
    PYTHONPATH=src:tests python benchmarks/hf_families.py --causes --write    # answers as they are
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import tempfile
import time
from pathlib import Path

from attnprobe.cli import main as cli
from attnprobe.models import load_model
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.reports import Table
from attnprobe.targets.hf import hf_layer_arrays
from hf_models import FAMILY_CONFIGS, tiny_family_dir
from sections import command_line, write_section

DOC = "hf-families"  # its results file: docs/benchmarks/hf-families.md
#: the head errors a passed run must reach (issue: non-positional families)
BOUNDS = {"float64": 1e-8, "float32": 2e-3, "bfloat16": 5e-2}
#: KV heads for the families that share them (GQA)
KV_HEADS = {"llama": 2, "qwen2": 2, "mistral": 2}


def run(folder: Path, layer: int, dtype: str, out: Path, seed: int) -> tuple[int, str, dict | None]:
    """``attnprobe extract --hf-dir`` in this process: exit code, stderr, summary."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli(["extract", "--hf-dir", str(folder), "--layer", str(layer), "--method", "multihead",
                    "--dtype", dtype, "--seed", str(seed), "--out", str(out), "--quiet"])
    summary = json.loads(out.with_suffix(".json").read_text()) if code == 0 else None
    return code, err.getvalue().strip(), summary


def family_table(families, dtypes, hidden: int, heads: int, layer: int, seed: int) -> Table:
    table = Table(["family", "module dtype", "sequences", "worst head error", "verdict", "seconds"])
    with tempfile.TemporaryDirectory() as tmp:
        for fam in families:
            folder = tiny_family_dir(Path(tmp) / fam, fam, hidden=hidden, heads=heads, layers=2,
                                     kv_heads=KV_HEADS.get(fam), seed=seed)
            for dtype in dtypes:
                out = Path(tmp) / f"{fam}-{dtype}.npz"
                t0 = time.perf_counter()
                code, err, summary = run(folder, layer, dtype, out, seed)
                seconds = time.perf_counter() - t0
                if code != 0:
                    spent = re.search(r"(\d+) queries spent", err)
                    reason = err.removeprefix("attnprobe: error: ").replace(str(folder), fam)
                    table.add(fam, dtype, int(spent.group(1)) if spent else 0, "", f"exit {code}: {reason}", seconds)
                else:
                    a = hf_layer_arrays(folder, layer)
                    worst = match_heads(MultiHeadAttention(a["W"], a["v"], a["u"], a["c"]), load_model(out)).worst
                    verdict = "recovered" if worst <= BOUNDS[dtype] else "WRONG (passed)"
                    table.add(fam, dtype, summary["queries"], worst, verdict, seconds)
                print(table.markdown().splitlines()[-1], flush=True)
    return table


def export_table(families, hidden: int, heads: int, layer: int, seed: int) -> Table:
    """Recover layer ``layer`` (float64 and float32 modules), ``attnprobe export`` it into a folder of the victim's
    family (every layer, and one layer), load that with ``transformers`` and compare its sublayer with the victim's
    at every position on fresh sequences."""
    import numpy as np

    from attnprobe.oracles.hf_attention import hf_attention_layer
    from attnprobe.oracles.torch_adapter import TorchFunction

    table = Table(["family", "result from", "OUT layers", "OUT sublayer vs victim (every row, relative)"])
    X = np.random.default_rng(seed).standard_normal((32, 8, hidden))
    with tempfile.TemporaryDirectory() as tmp:
        for fam in families:
            folder = tiny_family_dir(Path(tmp) / fam, fam, hidden=hidden, heads=heads, layers=2, seed=seed)
            victim = TorchFunction(hf_attention_layer(folder, layer, every_position=True), hidden)(X)
            for dtype in ("float64", "float32"):
                res = Path(tmp) / f"{fam}-{dtype}.npz"
                code, err, _ = run(folder, layer, dtype, res, seed)
                if code != 0:
                    table.add(fam, f"{dtype} module", "", f"extract exit {code}: {err}")
                    continue
                for layers in (None, 1):
                    out = Path(tmp) / f"{fam}-{dtype}-{layers}"
                    with contextlib.redirect_stdout(io.StringIO()):
                        code = cli(["export", "--result", str(res), "--hf-dir", str(folder), "--layer", str(layer),
                                    "--out", str(out)] + ([] if layers is None else ["--layers", "1"]))
                    stolen = TorchFunction(hf_attention_layer(out, 0 if layers else layer, every_position=True),
                                           hidden)(X)
                    err = float(np.abs(stolen - victim).max() / np.abs(victim).max())
                    table.add(fam, f"{dtype} module", 1 if layers else 2, err if code == 0 else f"exit {code}")
                print(table.markdown().splitlines()[-1], flush=True)
    return table


#: (family, folder seed): three float32 layers (d = 64, 8 heads) whose heads do not separate with learner seed 0,
#: and one whose heads do
RETRY_CASES = (("distilbert", 1), ("bert", 9), ("bert", 11), ("distilbert", 0))


def retry_table() -> Table:
    """``extract --hf-dir`` (float32 module, --seed 0) on the layers whose heads did not separate with seed 0."""
    table = Table(["family", "folder seed", "sequences", "worst head error", "verdict", "retried"])
    with tempfile.TemporaryDirectory() as tmp:
        for fam, seed in RETRY_CASES:
            folder = tiny_family_dir(Path(tmp) / f"{fam}{seed}", fam, hidden=64, heads=8, layers=1, seed=seed)
            out = Path(tmp) / f"{fam}{seed}.npz"
            code, err, summary = run(folder, 0, "float32", out, 0)
            if code != 0:
                table.add(fam, seed, "", "", f"exit {code}: {err}", "")
            else:
                a = hf_layer_arrays(folder, 0)
                worst = match_heads(MultiHeadAttention(a["W"], a["v"], a["u"], a["c"]), load_model(out)).worst
                retried = next((n for n in summary.get("notes", []) if n.startswith("retried")), "no")
                table.add(fam, seed, summary["queries"], worst,
                          "recovered" if worst <= BOUNDS["float32"] else "WRONG (passed)", retried)
            print(table.markdown().splitlines()[-1], flush=True)
    return table


#: victims written as a module for ``extract --oracle`` (d = 32, 4 heads, weights N(0, 0.4²), torch seed 0)
CAUSE_VICTIMS = '''
import math
import sys

import torch

from attnprobe.oracles.hf_attention import load_hf_model
from attnprobe.oracles.torch_multihead import BertSelfAttentionRow

torch.manual_seed(0)


def _filled(m):
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.4)
    return m


class SoftmaxInFloat32(BertSelfAttentionRow):
    def forward(self, X):
        B, N, d = X.shape
        dh = d // self.heads
        split = lambda t: t.reshape(B, -1, self.heads, dh).transpose(1, 2)
        q, k, v = split(self.query(X[:, -1:, :])), split(self.key(X)), split(self.value(X))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1, dtype=torch.float32).to(X.dtype)
        return self.dense((a @ v).transpose(1, 2).reshape(B, d))


soft32 = _filled(SoftmaxInFloat32(32, 4, row=None))
mha = _filled(torch.nn.MultiheadAttention(32, 4, add_bias_kv=True, batch_first=True, dtype=torch.float64))
albert = load_hf_model(sys.argv_albert).encoder.albert_layer_groups[0].albert_layers[0].attention
with torch.no_grad():
    albert.LayerNorm.weight.normal_(1.0, 0.3)
    albert.LayerNorm.bias.normal_(0.0, 0.3)


def softmax_float32(X):
    with torch.no_grad():
        return soft32(torch.as_tensor(X)).numpy()


def bias_kv(X):
    X = torch.as_tensor(X)
    with torch.no_grad():
        return mha(X[:, -1:], X, X, need_weights=False)[0][:, 0].numpy()


def albert_normed(X):
    with torch.no_grad():
        return albert(torch.as_tensor(X))[0][:, -1].numpy()
'''


def causes_table() -> Table:
    """``extract --oracle`` (nothing declared) on modules whose answers are not what they seem: a float64 module
    with a float32 softmax, ALBERT's normalised attention output, an extra attended row (add_bias_kv)."""
    import importlib
    import sys

    table = Table(["victim", "declared", "exit", "sequences", "what extract says"])
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_family_dir(Path(tmp) / "albert", "albert", hidden=32, heads=4, layers=1, seed=0)
        (Path(tmp) / "cause_victims.py").write_text(CAUSE_VICTIMS.replace("sys.argv_albert", repr(str(folder))))
        sys.path.insert(0, tmp)
        importlib.invalidate_caches()
        cases = [("float64 module, float32 softmax", "softmax_float32", []),
                 ("float64 module, float32 softmax", "softmax_float32", ["--answer-precision", "float64"]),
                 ("ALBERT attention module: LayerNorm(X + attn)", "albert_normed", []),
                 ("nn.MultiheadAttention(add_bias_kv=True)", "bias_kv", [])]
        for name, attr, extra in cases:
            out = Path(tmp) / f"{attr}.npz"
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = cli(["extract", "--oracle", f"cause_victims:{attr}", "--d", "32", "--method", "multihead",
                            "--out", str(out), "--quiet"] + extra)
            if code == 0:
                summary = json.loads(out.with_suffix(".json").read_text())
                oracle = summary["details"]["oracle"]
                detection = oracle.get("precision_detection", {})
                said = (f"passed, check error {summary['check']['relative_error']:.1e}; precision "
                        f"{oracle['precision']} ({detection.get('rounded_inside', oracle['precision_source'])}; "
                        f"kernel jitter {detection.get('kernel_jitter', float('nan')):.1e})")
                table.add(name, " ".join(extra) or "nothing", code, summary["queries"], said)
            else:
                line = err.getvalue().strip().removeprefix("attnprobe: error: ")
                spent = re.search(r"(\d+) queries spent", line)
                table.add(name, " ".join(extra) or "nothing", code, int(spent.group(1)) if spent else "",
                          line.split("; answers look like")[0])
            print(table.markdown().splitlines()[-1], flush=True)
        sys.path.remove(tmp)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILY_CONFIGS))
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--export", action="store_true", help="recover, export, reload: the round trip")
    ap.add_argument("--retry", action="store_true", help="float32 layers whose heads did not separate with seed 0")
    ap.add_argument("--causes", action="store_true", help="modules whose answers are not what they seem")
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/hf-families.md")
    args = ap.parse_args()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    setting = (f"d = {args.hidden}, {args.heads} heads, layer {args.layer} of 2, weights and biases N(0, 0.5²), "
               f"seed {args.seed}")
    if args.export:
        title = "export: the recovered layer written back and loaded with transformers"
        table = export_table([f for f in args.families.split(",") if f in ("bert", "gpt2", "distilbert",
                                                                          "albert", "roberta", "electra")],
                             args.hidden, args.heads, args.layer, args.seed)
        note = f"\n\n{setting}; 32 fresh sequences of length 8; load average {load} on {os.cpu_count()} cores."
    elif args.causes:
        title = "Answers as they are: a float32 softmax, a normalised output, an extra attended row"
        table = causes_table()
        note = f"\n\nd = 32, 4 heads, --method multihead, --seed 0; load average {load} on {os.cpu_count()} cores."
    elif args.retry:
        title = "A marginal separation misfit: one retry with a fresh seed"
        table = retry_table()
        note = (f"\n\nd = 64, 8 heads, one layer, float32 module, --seed 0; load average {load} on "
                f"{os.cpu_count()} cores.")
    else:
        title = "extract --hf-dir on every family"
        table = family_table(args.families.split(","), args.dtypes.split(","), args.hidden, args.heads, args.layer,
                             args.seed)
        note = (f"\n\n{setting} (LLaMA, Qwen2, Mistral: 2 KV heads); load average {load} on {os.cpu_count()} "
                "cores.")
    print(table.markdown() + note)
    if args.write:
        write_section(title, table.markdown() + note, command_line(), doc=DOC)


if __name__ == "__main__":
    main()
