"""`attnprobe audit --tasks blocks` on a random-init transformers LLaMA folder (d = 32, 2/1 heads, SwiGLU 64, norm
weights not 1, `--blocks` decoder layers): one task per block, the block learner on the block's every-position
oracle, each recovered block measured against the true one (every position of N = 1 … 64, relative to the largest
|y − x|); wall time of the audit on the process pool, then the same command again (every block resumed from the
journal, nothing asked), then a BERT folder of the same width, whose post-norm blocks the learner refuses (one row
each, with the cause and the queries spent). Minutes: run it under the heavy-run lock.

    PYTHONPATH=src python benchmarks/audit_blocks.py [--blocks 2] [--workers 2] [--ray] [--write]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from attnprobe.cli import main as cli
from attnprobe.reports import Table
from attnprobe.targets.block_folders import llama_block_folder
from audit import load
from sections import publish

DOC = "audit"  # its results file: docs/benchmarks/audit.md
TITLE = "Whole blocks of a Hugging Face folder (audit --tasks blocks)"
D, HEADS, KV, HIDDEN = 32, 2, 1, 64


def bert_folder(folder: Path, layers: int = 2) -> Path:
    """A random-init transformers BERT model of width D (2 heads), its biases N(0, 0.1²) (zero at init), saved with
    save_pretrained."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=D, num_attention_heads=HEADS, num_hidden_layers=layers,
                                 intermediate_size=2 * D, vocab_size=8, max_position_embeddings=8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return folder


def audit(folder: Path, out: Path, *extra: str) -> tuple[int, float, dict]:
    """``attnprobe audit --hf-dir folder --tasks blocks ...``: exit code, wall seconds, results.json."""
    t = time.perf_counter()
    code = cli(["audit", "--hf-dir", str(folder), "--tasks", "blocks", "--quiet", "--out", str(out), *extra])
    return code, time.perf_counter() - t, json.loads((out / "results.json").read_text())


def rows(table: Table, label: str, results: dict) -> None:
    for r in results["heads"]:
        e = r["relative_error"].get("function")
        verdict = ("passed" if r["passed"] else "check failed") if not r["error"] else \
            r["error"].splitlines()[0].split(": ", 1)[0] + " (below)"
        table.add(label, r["layer"], verdict, r["queries"], r["check_queries"], r["unknowns"],
                  None if e is None else f"{e:.1e} (N = {r.get('worst_length')})",
                  None if r["check_error"] is None else f"{r['check_error']:.1e}", round(r["seconds"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blocks", type=int, default=2, help="decoder layers of the LLaMA folder (2 … 4; one round of "
                                                          "--workers blocks keeps a locked run short)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ray", action="store_true", help="also run the audit on a private local Ray cluster of "
                                                       "--workers CPUs and compare its records with the pool's")
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/audit.md")
    args = ap.parse_args()
    before = load()
    with tempfile.TemporaryDirectory(prefix="attnprobe-audit-blocks-") as tmp:
        tmp = Path(tmp)
        llama = llama_block_folder(tmp / "llama", d=D, heads=HEADS, kv_heads=KV, hidden=HIDDEN, layers=args.blocks)
        t = Table(["folder", "block", "verdict", "queries", "check queries", "unknowns",
                   "function error against the true block (worst N)", "check error", "task s"])
        workers = ["--workers", str(args.workers)]
        code, wall, res = audit(llama, tmp / "out", *workers)
        rows(t, f"LLaMA d = {D}", res)
        code2, wall2, again = audit(llama, tmp / "out", *workers)
        runs = [f"The pool ({args.workers} workers): exit {code}, {wall:.0f} s wall for {res['tasks']} blocks "
                f"(Σ task seconds {sum(r['seconds'] for r in res['heads']):.0f})",
                f"the same command again: exit {code2}, {wall2:.1f} s, {again['resumed']} blocks resumed from the "
                f"journal, records the same: {'yes' if numbers(again) == numbers(res) else 'NO'}"]
        if args.ray:
            code3, wall3, ray = audit(llama, tmp / "ray", *workers, "--ray")
            runs.append(f"a private local Ray cluster ({args.workers} CPUs): exit {code3}, {wall3:.0f} s wall, "
                        f"records the pool's (every number but the seconds): "
                        f"{'yes' if numbers(ray) == numbers(res) else 'NO'}")
        bert = bert_folder(tmp / "bert")
        code4, wall4, refused = audit(bert, tmp / "bert-out", *workers)
        rows(t, f"BERT d = {D}", refused)
        runs.append(f"the BERT folder: exit {code4}, {wall4:.0f} s wall")
    causes = [r["error"] for r in refused["heads"] if r["error"]]
    body = (f"`attnprobe audit --hf-dir DIR --tasks blocks --workers {args.workers}` on a random-init transformers "
            f"LLaMA folder (d = {D}, {HEADS}/{KV} heads, SwiGLU {HIDDEN}, norm weights 1 + N(0, 0.3²), "
            f"{args.blocks} decoder layers, float64), then on a BERT folder of the same width. Function error: the "
            "saved block against the true one (the live layer's float64 weights) at every position of 2 fresh "
            "sequences of each length 1 … 64, over the largest |y − x|, at the worst length; the check is the "
            f"learner's own against the answers. Machine shared ({before} at the start, {load()} at the end): the "
            f"seconds are noisy.\n\n{t.markdown()}\n\n" + "; ".join(runs) + f".\n\nThe refusal of BERT block 0 "
            f"({len(causes)} of {len(refused['heads'])} blocks refused, each naming the same stages with its own "
            f"numbers): `{causes[0] if causes else 'none'}`\n")
    publish(TITLE, body, doc=DOC, write=args.write)


def numbers(results: dict) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("seconds", "traceback")} for r in results["heads"]]


if __name__ == "__main__":
    main()
