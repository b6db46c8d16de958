"""``extract --hf-dir`` on every family of the table: random-init folders built with ``transformers``' config
classes, the attention sublayer of one layer as the victim (whole output row at the last position), run through
the command line exactly as a user would, in each module dtype, with nothing declared.

Each row: the family, the module's dtype, the sequences asked, the worst head's error against the folder's weights
(``W_h``, ``u_h``, ``V_h`` matched up to permutation), and the verdict: ``recovered`` (passed and heads within
1e-8 for float64, 2e-3 for float32), ``WRONG`` (passed with worse heads: must never happen), ``check failed``
(exit 3) or the one-line refusal (exit 2).

    PYTHONPATH=src:tests python benchmarks/hf_families.py --write
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
from attnprobe.reports import Table, command_line, write_section
from attnprobe.targets.hf import hf_layer_arrays
from hf_models import FAMILY_CONFIGS, tiny_family_dir

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "hf-families.md"
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILY_CONFIGS))
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true", help=f"write the table into {DOC.name}")
    args = ap.parse_args()
    table = family_table(args.families.split(","), args.dtypes.split(","), args.hidden, args.heads, args.layer,
                         args.seed)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    note = (f"\n\nd = {args.hidden}, {args.heads} heads (LLaMA, Qwen2, Mistral: 2 KV heads), layer {args.layer} of 2, "
            f"weights and biases N(0, 0.5²), seed {args.seed}; load average {load} on {os.cpu_count()} cores.")
    print(table.markdown() + note)
    if args.write:
        write_section("extract --hf-dir on every family", table.markdown() + note, command_line(), path=DOC)


if __name__ == "__main__":
    main()
