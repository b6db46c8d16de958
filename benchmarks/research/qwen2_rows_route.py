"""Research: the every-row route with biases (Qwen2: RoPE + GQA + q/k/v biases) from bfloat16 every-position rows, its
library stages run one by one and each measured against the float64 module (docs/positional.md, "bfloat16 answers",
"Qwen2 (q/k/v biases) from every-position rows"). Stages save .npz under /tmp/qwen2/ and resume:

    PYTHONPATH=src python benchmarks/research/qwen2_rows_route.py start            (biased_start.biased_logit_start)
    PYTHONPATH=src python benchmarks/research/qwen2_rows_route.py polish    (the route's row polish, ROW_ROUNDS rounds)
    PYTHONPATH=src python benchmarks/research/qwen2_rows_route.py slow      (on the same rows: the slow pairs' split,
                                                                             then their signs, as rows_start runs them)
    PYTHONPATH=src python benchmarks/research/qwen2_rows_route.py final     (the hook's plan: the split refitted and
                                                                             the row polish on FINAL_SEQUENCES more
                                                                             rows; then the route's check)
    PYTHONPATH=src python benchmarks/research/qwen2_rows_route.py more      (research past the route: the polish
                                                                             continued on the final stage's rows and
                                                                             more, relative, a wider slow mixing)

(d = 64, 4/1 by default; ``--d 128 --heads 8 --kv-heads 2`` under the heavy-run wrapper.) The served layer is a
``transformers`` Qwen2 layer in bfloat16 answering every row, declaring its rotary frequencies as a Hugging Face
folder's config does (the route holds them). Each stage prints the function error over every length 1 … 256 (four
sequences each) against the float64 module; ``final`` also the route's check (the worst length against the answers,
what the claim bounds).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from attnprobe.learners.positional import bfloat16_rows as route
from attnprobe.learners.positional.row_polish import chunk_precision, fresh_rows, polish_rows
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention
from attnprobe.oracles.base import Oracle
from attnprobe.targets.positional_modules import positional_victim, reference_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from positional_bfloat16 import EveryRow  # noqa: E402  (the bfloat16 victim's every row)

OUT = Path("/tmp/qwen2")
ALL = tuple(range(1, 257))
STAGES = ("start", "polish", "slow", "final", "more", "signs")
NAMES = ("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo", "inv_freq")


class DeclaredRows(EveryRow):
    """The victim's every row, declaring its rotary frequencies (as ``--hf-dir`` does from the folder's config)."""

    def __init__(self, victim, frequencies):
        super().__init__(victim)
        self.rotary_frequencies = frequencies


def setup(args):
    kw = dict(d=args.d, heads=args.heads, kv_heads=args.kv_heads, seed=args.model_seed)
    truth = reference_model(positional_victim("qwen2", dtype="float64", **kw))
    victim = positional_victim("qwen2", dtype="bfloat16", **kw)
    return truth, Oracle(DeclaredRows(victim, truth.inv_freq), args.d, precision="bfloat16")


def path(args, stage, tag=""):
    return OUT / f"{stage}{tag}_{args.d}_{args.heads}_{args.kv_heads}_m{args.model_seed}.npz"


def save(args, stage, model):
    np.savez(path(args, stage, args.tag), **{k: np.asarray(getattr(model, k)) for k in NAMES})


def load(args, stage):
    """The saved state of ``stage``: this run's own (``--tag``) when resuming it, else the previous stage's
    (``--from-tag``)."""
    own = args.resume and stage == {"polish": "polished", "slow": "mixed", "final": "final", "more": "more"}.get(
        args.stage)
    p = dict(np.load(path(args, stage, args.tag if own else args.from_tag)))
    return PositionalAttention(p.pop("Wq"), p.pop("Wk"), p.pop("Wv"), p.pop("Wo"), position="rope", layout="half",
                               scale=1.0, causal=True, **p)


def every_length(model, truth, seed=5):
    return function_error_over_lengths(model, truth, np.random.default_rng(seed), ALL)


def options(oracle):
    return {"frequencies": False, "cg_steps": route.ROW_CG_STEPS, "dense": False,
            "compute": chunk_precision(oracle.precision), "min_gain": 0.0,  # the route: every round
            "log": lambda line: print(f"  {line}", flush=True)}


def stage_start(args, truth, oracle, rng):
    from attnprobe.learners.positional.biased_start import biased_logit_start

    settings = {"value_repeats": route.VALUE_REPEATS, "value_options": route.VALUE_MAP_OPTIONS,
                "logit_rounds": args.als}
    model, info = biased_logit_start(oracle, args.heads, rng, assemble=route.grouped_start, settings=settings,
                                     log=lambda line: print(f"  {line}", flush=True))
    print(f"start: {oracle.queries} queries; {info['neutral_token']}; mixing misfit {info['mixing_misfit']:.1e}; "
          f"logit misfit {info['logit_misfit']:.2e}; every length {every_length(model, truth):.2e}", flush=True)
    save(args, "start", model)


def route_rows(args, oracle, rng):
    """The route's stage-4 rows (``rows_start``: ROW_SEQUENCES of ROW_TOKENS); the same rows at the same seed."""
    return fresh_rows(oracle, args.sequences, rng, length=route.ROW_TOKENS)


