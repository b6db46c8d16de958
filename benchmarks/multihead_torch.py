"""The generic multi-head learner against real ``torch.nn.MultiheadAttention`` layers (float64, biases drawn
N(0, 0.5²) so that u_h and c are visible, d_h = d/H, output row 2 at the last position).

    PYTHONPATH=src python benchmarks/multihead_torch.py --write
"""

from __future__ import annotations

import argparse

from attnprobe.learners.multihead import extract_multihead
from attnprobe.models.compare import parameter_errors
from attnprobe.models.multihead import MultiHeadAttention
from attnprobe.oracles.torch_adapter import oracle_from_torch, torch
from attnprobe.oracles.torch_multihead import TorchMultiheadRow, multihead_from_torch
from attnprobe.reports import Table
from sections import command_line, write_section

CASES = ((16, 4), (32, 4), (64, 4), (64, 2))


DOC = "multihead"  # its results file: docs/benchmarks/multihead.md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/multihead.md")
    args = ap.parse_args()
    table = Table(["d", "H", "seed", "heads found", "worst head error", "check passed", "queries",
                   "4Hd²−2H+1"])
    for d, H in CASES:
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            module = TorchMultiheadRow(d, H, row=2)
            with torch.no_grad():
                module.attn.in_proj_bias.normal_(0, 0.5)
                module.attn.out_proj.bias.normal_(0, 0.5)
            truth = multihead_from_torch(module)
            res = extract_multihead(oracle_from_torch(module, d), method="generic", seed=seed)
            worst = parameter_errors(truth, res.model)["worst_head"] if res.model.H == H else float("inf")
            table.add(d, H, seed, res.model.H, worst, res.passed, res.queries, MultiHeadAttention.query_bound(d, H))
            print(table.markdown().splitlines()[-1], flush=True)
    print(table.markdown())
    if args.write:
        write_section("Multi-head: generic learner on torch.nn.MultiheadAttention layers", table.markdown(),
                      command_line(), doc=DOC)


if __name__ == "__main__":
    main()
