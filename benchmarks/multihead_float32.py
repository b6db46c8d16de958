"""Multi-head layers with heads in orthogonal subspaces, answered in float32 (the layer computed in float32):
worst head error of the known-subspace and the unknown-subspace (App. C) learners, 5 seeds each.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_float32.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnprobe.reports import Table  # noqa: E402


def table(headers, rows) -> str:
    """Markdown through the one formatter (:class:`attnprobe.reports.Table`)."""
    return Table(headers, rows).markdown()


from attnprobe.learners.multihead import extract_multihead  # noqa: E402
from attnprobe.models import match_heads  # noqa: E402
from attnprobe.oracles import Oracle  # noqa: E402
from attnprobe.targets import random_orthogonal_multihead  # noqa: E402


def main() -> None:
    rows = []
    for H, dh in [(2, 4), (4, 4), (4, 8)]:
        for mode in ("known subspaces", "unknown, H given"):
            cells = []
            for seed in range(5):
                model, E = random_orthogonal_multihead(H * dh, H, dh, seed=seed)
                oracle = Oracle(model.with_dtype("float32"), H * dh, precision="float32")
                try:
                    res = (extract_multihead(oracle, subspaces=E, seed=seed) if mode == "known subspaces"
                           else extract_multihead(oracle, method="orthogonal", heads=H, seed=seed))
                    cells.append(f"{match_heads(model, res.model).worst:.1e}"
                                 f"{'' if res.check.passed else ' (check failed)'}")
                except Exception as exc:  # a refusal is a data point
                    cells.append(type(exc).__name__)
            rows.append([mode, H, dh, "; ".join(cells)])
            print(table(["learner", "H", "d_h", "worst head error per seed (0..4)"], [rows[-1]]).splitlines()[-1],
                  flush=True)
    print(table(["learner", "H", "d_h", "worst head error per seed (0..4)"], rows))


if __name__ == "__main__":
    main()