def stage_polish(args, truth, oracle, rng):
    """The route's row polish (``rows_start``: ``polish_rows`` with its options), ``--rounds`` rounds."""
    model = load(args, "polished" if args.resume else "start")
    data = route_rows(args, oracle, rng)
    for done in range(0, args.rounds, args.chunk):  # saved every chunk (the damping starts again at each)
        model, rep = polish_rows(model, data, rounds=min(args.chunk, args.rounds - done), **options(oracle))
        print(f"row polish, rounds {done + 1}..{min(done + args.chunk, args.rounds)}: misfit {rep.misfit_before:.2e} "
              f"-> {rep.misfit_after:.2e}, every length {every_length(model, truth):.2e}", flush=True)
        save(args, "polished", model)


def stage_slow(args, truth, oracle, rng):
    """The rest of the route's stage 4 on the same rows, as ``rows_start`` runs it: the slow pairs' split
    (``fit_slow_mixing`` on ``mixing_pairs``), then their signs (``choose_pair_signs``)."""
    from attnprobe.learners.positional.pair_signs import choose_pair_signs
    from attnprobe.learners.positional.slow_mixing import fit_slow_mixing, mixing_pairs

    log = options(oracle)["log"]
    model = load(args, "mixed" if args.resume else "polished")
    data = route_rows(args, oracle, rng)
    if not args.resume:
        print(f"row-polished: every length {every_length(model, truth):.2e}", flush=True)
        variants = (args.bias_mixing, not args.bias_mixing) if args.variant else (args.bias_mixing,)
        for biases in variants:  # the route's mixing first (kept), then the other, from the same state, compared
            mixed, mixing = fit_slow_mixing(model, data, mixing_pairs(model, route.ROW_TOKENS),
                                            compute=options(oracle)["compute"], log=log, biases=biases)
            print(f"slow mixing ({'b_Q, b_K moved with their rows' if biases else 'b_Q, b_K held'}): pairs "
                  f"{mixing['pairs']}, misfit {mixing['misfit_before']:.3e} -> {mixing['misfit_after']:.3e} "
                  f"({mixing['steps']} steps); every length {every_length(mixed, truth):.2e}", flush=True)
            if biases == args.bias_mixing:
                kept = mixed
                save(args, "mixed", mixed)
            else:
                np.savez(path(args, "mixed", args.tag + "_other"), **{k: np.asarray(getattr(mixed, k)) for k in NAMES})
        model = kept
    if args.signs:
        model, signs = choose_pair_signs(model, data, polish_options=options(oracle), log=log)
        print(f"pair signs: flipped {signs['flipped']}; every length {every_length(model, truth):.2e}", flush=True)
    save(args, "signed", model)


def stage_final(args, truth, oracle, rng):
    """The hook's polish as the route plans it (``polish_plan``: the slow pairs' split refitted on
    FINAL_SEQUENCES fresh sequences, then FINAL_ROUNDS rounds of FINAL_CG_STEPS), then the route's check."""
    from attnprobe.learners.positional.coarse import worst_length_check
    from attnprobe.learners.positional.slow_mixing import fit_slow_mixing, mixing_pairs

    model = load(args, "final" if args.resume else "signed")
    data = fresh_rows(oracle, args.sequences, rng)
    opts = {**options(oracle), "cg_steps": route.FINAL_CG_STEPS}
    check = worst_length_check(oracle, model, np.random.default_rng(99), route.CHECK_LENGTHS, route.CHECK_PER_LENGTH)
    print(f"before: check {check.error:.2e}", flush=True)
    if not args.resume:
        model, mixing = fit_slow_mixing(model, data, mixing_pairs(model, data[0][0].shape[1]),
                                        compute=opts["compute"], log=opts["log"], biases=args.bias_mixing)
        print(f"hook's slow mixing: misfit {mixing['misfit_before']:.3e} -> {mixing['misfit_after']:.3e}; every "
              f"length {every_length(model, truth):.2e}", flush=True)
    model, rep = polish_rows(model, data, rounds=args.rounds, **opts)
    print(f"more rows, {args.rounds} rounds: misfit {rep.misfit_before:.2e} -> {rep.misfit_after:.2e}, every length "
          f"{every_length(model, truth):.2e}", flush=True)
    save(args, "final", model)
    check = worst_length_check(oracle, model, np.random.default_rng(99), route.CHECK_LENGTHS, route.CHECK_PER_LENGTH)
    print(f"check (worst length against the answers): {check.error:.2e} (claim {route.CLAIM:g}); every length against "
          f"float64 {every_length(model, truth, 6):.2e} (seed 6)", flush=True)


