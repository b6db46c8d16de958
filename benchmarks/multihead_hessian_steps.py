"""What sets the accuracy of the App. C learner: the finite-difference step of the Hessians and the probe logit of
the single-head pass inside the estimated subspaces (the two design choices documented in docs/multihead.md).

Targets: ``random_orthogonal_multihead(32, 4, 8, seed)`` (float64), seeds 0..5. Table 1: largest subspace error
(``‖B − E Eᵀ B‖₂`` of an estimated basis B against its true subspace E) per Hessian step, one-step and Richardson.
Table 2: worst head error of the exact single-head learner inside the estimated subspaces (Richardson Hessians at
the default step), over 12 probe seeds per head, at probe logits 1.5 (the single-head default) and 0.5.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_hessian_steps.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnprobe.reports import Table  # noqa: E402


def table(headers, rows) -> str:
    """Markdown through the one formatter (:class:`attnprobe.reports.Table`)."""
    return Table(headers, rows).markdown()


from attnprobe.learners.head.exact import extract_exact, learn_value  # noqa: E402
from attnprobe.learners.multihead.blocks import simultaneous_blocks  # noqa: E402
from attnprobe.learners.multihead.hessian import hessian_at  # noqa: E402
from attnprobe.oracles import Oracle  # noqa: E402
from attnprobe.oracles.subspace import restrict_to_subspace  # noqa: E402
from attnprobe.targets import random_orthogonal_multihead  # noqa: E402

H, DH, SEEDS = 4, 8, range(6)


def split_for(seed: int, step: float, richardson: bool):
    d = H * DH
    model, E = random_orthogonal_multihead(d, H, DH, seed=seed)
    oracle = Oracle(model, d)
    rng = np.random.default_rng(seed)
    v, c, _ = learn_value(oracle)
    mats = [hessian_at(oracle, rng.standard_normal(d), v, c, step, richardson) for _ in range(DH)]
    return model, E, oracle, simultaneous_blocks(mats, rng, blocks=H)


def subspace_error(E, bases) -> float:
    return max(min(np.linalg.norm(B - Et @ (Et.T @ B), 2) for Et in E) for B in bases)


def main() -> None:
    rows = []
    for richardson, steps in ((False, (1e-4, 3e-4, 1e-3, 3e-3)), (True, (1e-3, 3e-3, 1e-2, 2e-2, 5e-2))):
        for step in steps:
            errs = [subspace_error(E, s.bases) for _, E, _, s in (split_for(k, step, richardson) for k in SEEDS)]
            rows.append(["Richardson" if richardson else "one step", step, min(errs), float(np.median(errs)),
                         max(errs)])
            print(table(["Hessian", "step h", "min", "median", "max subspace error"], [rows[-1]]).splitlines()[-1],
                  flush=True)
    print(table(["Hessian", "step h", "min", "median", "max subspace error"], rows))
    rows2 = []
    for logit in (1.5, 0.5):
        worst, failures = [], 0
        for seed in SEEDS:
            model, E, oracle, split = split_for(seed, 1e-2, True)
            for B in split.bases:
                h = int(np.argmin([np.linalg.norm(B - Et @ (Et.T @ B), 2) for Et in E]))
                Wt = B.T @ model.W[h] @ B
                for probe_seed in range(12):
                    try:
                        res = extract_exact(restrict_to_subspace(oracle, B), seed=probe_seed, check=False,
                                            target_logit=logit)
                    except Exception:
                        failures += 1
                        continue
                    worst.append(np.linalg.norm(res.model.W - Wt) / np.linalg.norm(Wt))
        rows2.append([logit, len(worst) + failures, failures, float(np.median(worst)), float(max(worst))])
    print(table(["probe logit", "runs", "refused (answers off the softmax average)", "median W error",
                 "max W error"], rows2))


if __name__ == "__main__":
    main()
