"""The vector multi-head learner on every-position answers: real MiniLM-L6 layers answering the output row at every
position (bidirectional, no position terms), against the same layer read at the last position; and a GQA layer.

    PYTHONPATH=src python benchmarks/every_position.py minilm [--layers 2] [--answers last every causal]
    PYTHONPATH=src python benchmarks/every_position.py hf [--layers 2]      # transformers' module, float32
    PYTHONPATH=src python benchmarks/every_position.py gqa [--answers last every]  # 8 query / 2 KV heads vs 8/8
    PYTHONPATH=src python benchmarks/every_position.py llama  # transformers' LlamaAttention, rotation off
    PYTHONPATH=src python benchmarks/every_position.py hf --layers 2 --answers every last --dtype float32
    PYTHONPATH=src:tests python benchmarks/every_position.py families [--write]  # each Hugging Face family
    PYTHONPATH=src python benchmarks/every_position.py sources --seeds 0 1 2  # float32 MiniLM: where the error is
    PYTHONPATH=src python benchmarks/every_position.py tiny   # float64: what rows of tiny tokens tell about M

Prints one markdown table per run: sequences (queries), rows answered, errors (relative, worst head after
matching heads up to permutation), the information limit (low-rank degrees of freedom / K numbers per row / N rows
per sequence, N the longest sequence the learner sends) and the phases.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from attnprobe.errors import RecoveryError
from attnprobe.learners.multihead.vector import extract_vector
from attnprobe.models.every_position import EveryPositionLayer
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.oracles.base import Oracle

#: the results file the families table is written into (docs/benchmarks/hf-families.md)
DOC = "hf-families"
HEADER = ("| target | answers | sequences | rows | info. limit (rows) | info. limit (sequences of N) | W_h | u_h | V_h "
          "| check | phases | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def minilm_layer(layer: int) -> MultiHeadAttention:
    from attnprobe.targets.hf import hf_layer_arrays, minilm_dir

    return MultiHeadAttention.from_arrays(hf_layer_arrays(minilm_dir(), layer))


class LongestSequence:
    """An every-position callable that remembers the longest sequence it answered (for the information limit)."""

    def __init__(self, fn):
        self.fn, self.longest = fn, 1
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, X):
        self.longest = max(self.longest, X.shape[1])
        return self.fn(X)


def row(name, answers, true, fn, precision=None, seed=0, head_dim=None, oracle=None):
    """One table row: the vector learner on ``fn`` (or on ``oracle``, whose callable is wrapped to watch its
    longest sequence) against the layer ``true``."""
    if oracle is None:
        oracle = Oracle(fn, true.d, precision=precision)
    watch = LongestSequence(oracle.fn)
    oracle.fn = watch
    t0 = time.perf_counter()
    res = extract_vector(oracle, seed=seed)
    sec = time.perf_counter() - t0
    m = match_heads(true, res.model)
    H, K, d = true.v.shape
    r = head_dim or d // H
    unknowns = MultiHeadAttention.low_rank_unknowns(d, H, r, K)
    phases = ", ".join(f"{k} {v}" for k, v in res.queries_by_phase.items())
    rows = res.details["rows"]
    N = watch.longest if answers != "last" else 1
    return (f"| {name} | {answers} | {res.queries} | {rows} | {unknowns / K:.0f} | {unknowns / (K * N):.0f} "
            f"(N = {N}) | {np.max(m.W):.1e} | {np.max(m.u):.1e} | {np.max(m.v):.1e} | "
            f"{'passed' if res.check.passed else 'FAILED'} {res.check.error:.1e} | {phases} | {sec:.0f} |"), res


#: the families without position terms in their logits (docs/benchmarks/hf-families.md)
FAMILIES = ("bert", "roberta", "electra", "distilbert", "albert", "gpt2")


def families_table(seed: int = 0, hidden: int = 32, heads: int = 4, layer: int = 1) -> str:
    """The vector learner through the hf oracle on a random-init folder of each family (``tests/hf_models``),
    float64 and float32 modules, at the last position (the counts before every-position answers) and at every
    position (causal for GPT-2, bidirectional otherwise)."""
    import tempfile
    from pathlib import Path

    from attnprobe.oracles.hf_attention import oracle_from_hf
    from attnprobe.targets.hf import hf_layer_arrays
    from hf_models import tiny_family_dir

    lines = [f"load: {os.getloadavg()[0]:.1f} (2 cores shared)", "",
             *HEADER.replace("| target |", "| family, module |").splitlines()]
    with tempfile.TemporaryDirectory() as tmp:
        for fam in FAMILIES:
            folder = tiny_family_dir(Path(tmp) / fam, fam, hidden=hidden, heads=heads, layers=2, seed=seed)
            true = MultiHeadAttention.from_arrays(hf_layer_arrays(folder, layer))
            for dtype in ("float64", "float32"):
                for every in (False, True):
                    oracle = oracle_from_hf(folder, layer, dtype=dtype, every_position=every, precision="auto")
                    answers = oracle.fn.positions if every else "last"
                    try:
                        line = row(f"{fam}, {dtype}", answers, true, None, seed=seed, oracle=oracle)[0]
                    except Exception as exc:  # a refusal is a result too: one line, its cause
                        line = f"| {fam}, {dtype} | {answers} | {oracle.queries} | | | | | | | {exc} | | |"
                    lines.append(line)
                    print(line, flush=True)
    lines += ["", f"d = {hidden}, {heads} heads, layer {layer} of 2, weights and biases N(0, 0.5²), folder seed "
              f"{seed}, learner seed {seed}; precision read from the answers; the info. limit counts rank d/H for "
              "every W_h and V_h plus biases over K numbers per row (and over N rows per sequence)."]
    return "\n".join(lines)


def error_sources(seed: int, layer: int = 2) -> str:
    """One table row: the float32 MiniLM layer through the hf oracle, every position, with the logits stage run a
    second time from the same random state on the true value maps (heads matched): how much of the ``W_h`` and
    ``u_h`` error the value maps' error causes."""
    import attnprobe.learners.multihead.vector as vector
    from attnprobe.oracles.hf_attention import oracle_from_hf
    from attnprobe.targets.hf import minilm_dir

    true, seen = minilm_layer(layer), {}
    learn = vector.learn_logits_rows

    def watch(oracle, c, V, scale, tokens, rng, report, **kw):
        seen.update(args=(oracle, c, V.copy(), scale, tokens), kw=kw, state=rng.bit_generator.state)
        return learn(oracle, c, V, scale, tokens, rng, report, **kw)

    vector.learn_logits_rows = watch
    oracle = oracle_from_hf(minilm_dir(), layer, dtype="float32", every_position=True, precision="auto")
    try:
        res = extract_vector(oracle, seed=seed)
    except RecoveryError as exc:  # a refusal is an outcome: its one line and what it asked
        return (f"| {seed} | {oracle.queries} | | {oracle.rows} | | | | | | | | refused: {type(exc).__name__}: "
                f"{exc} |")
    finally:
        vector.learn_logits_rows = learn
    m = match_heads(true, res.model)
    oracle, c, V, scale, tokens = seen["args"]
    order = np.argsort(m.perm)  # recovered head g is true head order[g]
    rng = np.random.default_rng()
    rng.bit_generator.state = seen["state"]
    W, u, *_ = learn(oracle, c, true.v[order], scale, tokens, rng, lambda: None, **seen["kw"])
    W, u, _ = vector.truncate_to_value_ranks(W, true.v[order], u)
    fixed = match_heads(true, MultiHeadAttention(W, true.v[order], u, c))
    phases = ", ".join(f"{k} {v}" for k, v in res.queries_by_phase.items())
    worst = max(np.max(m.v), np.max(m.W), np.max(m.u))
    outcome = ("FAILED" if not res.check.passed else "passed, every head ≤ 1e-3" if worst <= 1e-3
               else "passed, a head > 1e-3")
    redone = f"restarts {res.details['restarts']}, dropped {res.details['dropped']}"
    return (f"| {seed} | {res.queries} | {res.queries + res.check.queries} | {res.details['rows']} | {phases} | "
            f"{redone} | {np.max(m.v):.1e} | {np.max(m.W):.1e} | {np.max(m.u):.1e} | {np.max(fixed.W):.1e} | "
            f"{np.max(fixed.u):.1e} | {res.check.error:.1e} | {outcome} |")