def two_checks(oracle, model):
    """The route's check (the worst length against the answers) on two seeds."""
    from attnprobe.learners.positional.coarse import worst_length_check

    for seed in (99, 98):
        check = worst_length_check(oracle, model, np.random.default_rng(seed), route.CHECK_LENGTHS,
                                   route.CHECK_PER_LENGTH)
        print(f"check (seed {seed}): {check.error:.2e} (claim {route.CLAIM:g})", flush=True)


def stage_more(args, truth, oracle, rng):
    """Past the hook's plan (research): the row polish continued from ``final`` (``--from-tag``) on the final stage's
    own rows (its seed's FINAL_SEQUENCES) plus ``--add`` fresh sequences, ``--relative`` (each position's rows
    relative to their spread, as the check weighs lengths) and ``--cg-steps``; saved every ``--chunk`` rounds; then
    the route's check on two seeds."""
    model = load(args, "more" if args.resume else "final")
    data = fresh_rows(oracle, route.FINAL_SEQUENCES, np.random.default_rng(args.seed + 20))
    if args.add:  # more rows: of 256 tokens joined to the final stage's, or longer ones (a batch of their own)
        more = fresh_rows(oracle, args.add, rng, length=args.add_length)[0]
        joined = args.add_length == data[0][0].shape[1]
        data = [tuple(np.concatenate(z) for z in zip(data[0], more))] if joined else data + [more]
    X, Y = data[0]
    opts = {**options(oracle), "cg_steps": args.cg_steps or route.FINAL_CG_STEPS, "relative": args.relative}
    for flip in args.conjugate.split(",") if args.conjugate and not args.resume else ():
        from attnprobe.learners.positional.pair_signs import conjugated

        group, pair = map(int, flip.split(":"))
        model = conjugated(model, group, pair)
        print(f"conjugated group {group}'s pair {pair}", flush=True)
    if args.pairs and not args.resume:  # the slow mixing over these pairs first (the route's: under SLOW_ANGLE)
        from attnprobe.learners.positional.slow_mixing import fit_slow_mixing

        used = [(X[:args.mixing_sequences], Y[:args.mixing_sequences])] if args.mixing_sequences else data
        model, mixing = fit_slow_mixing(model, used, [int(k) for k in args.pairs.split(",")], compute=opts["compute"],
                                        log=opts["log"], biases=True)
        print(f"slow mixing over pairs {args.pairs} on {len(used[0][0])} sequences: misfit "
              f"{mixing['misfit_before']:.3e} -> {mixing['misfit_after']:.3e}; every length "
              f"{every_length(model, truth):.2e} / {every_length(model, truth, 6):.2e} (seeds 5 / 6)", flush=True)
        save(args, "more", model)
    for done in range(0, args.rounds, args.chunk):
        model, rep = polish_rows(model, data, rounds=min(args.chunk, args.rounds - done), **opts)
        print(f"rounds {done + 1}..{min(done + args.chunk, args.rounds)} on {rep.sequences} sequences: misfit "
              f"{rep.misfit_before:.3e} -> {rep.misfit_after:.3e}; every length {every_length(model, truth):.2e} / "
              f"{every_length(model, truth, 6):.2e} (seeds 5 / 6)", flush=True)
        save(args, "more", model)
    two_checks(oracle, model)


