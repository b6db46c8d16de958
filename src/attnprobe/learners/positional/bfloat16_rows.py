"""RoPE attention (LLaMA, Mistral: no biases; heads sharing keys and values) from bfloat16 answers of an oracle that
serves every row (docs/positional.md, "bfloat16 answers"): the route for more than two heads, where the zero-key
sweep at the last position reads the value maps only ~3 % close.

1. **values** — ``M``, ``c`` from ``VALUE_REPEATS·2d`` one-token sequences (:func:`~.coarse.coarse_values`);
2. **value maps** — :func:`~.span_sweep.row_value_maps`: the span of the ``V_h`` from every-position rows, cut into
   the key/value groups' sub-spans, each group's mixing from a zero-key sweep read in the span's coordinates (d = 128,
   8/2: every ``V_h`` within 8.0e-3);
3. **logit maps** — :mod:`.absolute_logits`: absolute logits from zero-padded rows, alternating least squares (a
   rough start: 0.44 … 1.2 off at d = 128);
4. **row polish** — :func:`~.row_polish.polish_rows` on ``ROW_SEQUENCES`` fresh sequences of 256 rows (d = 128,
   8/2, frequencies held: misfit 0.80 → 7.9e-3, the function 3.7e-2 over every length in twelve rounds), the
   frequencies fitted from the base (held where the oracle declares them: a Hugging Face folder's config); then on
   the same rows the slow pairs' split (:func:`~.slow_mixing.fit_slow_mixing`: 3.3e-2 → 2.0e-2 over every length)
   and their signs (:func:`~.pair_signs.choose_pair_signs`: a conjugated slow pair, which no continuous fit turns
   back);
5. **more rows** — the learners' hook (:func:`~.polish_hook.polish_extraction`) refits the split and polishes on
   the rows of ``FINAL_SEQUENCES`` fresh sequences (kept only when a fresh check says closer); then
   :func:`~.route.claim_verdict` holds the check, read over every length 1 … 256, to :data:`CLAIM`
   (docs/positional.md, "bfloat16 answers": the stages measured one by one, and end to end).

With ``biases`` (q/k/v biases, Qwen2: what :func:`~.bfloat16.extract_bfloat16_positional` sends here when the layer
declares them) stages 1–3 run behind a token with every key and value zero (:mod:`.biased_start`), the polish fits
every bias, and the hook runs :data:`FINAL_ROUNDS_BIASES` rounds, then tests the slow pairs' signs again on
:data:`FINAL_SIGN_SEQUENCES` of its sequences (Qwen2 d = 128, 8/2, the stages one by one: 1.4e-2 … 1.7e-2 from the
float64 module over every length, check 2.1e-2 … 2.2e-2; docs/positional.md, "The sign test after the hook's
polish").
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.learners.positional.method import CLAIM_LENGTHS, CLAIM_PER_LENGTH
from attnprobe.models.positional import PositionalAttention

#: one-token sequences per input dimension and sign in the values stage (as the last-position bfloat16 route's)
VALUE_REPEATS = 16
#: the row polish: fresh sequences, their rows, rounds and conjugate-gradient steps a round (d = 128, 8/2 from the
#: logit maps' 1.15: 3.7e-2 over every length after twelve rounds on 16 sequences of 256 rows, 461 s under load)
ROW_SEQUENCES, ROW_TOKENS, ROW_ROUNDS, ROW_CG_STEPS = 16, 256, 12, 60
#: the hook's polish: more rows (fresh sequences of 256 rows), rounds and conjugate-gradient steps a round, after
#: the slow pairs' split refitted on them (the last-position polish on 2,000 sequences instead stalls at 3.4e-2, its
#: long lengths worse — docs/positional.md, "bfloat16 answers")
FINAL_SEQUENCES, FINAL_ROUNDS, FINAL_CG_STEPS = 48, 4, 60
#: with q/k biases the hook then tests the slow pairs' signs again on this many of its sequences (its rows have
#: settled the slow pairs by then; Qwen2 d = 128, 8/2: a group's lowest pair left conjugated by the route's own test,
#: flipped back there: 2.5e-2 … 4.3e-2 → 1.4e-2 … 1.6e-2 over every length — docs/positional.md)
FINAL_SIGN_SEQUENCES = 16
#: the hook's rounds with q/k biases (measured so: eight rounds, then the sign test; the slow pairs settle later)
FINAL_ROUNDS_BIASES = 8
#: :func:`~.span_sweep.row_value_maps`' options beyond its defaults (a test shrinks the sweep), and the logit maps'
#: alternating rounds (:mod:`.absolute_logits`)
VALUE_MAP_OPTIONS: dict = {}
LOGIT_ROUNDS = 3
#: the check error (the worst length's, lengths 1 … 256, against the answers) the route claims: the issue's 3e-2, as a
#: distance from what the server answers. The answers are themselves that far from the layer's float64 function —
#: the float64 module's own check reads 1.6e-2 (LLaMA d = 128, 8/2) and 1.8e-2 … 2.6e-2 (Qwen2 d = 64, 4/1) over
#: every length — so a claim of 2e-2 refused the layer itself about half the time (docs/positional.md)
CLAIM = 3e-2
#: the route's check: every length, the statistic its claim bounds (:data:`~.method.CLAIM_LENGTHS`)
CHECK_LENGTHS, CHECK_PER_LENGTH = CLAIM_LENGTHS, CLAIM_PER_LENGTH
#: why a result above the claim is refused (the verdict's one line)
CLAIM_CAUSE = ("the every-row route's row polish and the slow pairs' refit did not bring the logit maps within it; "
               "docs/positional.md, \"bfloat16 answers\"")


def rows_queries(d: int, H: int, G: int = 1, *, biases: bool = False) -> int:
    """Queries :func:`rows_start` asks: values, the span and the sweep (the span's grow with the ``G`` key/value
    groups: one gives the fewest), the logit sequences, the row polish's sequences; with ``biases`` the zero token's
    probe besides (at most: :func:`~.bias_rows.neutral_token_queries`)."""
    from attnprobe.learners.positional.absolute_logits import absolute_logit_queries
    from attnprobe.learners.positional.bias_rows import neutral_token_queries
    from attnprobe.learners.positional.span_sweep import row_value_queries

    return (2 * d * VALUE_REPEATS + row_value_queries(d, H, G) + absolute_logit_queries()
            + ROW_SEQUENCES + (neutral_token_queries(d, G * d // H) if biases else 0))


def grouped_start(Wq: np.ndarray, Wk: np.ndarray, Cb: np.ndarray, Gh: np.ndarray, c: np.ndarray,
                  theta: np.ndarray) -> PositionalAttention:
    """The start with one value map per key/value group: ``W_V,g`` its first head's ``G_h``, each head's
    ``W_O,h = C_h G_h W_V,g⁺`` (the group's heads share ``W_V,g``: ``G_h`` differ by a ``d_h × d_h`` mixing)."""
    H, dh, _ = Gh.shape
    per = H // Wk.shape[0]
    Wv = Gh[::per]
    Wo = np.concatenate([Cb[:, h * dh:(h + 1) * dh] @ Gh[h] @ np.linalg.pinv(Wv[h // per]) for h in range(H)], axis=1)
    return PositionalAttention(Wq, Wk, Wv, Wo, bo=c, position="rope", inv_freq=theta, layout="half", scale=1.0,
                               causal=True)


def logit_start(oracle, H: int, rng: np.random.Generator, *, base: float | None = None, log=None, report=None):
    """Stages 1–3 (module docstring): the start :func:`grouped_start` and a dict of what they measured (among it
    ``frequencies``: ``declared`` by the oracle — a Hugging Face folder's config — or from ``base``, ``fitted``)."""
    from attnprobe.learners.positional.absolute_logits import absolute_logit_samples, fit_logit_maps
    from attnprobe.learners.positional.coarse import coarse_values, split_value_maps, start_frequencies
    from attnprobe.learners.positional.span_sweep import row_value_maps

    log = log or (lambda line: None)
    report = report or (lambda: None)
    d = oracle.d
    with oracle.phase("values"):
        M, c = coarse_values(oracle, rng, math.sqrt(d), repeats=VALUE_REPEATS)
    with oracle.phase("value maps"):
        V, measured = row_value_maps(oracle, H, rng, M=M, c=c, **VALUE_MAP_OPTIONS)
    report()
    log(f"value maps: {measured['groups']} key/value groups, mixing misfit {measured['mixing_misfit']:.1e}")
    Cb, Gh = split_value_maps(V, M)
    theta, source = start_frequencies(oracle, Gh.shape[1], base)
    with oracle.phase("logit maps"):
        samples = absolute_logit_samples(oracle, Cb, Gh, c, rng)
    report()
    Wq, Wk, misfit = fit_logit_maps(samples, H, measured["groups"], theta, rng, rounds=LOGIT_ROUNDS,
                                   log=log)
    measured = {**measured, "frequencies": source,
                "logit_samples": int((samples["w"] > 0).sum()), "logit_misfit": misfit}
    return grouped_start(Wq, Wk, Cb, Gh, c, theta), measured


def rows_start(oracle, H: int, rng: np.random.Generator, *, base: float | None = None, biases: bool = False, log=None,
               report=None):
    """Stages 1–4 (module docstring), the row polish followed on the same rows by the slow pairs' split
    (:func:`~.slow_mixing.fit_slow_mixing`) and their signs (:func:`~.pair_signs.choose_pair_signs`): a
    :class:`PositionalAttention` and a dict of what they measured; ``biases``: stages 1–3 behind a zero token (q/k/v
    biases, Qwen2: :func:`~.biased_start.biased_logit_start`); ``log(line)`` a line per stage and round,
    ``report()`` after each stage's queries."""
    from attnprobe.learners.positional.pair_signs import choose_pair_signs
    from attnprobe.learners.positional.polish import absent_biases
    from attnprobe.learners.positional.row_polish import chunk_precision, fresh_rows, polish_rows
    from attnprobe.learners.positional.slow_mixing import fit_slow_mixing, mixing_pairs

    report = report or (lambda: None)
    if biases:
        from attnprobe.learners.positional.biased_start import biased_logit_start

        settings = {"value_repeats": VALUE_REPEATS, "value_options": VALUE_MAP_OPTIONS, "logit_rounds": LOGIT_ROUNDS}
        model, measured = biased_logit_start(oracle, H, rng, assemble=grouped_start, settings=settings, base=base,
                                             log=log, report=report)
    else:
        model, measured = logit_start(oracle, H, rng, base=base, log=log, report=report)
    with oracle.phase("row polish", fresh=True):
        data = fresh_rows(oracle, ROW_SEQUENCES, rng, length=ROW_TOKENS)
    report()
    options = {"frequencies": measured["frequencies"] == "fitted", "cg_steps": ROW_CG_STEPS, "dense": False,
               "compute": chunk_precision(oracle.precision), "held": absent_biases(oracle), "min_gain": 0.0,
               "log": log}
    model, rep = polish_rows(model, data, rounds=ROW_ROUNDS, **options)
    model, mixing = fit_slow_mixing(model, data, mixing_pairs(model, ROW_TOKENS), compute=options["compute"],
                                    biases=biases, log=log)  # q/k biases mixed with their rows (Qwen2: 0.265 → 0.257)
    model, signs = choose_pair_signs(model, data, polish_options=options, log=log)
    return model, {**measured, "row_polish": rep.to_dict(), "slow_mixing": mixing, "pair_signs": signs}


def extract_bfloat16_rows(oracle, *, heads: int, seed=0, check=True, progress=None, base: float | None = None,
                          biases: bool = False, asked_before=None, log=None):
    """RoPE attention (``biases``: with q/k/v biases) from bfloat16 answers of an oracle serving causal rows:
    :func:`rows_start`, checked at the last position; the learners' hook then polishes it on the rows of
    :data:`FINAL_SEQUENCES` fresh sequences (``details["polish_plan"]``) and :func:`~.route.claim_verdict` holds its
    check to :data:`CLAIM`.
    ``log(line)``: a line per stage and round."""
    from attnprobe.learners.core.skeleton import Run
    from attnprobe.learners.positional.coarse import DEFAULT_BASE, worst_length_check
    from attnprobe.learners.positional.method import METHOD
    from attnprobe.learners.positional.row_polish import ROW_LENGTH

    d = oracle.d
    run = Run(oracle, METHOD, seed=seed, check=check, check_lengths=CHECK_LENGTHS, check_per_length=CHECK_PER_LENGTH,
              progress=progress, asked_before=asked_before)
    run.plan(rows_queries(d, heads, biases=biases),
             f"the positional learner on {oracle.precision} every-position rows at d={d}", at_least=True)
    model, measured = rows_start(oracle, heads, run.rng, base=base, biases=biases, log=log, report=run.report)
    K = model.outputs
    unknowns = PositionalAttention.unknowns(d, heads, measured["groups"], K // heads, K, bias=biases)
    details = {"heads": heads, "head_dim": K // heads, "route": "bfloat16 rows", "base_start": base or DEFAULT_BASE,
               "biases": biases,
               "claim": {"error": CLAIM, "norm": "worst", "cause": CLAIM_CAUSE},
               "polish_plan": {"sequences": FINAL_SEQUENCES * ROW_LENGTH,
                               "rounds": FINAL_ROUNDS_BIASES if biases else FINAL_ROUNDS,
                               "cg_steps": FINAL_CG_STEPS, "rows": True, "slow_mixing": True, "min_gain": 0.0,
                               "pair_signs": FINAL_SIGN_SEQUENCES if biases else 0,
                               "frequencies": measured["frequencies"] == "fitted"},
               **measured}
    notes = [f"{oracle.precision} every-position rows: the every-row RoPE route ("
             + ("q/k/v biases: the stages behind a token with every key and value zero, the query bias an augmented "
                "column of the logit fit, mapped back; " if biases else "")
             + "value maps from the span and the "
             f"sweep in its coordinates, logit maps from absolute logits, {ROW_ROUNDS} rounds of the row polish on "
             f"{ROW_SEQUENCES} sequences and the slow pairs' split and signs refitted on them, frequencies "
             + ("declared" if measured["frequencies"] == "declared" else
                f"from base {base or DEFAULT_BASE:g} fitted") + f"; then the row polish on {FINAL_SEQUENCES} more)"]
    return run.finish(model, unknowns=unknowns, details=details, notes=notes, check_fn=worst_length_check)


def rows_estimate(setting, H: int):
    """The every-row route's plan (:func:`~attnprobe.learners.core.estimate.estimate_queries`): the start's queries
    (one key/value group to one per head: the span's sequences grow with them; ``kv_heads`` when given), its check,
    and the hook's row polish (:data:`FINAL_SEQUENCES` and the polished model's check) unless ``polish`` is
    ``never``."""
    from attnprobe.learners.core.check import check_queries
    from attnprobe.learners.core.estimate import QueryCount

    d, groups = setting.d, setting.option("kv_heads")
    checks = check_queries(CHECK_LENGTHS, CHECK_PER_LENGTH) if setting.check else 0
    rows = setting.option("polish_sequences")  # rows, asked in sequences of 256
    polish = 0 if setting.option("polish") == "never" else (-(-rows // 256) if rows else FINAL_SEQUENCES)
    extra = polish + (checks if polish else 0)
    low, high = (rows_queries(d, H, g) + checks + extra for g in ((groups, groups) if groups else (1, H)))
    expected = rows_queries(d, H, groups or 1) + checks + extra
    return QueryCount(expected, low, high,
                      f"{setting.precision} every-position rows, the every-row route: values, the value maps' span "
                      f"and sweep, {ROW_SEQUENCES} sequences of rows for the row polish, the logit sequences, check; "
                      f"the row polish on {polish} fresh sequences of 256 rows and its check"
                      + ("" if groups else f"; key/value groups not declared (kv_heads): 1 assumed, up to {H}"))