def tiny_rows(layer: int = 2, length: int = 8, seed: int = 0) -> str:
    """Rows of one sequence of ``length`` tokens of norm ε (float64, bidirectional): how far they are from
    ``M x̄ + c`` (x̄ the tokens' mean) and from each other, as ε shrinks."""
    true = minilm_layer(layer)
    f = EveryPositionLayer(true)
    M, c = true.v.sum(0), true.c
    X = np.random.default_rng(seed).standard_normal((length, true.d)) / np.sqrt(true.d)
    lines = ["| ε | rows apart (largest, / ‖M x̄‖) | mean row − M x̄ (/ ‖M x̄‖) |", "|---|---|---|"]
    for eps in (1e-1, 1e-2, 1e-3, 1e-4):
        Y = f(eps * X[None])[0] - c
        first = M @ (eps * X.mean(0))
        apart = np.linalg.norm(Y - Y.mean(0), axis=1).max() / np.linalg.norm(first)
        lines.append(f"| {eps:.0e} | {apart:.1e} | {np.linalg.norm(Y.mean(0) - first) / np.linalg.norm(first):.1e} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["minilm", "hf", "gqa", "llama", "families", "sources",
                                                                 "tiny"])
    ap.add_argument("--dtype", default="float32", help="hf: the module's dtype")
    ap.add_argument("--write", action="store_true", help="families: write the table into docs/benchmarks/"
                                                         "hf-families.md")
    ap.add_argument("--layers", type=int, nargs="*", default=[2])
    ap.add_argument("--answers", nargs="*", default=["last", "every"], choices=["last", "every", "causal"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2], help="sources: the learner's seeds")
    args = ap.parse_args(argv)
    if args.what == "sources":
        print(f"load: {os.getloadavg()[0]:.1f} (2 cores shared)")
        print("| seed | sequences | with check | rows | phases | restarts, dropped fits | V_h | W_h | u_h "
              "| W_h (true V_h) | u_h (true V_h) | check error | outcome |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for seed in args.seeds:
            print(error_sources(seed, args.layers[0]), flush=True)
        return
    if args.what == "tiny":
        print(tiny_rows(args.layers[0]))
        return
    print(f"load: {os.getloadavg()[0]:.1f} (2 cores shared)")
    print(HEADER)
    if args.what == "minilm":
        for L in args.layers:
            true = minilm_layer(L)
            for answers in args.answers:
                fn = true if answers == "last" else EveryPositionLayer(true, causal=answers == "causal")
                print(row(f"MiniLM layer {L}, numpy float64", answers, true, fn, seed=args.seed)[0], flush=True)
    elif args.what == "hf":  # the hf oracle (what --hf-dir reads) on the installed all-MiniLM-L6-v2 folder
        from attnprobe.oracles.hf_attention import oracle_from_hf
        from attnprobe.targets.hf import minilm_dir

        for L in args.layers:
            true = minilm_layer(L)
            for answers in args.answers:
                oracle = oracle_from_hf(minilm_dir(), L, dtype=args.dtype, every_position=answers != "last",
                                        precision="auto")
                print(row(f"MiniLM layer {L}, transformers {args.dtype}", answers, true, None, seed=args.seed,
                          oracle=oracle)[0], flush=True)
    elif args.what == "families":
        table = families_table(args.seed)
        print(table)
        if args.write:
            from sections import command_line, write_section

            write_section("Every position on each family: sequences, rows, information limit", table,
                          command_line(), doc=DOC)
    elif args.what == "llama":  # transformers' LlamaAttention, rotation off; its softmax is float32
        from attnprobe.targets.every_position import LlamaRows

        for kv in (8, 2):
            fn = LlamaRows(64, 8, kv, seed=args.seed)
            line, res = row(f"LlamaAttention d=64, 8 query heads / {kv} KV heads, no rotation", "every", fn.truth(),
                            fn, precision="float32", seed=args.seed, head_dim=8)
            print(line, f"groups {res.details['groups']}, value rank {res.details['value_rank']}, "
                  f"differences {res.details['differences']}, result numbers {res.details['result_numbers']}",
                  flush=True)
    else:
        from attnprobe.targets.every_position import gqa_layer

        for answers in args.answers:
            for kv in (8, 2):
                true = gqa_layer(64, 8, kv, seed=args.seed)
                fn = true if answers == "last" else EveryPositionLayer(true, causal=answers == "causal")
                line, res = row(f"LLaMA-style d=64, 8 query heads / {kv} KV heads, no rotation", answers, true, fn,
                                seed=args.seed, head_dim=8)
                print(line, f"groups {res.details['groups']}, value rank {res.details['value_rank']}, "
                      f"differences {res.details['differences']}, result numbers {res.details['result_numbers']}",
                      flush=True)


if __name__ == "__main__":
    main()