def stage_signs(args, truth, oracle, rng):
    """The hook's sign test (``polish_plan["pair_signs"]``, the route with biases): from ``final`` (``--from-tag``),
    :func:`~.pair_signs.choose_pair_signs` on the first ``--sign-sequences`` of the final stage's rows, then
    ``--rounds`` rounds on all of them (the hook's options); the function on two seeds and the route's check on two."""
    from attnprobe.learners.positional.pair_signs import choose_pair_signs

    model = load(args, "final")
    X, Y = fresh_rows(oracle, route.FINAL_SEQUENCES, np.random.default_rng(args.seed + 20))[0]
    opts = {**options(oracle), "cg_steps": route.FINAL_CG_STEPS}
    print(f"from final{args.from_tag}: every length {every_length(model, truth):.2e} / "
          f"{every_length(model, truth, 6):.2e} (seeds 5 / 6)", flush=True)
    model, signs = choose_pair_signs(model, [(X[:args.sign_sequences], Y[:args.sign_sequences])],
                                     polish_options=opts, log=opts["log"])
    print(f"pair signs on {args.sign_sequences} sequences: flipped {signs['flipped']}; every length "
          f"{every_length(model, truth):.2e} / {every_length(model, truth, 6):.2e}", flush=True)
    save(args, "signs", model)
    model, rep = polish_rows(model, [(X, Y)], rounds=args.rounds, **opts)
    print(f"{args.rounds} rounds on {len(X)}: misfit {rep.misfit_before:.3e} -> {rep.misfit_after:.3e}; every length "
          f"{every_length(model, truth):.2e} / {every_length(model, truth, 6):.2e} (seeds 5 / 6)", flush=True)
    save(args, "signs", model)
    two_checks(oracle, model)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=STAGES)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--model-seed", type=int, default=0)
    ap.add_argument("--als", type=int, default=route.LOGIT_ROUNDS)
    ap.add_argument("--sequences", type=int, default=None, help="polish, slow: ROW_SEQUENCES; final: FINAL_SEQUENCES")
    ap.add_argument("--rounds", type=int, default=None, help="polish: ROW_ROUNDS; final: FINAL_ROUNDS")
    ap.add_argument("--tag", default="", help="a suffix of the names this run saves (a variant beside the route's)")
    ap.add_argument("--from-tag", default="", help="the suffix of the previous stage's saved state to start from")
    ap.add_argument("--chunk", type=int, default=1000, help="polish: rounds a call of polish_rows, saved after each")
    ap.add_argument("--bias-mixing", action="store_true", help="slow, final: the slow mixing moves b_Q, b_K too")
    ap.add_argument("--no-variant", dest="variant", action="store_false",
                    help="slow: not also the other mixing (biases moved / held) from the same state, for comparison")
    ap.add_argument("--no-signs", dest="signs", action="store_false")
    ap.add_argument("--seed", type=int, default=0, help="the stage's fresh sequences (plus 10 per stage)")
    ap.add_argument("--add", type=int, default=0, help="more: fresh sequences added to the final stage's rows")
    ap.add_argument("--add-length", type=int, default=256, help="more: the added sequences' tokens")
    ap.add_argument("--relative", action="store_true", help="more: each position's rows relative to their spread")
    ap.add_argument("--pairs", default="", help="more: the slow mixing over these pairs first (e.g. 5,6,7)")
    ap.add_argument("--sign-sequences", type=int, default=16, help="signs: the test's sequences")
    ap.add_argument("--conjugate", default="", help="more: conjugate these pairs first (group:pair, comma-separated)")
    ap.add_argument("--mixing-sequences", type=int, default=0, help="more: the mixing on the first this many")
    ap.add_argument("--cg-steps", type=int, default=0, help="more: conjugate-gradient steps a round")
    ap.add_argument("--resume", action="store_true", help="polish, final: from the stage's own saved state")
    args = ap.parse_args()
    final = args.stage in ("final", "more", "signs")
    args.sequences = args.sequences or (route.FINAL_SEQUENCES if final else route.ROW_SEQUENCES)
    args.rounds = args.rounds or (route.FINAL_ROUNDS if final else route.ROW_ROUNDS)
    OUT.mkdir(exist_ok=True)
    import torch
    torch.set_num_threads(1)
    truth, oracle = setup(args)
    t0 = time.perf_counter()
    # slow: the polish's rows
    seed = args.seed + 10 * {"start": 0, "polish": 1, "slow": 1, "final": 2, "more": 3, "signs": 3}[args.stage]
    {"start": stage_start, "polish": stage_polish, "slow": stage_slow, "final": stage_final,
     "more": stage_more, "signs": stage_signs}[args.stage](
        args, truth, oracle, np.random.default_rng(seed))
    print(f"{args.stage}: {oracle.queries} queries, {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
