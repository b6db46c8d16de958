"""Baseline: functional distillation of a multi-head layer vs extraction, queries against functional error.

Distillation fits a torch float64 model of the same shape (``W (H,d,d)``, ``v``, ``u``, ``c``; random init, Adam
then L-BFGS on the mean squared error) to the answers of N random queries (Gaussian rows, lengths 1..8), several
random restarts, the best kept by its training loss. Extraction is the App. C learner
(``extract_multihead(method="orthogonal", heads=H)``) on the same targets (heads in orthogonal subspaces). Both
are scored by the relative RMS error of their answers on 2,000 fresh sequences of lengths 1, 2, 4, 8, 16.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_distill.py [--seeds 3] [--write]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnprobe.reports import Table  # noqa: E402
from sections import DOCS, write_section  # noqa: E402

DOC = "multihead"  # its results file: docs/benchmarks/multihead.md


def table(headers, rows) -> str:
    """Markdown through the one formatter (:class:`attnprobe.reports.Table`)."""
    return Table(headers, rows).markdown()


from attnprobe.learners.multihead import extract_multihead  # noqa: E402
from attnprobe.models import MultiHeadAttention, match_heads  # noqa: E402
from attnprobe.oracles import Oracle  # noqa: E402
from attnprobe.targets import random_orthogonal_multihead  # noqa: E402

CONFIGS = [(2, 4), (4, 4)]
BUDGETS = [125, 250, 500, 1000, 2000, 4000]
TRAIN_LENGTHS = (1, 2, 3, 4, 6, 8)
TEST_LENGTHS = (1, 2, 4, 8, 16)
GOALS = (1e-3, 1e-8)


def sequences(n: int, d: int, lengths, rng) -> list[np.ndarray]:
    """``n`` Gaussian sequences split evenly over ``lengths`` (one array per length)."""
    per = np.full(len(lengths), n // len(lengths))
    per[: n % len(lengths)] += 1
    return [rng.standard_normal((k, N, d)) for k, N in zip(per, lengths) if k]


def functional_error(model, truth, d: int, rng) -> float:
    """Relative RMS error on 2,000 fresh sequences of the test lengths."""
    num = den = 0.0
    for X in sequences(2000, d, TEST_LENGTHS, rng):
        y = truth(X)
        num += float(np.sum((model(X) - y) ** 2))
        den += float(np.sum(y ** 2))
    return float(np.sqrt(num / den))


def _torch_forward(params, X):
    W, v, u, c = params
    q = torch.einsum("hde,be->bhd", W, X[:, -1, :])
    scores = torch.einsum("bnd,bhd->bhn", X, q) + torch.einsum("bnd,hd->bhn", X, u)
    alpha = torch.softmax(scores, dim=-1)
    values = torch.einsum("bnd,hd->bhn", X, v)
    return (alpha * values).sum(dim=(1, 2)) + c


def distill(batches, H: int, d: int, seed: int, adam_steps: int = 800, lbfgs_steps: int = 300
            ) -> tuple[MultiHeadAttention, float]:
    """Fit a float64 multi-head model to ``batches`` [(X, y), ...]; returns the model and its training MSE."""
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(H, d, d, generator=g, dtype=torch.float64) / d,
              torch.randn(H, d, generator=g, dtype=torch.float64) / np.sqrt(d),
              torch.randn(H, d, generator=g, dtype=torch.float64) / d,
              torch.zeros((), dtype=torch.float64)]
    for p in params:
        p.requires_grad_(True)
    data = [(torch.as_tensor(X), torch.as_tensor(y)) for X, y in batches]
    n = sum(len(y) for _, y in data)

    def loss_fn():
        return sum(((_torch_forward(params, X) - y) ** 2).sum() for X, y in data) / n

    opt = torch.optim.Adam(params, lr=1e-2)
    for _ in range(adam_steps):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
    lbfgs = torch.optim.LBFGS(params, lr=1.0, max_iter=lbfgs_steps, tolerance_grad=1e-15, tolerance_change=1e-20,
                              history_size=50, line_search_fn="strong_wolfe")

    def closure():
        lbfgs.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    lbfgs.step(closure)
    final = float(loss_fn().detach())
    W, v, u, c = (p.detach().numpy() for p in params)
    return MultiHeadAttention(W, v, u, float(c)), final


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2, help="targets per configuration")
    ap.add_argument("--restarts", type=int, default=1)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows, curves = [], {}
    for H, dh in CONFIGS:
        d = H * dh
        for seed in range(args.seeds):
            truth, _ = random_orthogonal_multihead(d, H, dh, seed=seed)
            rng = np.random.default_rng(1000 + seed)
            res = extract_multihead(Oracle(truth, d), method="orthogonal", heads=H, seed=seed)
            ours = functional_error(res.model, truth, d, rng)
            curve, params = [], None
            for N in BUDGETS:
                batches = [(X, truth(X)) for X in sequences(N, d, TRAIN_LENGTHS, rng)]
                t0 = time.perf_counter()
                best = min((distill(batches, H, d, seed=100 * seed + r) for r in range(args.restarts)),
                           key=lambda t: t[1])
                err = functional_error(best[0], truth, d, rng)
                curve.append(err)
                params = match_heads(truth, best[0]).worst
                print(f"H={H} d_h={dh} seed={seed} N={N}: distilled functional error {err:.2e} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
            curves[(H, dh, seed)] = (curve, res.queries, ours)
            need = [next((N for N, e in zip(BUDGETS, curve) if e <= goal), None) for goal in GOALS]
            rows.append([H, dh, d, seed, res.queries, ours, *[("—" if n is None else n) for n in need],
                         min(curve), params, match_heads(truth, res.model).worst, MultiHeadAttention.unknowns(d, H)])
            print(table(HEADERS, [rows[-1]]).splitlines()[-1], flush=True)
    body = table(HEADERS, rows)
    print(body)
    if args.write:
        plot(curves)
        write_section("Multi-head: functional distillation baseline vs extraction", INTRO + body +
                      "\n\n![distillation vs extraction](../multihead_distill.png)\n",
                      f"OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/multihead_distill.py "
                      f"--seeds {args.seeds} --restarts {args.restarts} --write", doc=DOC)


def plot(curves) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    colors = {(2, 4): "tab:blue", (4, 4): "tab:orange"}
    for (H, dh, seed), (curve, q, ours) in curves.items():
        label = f"H={H}, d_h={dh}" if seed == 0 else None
        ax.loglog(BUDGETS, curve, "-o", color=colors[(H, dh)], alpha=0.6, ms=3,
                  label=f"distillation, {label}" if label else None)
        ax.loglog([q], [max(ours, 1e-16)], "*", color=colors[(H, dh)], ms=12,
                  label=f"extraction (App. C), {label}" if label else None)
    for goal in GOALS:
        ax.axhline(goal, color="gray", lw=0.6, ls=":")
    ax.set_xlabel("oracle queries")
    ax.set_ylabel("functional relative error (fresh sequences)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(DOCS / "multihead_distill.png", dpi=130)


HEADERS = ["H", "d_h", "d", "seed", "extraction queries", "extraction functional err",
           "distillation queries for ≤ 1e-3", "distillation queries for ≤ 1e-8", "best distilled err",
           f"distilled worst head err (N={BUDGETS[-1]})", "extracted worst head err", "unknowns"]
INTRO = """Same targets for both (heads in orthogonal subspaces, biases, float64). Distillation: a float64 torch \
model of the
multi-head shape fitted to N random queries (lengths 1–8; Adam 800 steps at lr 1e-2, then L-BFGS 300 iterations; \
best of the
restarts by training loss), N ∈ {125, …, 4000}; "—" = not reached at 4000. Head errors after Hungarian matching. \
Extraction: `extract_multihead(method=
"orthogonal", heads=H)`, its own query count. Errors: relative RMS on 2,000 fresh sequences of lengths 1–16.

"""


if __name__ == "__main__":
    main()
