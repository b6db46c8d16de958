"""Multi-head one-layer transformers with a biased K-output ReLU FFN: the region learner (``--method transformer``).

    python benchmarks/transformer_multihead.py --tables grid --d 8 --seeds 5
    python benchmarks/transformer_multihead.py --tables eprint,mha26,separate --seeds 5

``grid``: success per cell over d, H ∈ {1, 2, 4, 6}, m ∈ {8, 16, 64}, biases on/off, K ∈ {1, 3, 10}: a run succeeds
when its functional check passes and the model's relative error on fresh N(0, I) sequences of every length 1–16
(against the true model) is ≤ 1e-8. ``eprint``: d = 8, H = 6 (the ePrint 2026/1678 experiment's size) beside its
2⁻⁵¹. ``mha26``: bias-free FFN, one output. ``separate``: our queries against the unknowns and against the
multi-head generic learner plus the FFN learner run on their own. Each run has a budget of 10⁶ queries.
Timings are wall-clock seconds on a shared 2-core machine. Tables go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.learners.transformer_multihead import extract_transformer_multihead
from attnprobe.models import MultiHeadAttention, MultiHeadTransformer
from attnprobe.models.transformer import transformer_errors
from attnprobe.oracles import Oracle
from attnprobe.reports import Table, command_line, write_section
from attnprobe.targets import random_multihead, random_multihead_transformer, random_relu_net

BUDGET = 1_000_000
TOL = 1e-8


def one_run(d, H, m, K, bias, seed, residual=False):
    """One extraction: (success, function error, W error, u error, queries, unknowns, seconds, why-failed)."""
    t = random_multihead_transformer(d, H, m, outputs=K, bias=bias, residual=residual, seed=seed)
    o = Oracle(t, d, budget=BUDGET)
    t0 = time.perf_counter()
    try:
        res = extract_transformer_multihead(o, seed=seed)
    except AttnprobeError as exc:
        return False, np.inf, np.inf, np.inf, o.queries, None, time.perf_counter() - t0, type(exc).__name__
    secs = time.perf_counter() - t0
    errs = transformer_errors(t, res.model, seed=seed + 1)
    ok = bool(res.passed) and errs["function"] <= TOL and res.model.H == H
    why = "" if ok else ("check" if not res.passed else ("heads" if res.model.H != H else "error"))
    return ok, errs["function"], errs["W"], errs["u"], res.queries, res.unknowns, secs, why


def grid_table(ds, seeds):
    t = Table(["d", "H", "m", "bias", "K", "runs", "success", "max fn error (ok runs)", "median queries",
               "unknowns", "queries / unknown", "median s", "failures"])
    for d in ds:
        for H in (1, 2, 4, 6):
            for m in (8, 16, 64):
                for bias in (True, False):
                    for K in (1, 3, 10):
                        out = [one_run(d, H, m, K, bias, 1000 * d + 100 * H + m + 7 * K + s) for s in range(seeds)]
                        ok = [r for r in out if r[0]]
                        unk = MultiHeadTransformer.unknowns(d, H, m, K)
                        q = float(np.median([r[4] for r in out]))
                        fails = {}
                        for r in out:
                            if not r[0]:
                                fails[r[7]] = fails.get(r[7], 0) + 1
                        t.add(d, H, m, "yes" if bias else "no", K, len(out), f"{len(ok)}/{len(out)}",
                              max((r[1] for r in ok), default=float("nan")), q, unk, q / unk,
                              float(np.median([r[6] for r in out])),
                              ", ".join(f"{k} {v}" for k, v in fails.items()) or "-")
                        print(t.rows[-1], flush=True)
    return t


def eprint_table(seeds):
    t = Table(["setting", "seeds", "success", "max W error", "max u error", "max fn error", "paper's precision",
               "median queries", "unknowns", "median s"])
    for name, kw in (("d=8, H=6, m=16, K=1, biases", dict(m=16, K=1, bias=True)),
                     ("d=8, H=6, m=16, K=3, biases, residual", dict(m=16, K=3, bias=True, residual=True))):
        out = [one_run(8, 6, kw["m"], kw["K"], kw["bias"], 7000 + s, kw.get("residual", False)) for s in range(seeds)]
        ok = [r for r in out if r[0]]
        t.add(name, seeds, f"{len(ok)}/{seeds}", max((r[2] for r in ok), default=np.nan),
              max((r[3] for r in ok), default=np.nan), max((r[1] for r in ok), default=np.nan), 2.0 ** -51,
              float(np.median([r[4] for r in out])), MultiHeadTransformer.unknowns(8, 6, kw["m"], kw["K"]),
              float(np.median([r[6] for r in out])))
        print(t.rows[-1], flush=True)
    return t


def mha26_table(seeds):
    t = Table(["d", "H", "m", "seeds", "success", "median queries", "4Hd² − 2H + 1 (attention only)",
               "unknowns", "max fn error"])
    for d, H, m in ((8, 2, 16), (12, 4, 16), (16, 4, 32), (32, 4, 64)):
        out = [one_run(d, H, m, 1, False, 9000 + 10 * d + s) for s in range(seeds)]
        ok = [r for r in out if r[0]]
        t.add(d, H, m, seeds, f"{len(ok)}/{seeds}", float(np.median([r[4] for r in out])),
              MultiHeadAttention.query_bound(d, H), MultiHeadTransformer.unknowns(d, H, m, 1),
              max((r[1] for r in ok), default=np.nan))
        print(t.rows[-1], flush=True)
    return t


def separate_table(seeds):
    """Our transformer learner against the multi-head generic learner and the FFN learner run on their own."""
    t = Table(["d", "H", "m", "K", "transformer queries", "unknowns", "generic multi-head alone", "FFN alone",
               "sum of the two", "ratio"])
    for d, H, m, K in ((8, 2, 16, 1), (12, 4, 16, 3), (16, 4, 32, 10), (32, 4, 64, 3)):
        tq, gq, fq = [], [], []
        for s in range(seeds):
            seed = 5000 + 10 * d + s
            tq.append(one_run(d, H, m, K, True, seed)[4])
            mh = Oracle(random_multihead(d, H, max(2, d // H), seed=seed), d, budget=BUDGET)
            extract_generic(mh, seed=s, check=False)
            gq.append(mh.queries)
            fo = Oracle(random_relu_net(d, m, seed=seed, bias=True, outputs=K), d, budget=BUDGET)
            extract_ffn(fo, seed=s, check=False)
            fq.append(fo.queries)
        q, g, f = (float(np.median(x)) for x in (tq, gq, fq))
        t.add(d, H, m, K, q, MultiHeadTransformer.unknowns(d, H, m, K), g, f, g + f, q / (g + f))
        print(t.rows[-1], flush=True)
    return t


SECTION = "Multi-head transformers: biased K-output FFN, residual (region learner)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", default="grid")
    ap.add_argument("--d", default="8,12,32")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    ds = [int(x) for x in args.d.split(",")]
    makers = {"grid": lambda: grid_table(ds, args.seeds), "eprint": lambda: eprint_table(args.seeds),
              "mha26": lambda: mha26_table(args.seeds), "separate": lambda: separate_table(args.seeds)}
    titles = {"grid": f"grid d ∈ {{{args.d}}}", "eprint": "the ePrint 2026/1678 size (d = 8, H = 6)",
              "mha26": "bias-free FFN, one output (the MHA'26 setting)",
              "separate": "queries against the learners run separately"}
    for name in args.tables.split(","):
        table = makers[name]()
        print(table.markdown())
        if not args.no_write:
            write_section(titles[name], table.markdown(), command_line(), parent=SECTION)


if __name__ == "__main__":
    main()
