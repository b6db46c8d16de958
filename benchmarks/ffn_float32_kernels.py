"""The FFN learner on float32 answers under several CPU rounding paths (OpenBLAS kernels, torch's CPU capability).

    PYTHONPATH=src python benchmarks/ffn_float32_kernels.py [--seeds 10] [--torch-seeds 4] [--write]

A float32 victim's answers differ in their last bits from one BLAS kernel to another (the sums run in another
order), so the learner sees another float32 rounding of the same network. Each setting below runs in its own
process (the kernel is chosen when the library loads): bias-free float32 ReLU networks (Sec. 4.1's ``A_FFN``,
``random_relu_net(d, m, seed, dtype="float32")``), biased ones, and float32 torch one-layer transformers
(``TorchOneLayerTransformer``, the whole Sec. 4.1 learner). Reported per setting and family: runs whose functional
check passed, runs with every neuron recovered one to one (< 1e-3), and the worst check error. A learner that does
not depend on the kernel passes every run under every setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SETTINGS = {  # name -> environment
    "default": {},
    "OPENBLAS_CORETYPE=Sandybridge": {"OPENBLAS_CORETYPE": "Sandybridge"},
    "OPENBLAS_CORETYPE=SkylakeX": {"OPENBLAS_CORETYPE": "SkylakeX"},
    "ATEN_CPU_CAPABILITY=default": {"ATEN_CPU_CAPABILITY": "default"},
}
DOC = "ffn-float32"  # its results file: docs/benchmarks/ffn-float32.md
TITLE = "FFN learner on float32 answers under other CPU rounding paths"
NETS = [(8, 16), (8, 32), (16, 16), (16, 32)]


def child(seeds: int, torch_seeds: int) -> list[dict]:
    """Every run of one setting (this process's kernel): one dict per run."""
    from attnprobe.learners.ffn import extract_ffn
    from attnprobe.models import neuron_errors
    from attnprobe.oracles import Oracle
    from attnprobe.targets import random_relu_net

    rows = []
    for bias in (False, True):
        for d, m in NETS:
            for seed in range(seeds):
                net = random_relu_net(d, m, seed=seed, dtype="float32", bias=bias)
                res = extract_ffn(Oracle(net, d, precision="float32"), seed=seed, bias=bias)
                ne = neuron_errors(net.A, net.w_o, res.model.A, res.model.w_o,
                                   **({"b_true": net.b, "b_hat": res.model.b} if bias else {}))
                rows.append({"family": "biased" if bias else "bias-free", "passed": bool(res.check.passed),
                             "error": float(res.check.error), "all_neurons": ne["within_1e-3"] == m
                             and ne["matched_one_to_one"]})
    if torch_seeds:
        import torch

        from attnprobe.learners.transformer import extract_transformer
        from attnprobe.oracles.torch_adapter import (TorchOneLayerTransformer, oracle_from_torch,
                                                     transformer_from_torch)

        for d, m in [(8, 8), (8, 16), (16, 16)]:
            for seed in range(torch_seeds):
                torch.manual_seed(seed)
                vic = TorchOneLayerTransformer(d, m, dtype=torch.float32).eval()
                truth = transformer_from_torch(vic)
                res = extract_transformer(oracle_from_torch(vic), seed=seed)
                ne = neuron_errors(truth.A, truth.w_o, res.model.A, res.model.w_o)
                rows.append({"family": "torch transformer", "passed": bool(res.check.passed),
                             "error": float(res.check.error), "all_neurons": ne["within_1e-3"] == m
                             and ne["matched_one_to_one"]})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--torch-seeds", type=int, default=4)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.seeds, a.torch_seeds)))
        return
    from attnprobe.reports import Table
    from sections import write_section

    table = Table(["setting", "family", "runs", "check passed", "all neurons", "worst check error"])
    src = str(Path(__file__).resolve().parents[1] / "src")
    for name in a.settings:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": src, **SETTINGS[name]}
        out = subprocess.run([sys.executable, __file__, "--child", "--seeds", str(a.seeds), "--torch-seeds",
                              str(a.torch_seeds)], env=env, capture_output=True, text=True, check=True)
        rows = json.loads(out.stdout.strip().splitlines()[-1])
        for fam in dict.fromkeys(r["family"] for r in rows):
            rs = [r for r in rows if r["family"] == fam]
            table.add(name, fam, len(rs), sum(r["passed"] for r in rs), sum(r["all_neurons"] for r in rs),
                      f"{max(r['error'] for r in rs):.1e}")
        print(table.rows[-1], flush=True)
    text = table.markdown()
    print(text)
    if a.write:
        cmd = "PYTHONPATH=src python benchmarks/ffn_float32_kernels.py " + " ".join(argv or sys.argv[1:])
        write_section(TITLE, text, cmd.strip(), doc=DOC)


if __name__ == "__main__":
    main()
