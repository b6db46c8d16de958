"""Re-measures the query counts and errors of every learner on representative settings of docs/benchmarks/*.md
(the same targets, seeds and options as the learners' own benchmark scripts, fewer of them), so the numbers can be
compared before and after a refactoring: run it once with the old tree on PYTHONPATH and once with the new.

    PYTHONPATH=src python benchmarks/skeleton_remeasure.py [exact,lowrank,nuclear,robust,membership,transformer]
        [--digest]
    PYTHONPATH=src python benchmarks/skeleton_remeasure.py minilm   (72 lowrank MiniLM runs, 12 exact; ~1 min)

Prints one markdown table (setting, queries, errors, functional check); uses only the public learner API.
``--digest`` adds a column: the first 16 hex digits of the sha256 of every recovered parameter's bytes, so a
refactoring that must keep results bit-identical can show it (the errors' three digits hide last-bit changes).
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np

from attnprobe.learners.head.exact import extract_exact
from attnprobe.learners.head.lowrank import extract_lowrank
from attnprobe.learners.head.membership import extract_membership, extract_membership_paper
from attnprobe.learners.head.nuclear import extract_nuclear
from attnprobe.learners.head.robust import extract_robust, extract_robust_paper
from attnprobe.learners.transformer import extract_transformer
from attnprobe.oracles import Oracle
from attnprobe.oracles.wrappers import AdversarialNoise, BoundedNoise, Membership
from attnprobe.targets import minilm_head, random_head, random_transformer
from attnprobe.targets.theorem_heads import margin, theorem_head
from attnprobe.models.compare import relative_error as rel  # noqa: E402

ROWS = []
DIGEST = "--digest" in sys.argv


def digest(obj, h=None) -> str:
    """sha256 over the arrays and numbers of a recovered model, its attributes in name order (nested models too)."""
    top = h is None
    h = hashlib.sha256() if top else h
    if isinstance(obj, np.ndarray):
        h.update(str((obj.dtype, obj.shape)).encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, (int, float, complex, str, bool, type(None))):
        h.update(repr(obj).encode())
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            digest(x, h)
    elif hasattr(obj, "__dict__"):
        for k in sorted(vars(obj)):
            h.update(k.encode())
            digest(vars(obj)[k], h)
    return h.hexdigest()[:16] if top else ""


def row(method, setting, res, err_w, err_other="", check=None):
    check = res.check.error if check is None and res.check else check
    extra = res.details.get("retry_queries", res.details.get("redo_queries", ""))
    ROWS.append([method, setting, res.queries, extra, f"{err_w:.2e}", err_other,
                 "" if check is None else f"{check:.2e}"] + ([digest(res.model)] if DIGEST else []))
    print("| " + " | ".join(map(str, ROWS[-1])) + " |", flush=True)


def exact():
    for scale in (1e-6, 1.0, 50.0):  # benchmarks/exact.py's attention-scale table: d = 64, d/8 zero entries of v
        for seed in range(3):
            h = random_head(64, seed=seed, scale=scale, zero_v=8)
            res = extract_exact(Oracle(h, 64), seed=seed)
            row("exact", f"d=64 scale {scale:g} seed {seed}", res, rel(res.model.W, h.W),
                f"u {rel(res.model.u, h.u):.1e}")
    h = random_head(64, seed=1, zero_v=8, dtype="float32")
    res = extract_exact(Oracle(h, 64, precision="float32"), seed=1)
    row("exact", "d=64 float32 answers", res, rel(res.model.W, h.W), f"u {rel(res.model.u, h.u):.1e}")


def lowrank():
    for d, r in ((64, 4), (128, 8)):  # benchmarks/lowrank.py: random rank-r heads, seed 1
        h = random_head(d, rank=r, seed=1)
        for rank, prec in ((r, "float64"), (None, "float64"), (r, "float32")):
            res = extract_lowrank(Oracle(h.with_dtype(prec), d, precision=prec), rank=rank)
            row("lowrank", f"d={d} r={r} rank {'given' if rank else 'detected'} {prec}", res, rel(res.model.W, h.W),
                f"detected {res.details['detected_rank']}")
    h = minilm_head(0, 1)
    res = extract_lowrank(Oracle(h, 384), rank=32)
    row("lowrank", "MiniLM L0H1 rank 32 float64", res, rel(res.model.W, h.W))


def nuclear():
    for r in (1, 2, 4):  # benchmarks/nuclear.py --part exact at d = 16
        h = random_head(16, rank=r, seed=7)
        res = extract_nuclear(Oracle(h, 16), rank=r, seed=0, solver_eps=1e-8)
        row("nuclear", f"d=16 r={r} m={res.details['measurements']}", res, rel(res.model.W, h.W),
            f"u {rel(res.model.u, h.u):.1e}")


def robust():
    for tau in (1e-6, 1e-4, 1e-3):  # benchmarks/noise.py compare(), d = 16, seed 0
        h = theorem_head(16, 0, 2.0)
        for name, mk in (("avq", lambda: BoundedNoise(h, tau, seed=0)),
                         ("adversarial", lambda: AdversarialNoise(h, tau))):
            rp = extract_robust_paper(Oracle(mk(), 16), w_bound=2.0, margin=margin(h), tolerance=tau)
            row("robust paper", f"d=16 τ={tau:g} {name}", rp, float(np.linalg.norm(rp.model.W - h.W)), "‖·‖_F")
            for retries in (6, 0):
                ro = extract_robust(Oracle(mk(), 16), bias=False, tolerance=tau, seed=0, retries=retries)
                row("robust", f"d=16 τ={tau:g} {name} retries={retries}", ro, float(np.linalg.norm(ro.model.W - h.W)),
                    "‖·‖_F")
    h = random_head(16, seed=16)
    ro = extract_robust(Oracle(AdversarialNoise(h, 1e-4), 16), queries=4 * (16 * 16 + 33), seed=2)
    row("robust", "d=16 biased τ=1e-4 4x queries", ro, rel(ro.model.W, h.W), f"u {rel(ro.model.u, h.u):.1e}")


def membership():
    for seed in range(3):  # benchmarks/membership.py, d = 8
        h = random_head(8, seed=seed, bias=False)
        r = extract_membership(Oracle(Membership(h), 8), seed=seed)
        row("membership", f"d=8 seed {seed}", r, rel(r.model.W, h.W),
            f"v {np.linalg.norm(r.model.v - h.v / np.linalg.norm(h.v)):.1e}", check=1 - r.check.extra["sign_agreement"])
    h = theorem_head(4, 0)
    for k in (10**4, 10**5):
        r = extract_membership_paper(Oracle(Membership(h), 4), w_bound=2.0, margin=margin(h), eps_w=0.5, samples=k,
                                     check=False)
        row("membership paper", f"d=4 k={k}", r, float(np.linalg.norm(r.model.W - h.W)), "‖·‖_F")


def transformer():
    for d, m in ((8, 8), (8, 32)):  # benchmarks/transformer.py transformer table
        for seed in range(3):
            tf = random_transformer(d, m, seed=1000 * d + m + seed)
            res = extract_transformer(Oracle(tf, d), seed=seed)
            qb = res.details["query_breakdown"]
            row("transformer", f"d={d} m={m} seed {seed}", res, rel(res.model.W, tf.W),
                f"attention {qb['attention']} ffn {qb['ffn']}")


def minilm():
    """Every head of MiniLM-L6 layers 0, 3 and 5 (lowrank, rank 32, float64 and float32 answers) and six random
    d = 64 heads (exact, both precisions): a wider before/after comparison than the default parts."""
    for layer in (0, 3, 5):
        for head in range(12):
            h = minilm_head(layer, head)
            for prec in ("float64", "float32"):
                res = extract_lowrank(Oracle(h.with_dtype(prec), 384, precision=prec), rank=32)
                row("lowrank", f"MiniLM L{layer}H{head} rank 32 {prec}", res, rel(res.model.W, h.W))
    for seed in range(6):
        for prec in ("float64", "float32"):
            h = random_head(64, seed=seed, dtype=prec)
            res = extract_exact(Oracle(h, 64, precision=prec), seed=seed)
            row("exact", f"d=64 seed {seed} {prec}", res, rel(res.model.W, h.W), f"u {rel(res.model.u, h.u):.1e}")


def main():
    digest_column = " sha256 |" if DIGEST else ""
    print("| learner | setting | queries | re-measured | rel. err W | other | check |" + digest_column)
    print("|---|---|---|---|---|---|---|" + ("---|" if DIGEST else ""))
    parts = {"exact": exact, "lowrank": lowrank, "nuclear": nuclear, "robust": robust, "membership": membership,
             "transformer": transformer, "minilm": minilm}
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    for name in (names[0].split(",") if names else [p for p in parts if p != "minilm"]):
        parts[name]()


if __name__ == "__main__":
    main()
