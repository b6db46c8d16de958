"""``attnprobe demo``: extract a real MiniLM-L6 head answered in float32."""

from __future__ import annotations

import numpy as np

from attnprobe.cli.common import check_outcome, nonneg_int, plan_outputs, print_summary, relative_errors, track
from attnprobe.learners import PROBES, extract_exact
from attnprobe.models import PRECISIONS, AttentionHead
from attnprobe.oracles import Oracle
from attnprobe.progress import Progress


def run(args) -> int:
    from attnprobe.targets import minilm_head

    if args.out:
        plan_outputs(args.out)
    truth = minilm_head(args.layer, args.head, args.row, dtype=args.dtype)
    d = truth.d
    print(f"target: MiniLM-L6 layer {args.layer} head {args.head}, output row {args.row}, d = {d}, "
          f"answers computed in {args.dtype}")
    oracle = Oracle(truth, d, precision=args.dtype, name="minilm")
    track(args, oracle)
    progress = Progress("extract", enabled=not args.quiet)
    try:
        res = extract_exact(oracle, probes=args.probes, seed=args.seed, progress=progress)
    finally:
        progress.close()
    unknowns = AttentionHead.unknowns(d)
    rank = np.linalg.matrix_rank(res.model.W, tol=1e-4 * np.linalg.norm(res.model.W, 2))
    print(f"recovered W ({d}x{d}, numerical rank {rank}), v, u ({d}) and c = {res.model.c:.6f} "
          f"with {args.probes} probes")
    print(f"queries: {res.queries}  (unknowns d²+2d+1 = {unknowns}; paper's bound d²+d = {d * d + d} for the "
          f"bias-free model; calibration {res.details.get('calibration_queries', 0)}, "
          f"re-measured probes {res.details.get('retry_queries', 0)})")
    for name, e in relative_errors(truth, res.model).items():
        print(f"  {name}: relative error {e:.3e}")
    print(f"functional check: relative error {res.check.error:.3e} on {res.check.queries} fresh "
          f"sequences (lengths {list(res.check.lengths)}), {res.seconds:.2f} s")
    failure = check_outcome(res, args.keep_failed)
    if args.out:
        print_summary(res, res.save(args.out) if failure is None or args.keep_failed else None)
    if failure is not None:
        raise failure
    return 0


def add_parser(sub) -> None:
    dm = sub.add_parser("demo", help="extract a real MiniLM-L6 head answered in float32")
    dm.add_argument("--layer", type=int, default=0)
    dm.add_argument("--head", type=int, default=0)
    dm.add_argument("--row", type=int, default=0, help="row of the attention output projection")
    dm.add_argument("--dtype", choices=PRECISIONS, default="float32")
    dm.add_argument("--probes", choices=PROBES, default="orthogonal")
    dm.add_argument("--seed", type=nonneg_int, default=0)
    dm.add_argument("--out", metavar="OUT.npz")
    dm.add_argument("--quiet", action="store_true")
    dm.add_argument("--keep-failed", action="store_true", help="write --out even when the functional check fails")
    dm.set_defaults(func=run)
