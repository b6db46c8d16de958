"""Shared helpers of the issue-4 benchmarks: Thm 6.1 targets, errors, and writing table fragments."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from attnprobe.models import AttentionHead
from attnprobe.targets import random_head

DOCS = Path(__file__).resolve().parent.parent / "docs"
FRAG = DOCS / "issue4"


def theorem_head(d: int, seed: int, w_norm: float = 2.0, zero_v: int = 0) -> AttentionHead:
    """A bias-free head meeting Thm 6.1's assumptions: ‖W‖_F = w_norm, ‖v‖ = 1, |v_i| ∈ [1, 2]/‖·‖ (or 0)."""
    rng = np.random.default_rng(10_000 + seed)
    h = random_head(d, seed=seed, bias=False)
    W = h.W / np.linalg.norm(h.W) * w_norm
    v = rng.choice([-1.0, 1.0], d) * rng.uniform(1.0, 2.0, d)
    if zero_v:
        v[rng.choice(d, zero_v, replace=False)] = 0.0
    return AttentionHead(W, v / np.linalg.norm(v))


def margin(head) -> float:
    nz = np.abs(head.v[head.v != 0])
    return float(nz.min())


def rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))


def write_fragment(name: str, title: str, command: str, table: str, extra: str = "") -> None:
    FRAG.mkdir(parents=True, exist_ok=True)
    text = f"### {title}\n\n`{command}`\n\n{table}\n{extra}\n"
    (FRAG / f"{name}.md").write_text(text)
    print(text)


def md_table(header, rows) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def command() -> str:
    return "python " + " ".join(["benchmarks/" + Path(sys.argv[0]).name] + sys.argv[1:])
