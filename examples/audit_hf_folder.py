"""Audit a Hugging Face model folder: extract attention heads of a BERT-family model from black-box queries and
report what an attacker recovers under each defence.

    python examples/audit_hf_folder.py                        # the installed all-MiniLM-L6-v2, layer 0, heads 0-1
    python examples/audit_hf_folder.py --model-dir DIR --layers 0-2 --heads all --defense none,float32

The folder needs config.json (num_attention_heads) and model.safetensors. Each head is read at output row
--row of its layer; the same audit from the shell is ``attnprobe audit --hf-dir DIR ...``.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

from attnprobe.cli import main as attnprobe
from attnprobe.targets.hf import hf_checkpoint, minilm_dir


def run(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", help="a Hugging Face model folder (default: the installed MiniLM-L6)")
    p.add_argument("--layers", default="0")
    p.add_argument("--heads", default="0-1")
    p.add_argument("--row", default="0")
    p.add_argument("--defense", default="none,float32")
    p.add_argument("--out", help="the audit's folder (default: a new temporary folder)")
    args = p.parse_args(argv)
    args.out = args.out or str(Path(tempfile.mkdtemp(prefix="attnprobe-audit-")) / "audit_out")
    folder = args.model_dir or str(minilm_dir())
    rank = str(hf_checkpoint(folder).head_dim)  # the head dimension bounds rank W_h: the low-rank sketch applies
    code = attnprobe(["audit", "--hf-dir", folder, "--layers", args.layers, "--heads", args.heads,
                      "--row", args.row, "--defense", args.defense, "--method", "lowrank", "--rank", rank,
                      "--out", args.out])  # a progress bar on a terminal
    if code:
        return code
    results = json.loads((Path(args.out) / "results.json").read_text())
    print(f"{'head':>8} {'defence':>10} {'queries':>9} {'worst rel. error':>17}  check")
    for h in results["heads"]:
        worst = max(h["relative_error"].values()) if h.get("relative_error") else float("nan")
        print(f"L{h['layer']}H{h['head']:<5} {h['defense']:>10} {h['queries']:>9} {worst:>17.2e}  "
              f"{'passed' if h['passed'] else 'FAILED'}")
    print(f"report: {Path(args.out) / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
