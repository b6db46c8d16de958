"""RoPE attention from bfloat16 answers (LLaMA, Mistral: no biases): a start from the zero-key sweep, then the
joint polish on many fresh answers (docs/positional.md, "bfloat16 answers").

bfloat16 rounds every answer to ~2⁻⁹ of its size, where the float32 route's pair probe (:mod:`.coarse`) finds its
signal: its heads do not separate. Here

1. **values** — ``M``, ``c`` from one-token sequences, averaged over ``VALUE_REPEATS·2d`` of them;
2. **value maps** — :func:`~.sweep.sweep_value_maps`: each head's share of the answer as the number of zero keys
   grows (each head's ``V_h`` at bfloat16's rounding of its weights, d = 32); for more than two heads twelve
   query blocks and each head's output space from ``3·d_h`` random queries (:func:`sweep_spaces`);
3. **logit maps** — :func:`~.coarse.logit_maps` (log-weights in each head's coordinates) with ``LOGIT_EXTRA·d``
   more sequences per regression and ``d_h + 8`` fixed queries for the key maps' row spaces (its float32 defaults
   leave them 0.4 … 0.99 off here; with these the start is 3.8e-2 from the module at d = 32);
4. **polish** — the learners' hook on ``POLISH_PER·⌈unknowns/K⌉`` fresh sequences (bfloat16 overfits 400
   sequences at d = 128: 2.8e-2; 2,000 give 9.5e-3 from a start 2.5e-3 … 2.5e-2 off).

More than two heads, or heads with ``d_h·d`` above :data:`~.coarse.DENSE_ALS` (LLaMA d = 128, 8/2), are read by the
every-row route (:mod:`.bfloat16_rows`) when the oracle serves every row, else refused before any query, in one line
naming the cause (:func:`bfloat16_refusal`). The result's check must come within
:data:`CLAIM` of the answers (the issue's 3e-2 of the float64 module, less the served layer's own distance), else
the route refuses naming the precision (:func:`~.route.claim_verdict`).
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.errors import RecoveryError
from attnprobe.models.positional import PositionalAttention, rope_frequencies

#: one-token sequences per input dimension and sign in the values stage (bfloat16: 4× the float32 route's)
VALUE_REPEATS = 16
#: independent random queries per input dimension at which the sweep reads the value maps (two heads)
SWEEP_QUERIES = 6
#: more heads: random queries per head dimension at which the sweep reads each head's output space instead
#: (:func:`~.sweep.output_spaces`; d = 64, 4/1 heads: each V_h 2.6 … 3.5 % off from 3·d_h = 48 queries)
SPACE_QUERIES = 3
#: the logit maps' regressions: LOGIT_EXTRA·d sequences beyond d each (d + 16 leaves W_Q's row space 0.4 … 0.67
#: off at d = 32 from bfloat16 answers, d + 256 0.055; the key sets grow with it: ⌈(d_h + LOGIT_EXTRA·d)/9⌉)
LOGIT_EXTRA = 8
#: the polish: fresh sequences per ⌈unknowns/K⌉ and rounds (d = 128, 8/2 heads: 2,000 sequences ≈ 6.2×)
POLISH_PER, POLISH_ROUNDS = 8, 6
#: the relative check error (the worst length's, over lengths 1 … 256, against the answers: the coarse route's
#: :func:`~.coarse.worst_length_check`) the route claims: a result above it is refused. The served bfloat16
#: LLaMA layer is 8.1e-3 off its float64 module (docs/benchmarks/positional-precision.md)
CLAIM = 2e-2
#: why a result above the claim is refused (the verdict's one line)
CLAIM_CAUSE = ("the zero-key sweep reads the value maps, but the logit maps from bfloat16 log-weights start outside "
               "the polish's reach; docs/positional.md, \"bfloat16 answers\"")


def bfloat16_refusal(d: int, H: int, outputs: int | None = None, *, rows: bool = False) -> str | None:
    """The one-line cause why the bfloat16 routes do not read ``H`` heads of width ``d_h`` at width ``d``, or
    ``None`` where one runs: this route up to two heads with ``d_h·d`` at most :data:`~.coarse.DENSE_ALS`, the
    every-row route (:mod:`.bfloat16_rows`) for the others when the oracle serves every row (``rows``). Measured
    (docs/positional.md, "bfloat16 answers"): more than two heads — the sweep at the last position reads each value
    map through its output space only ~3 % close (d = 64, 4/1), and log-weights read through maps 3 % off start the
    logit maps 0.23 off (d = 32), three times the start the polish was measured to bring in (7.7e-2 at d = 128);
    wider heads — the logit maps' regressions need ~10⁵ sequences (row spaces 0.17 … 0.32 off from 18,944 at
    d = 128) and their alternating refinement ~10¹² operations a round. Every-position rows read both (the value
    maps within 8.0e-3 at d = 128, 8/2; :mod:`.bfloat16_rows`)."""
    from attnprobe.learners.positional.coarse import DENSE_ALS

    dh = (outputs or d) // H
    causes = ([f"for {H} heads (more than two) no start from last-position answers comes within the polish's reach "
               "(the zero-key sweep reads each head's value map only ~3 % close)"] if H > 2 else [])
    if dh * d > DENSE_ALS:
        causes.append(f"at d_h·d = {dh * d} (above {DENSE_ALS}) the logit maps from bfloat16 log-weights need ~10⁵ "
                      "sequences")
    if not causes or rows:
        return None
    return (f"bfloat16 answers: {'; '.join(causes)}; the every-row route reads such layers from every-position rows, "
            "but this oracle answers the last position only (a Hugging Face layer serves every row on request: "
            "every_position); not recovered at bfloat16 (docs/positional.md, \"bfloat16 answers\")")


def biased_refusal(precision: str) -> str:
    """The one-line cause why last-position answers at ``precision`` (bfloat16) from a layer declaring q/k biases
    are not read (the reader appends :data:`~.bias_rows.ROWS_RESULT`, what the every-row route with biases
    measured): the route with biases (:func:`~.bfloat16_rows.extract_bfloat16_rows` with ``biases``) reads every
    row, and this oracle answers the last position only."""
    return (f"these answers are {precision} and the layer's queries and keys carry biases (its family's config): the "
            "last-position route's zero-key sweep reads bias-free heads only (a key bias gives zero keys a logit, a "
            "value bias a value); q/k biases at this precision need every-position rows (a Hugging Face layer serves "
            "them on request: every_position), and this oracle answers the last position only; ")


def sweep_spaces(H: int) -> int | None:
    """How the sweep reads the value maps for ``H`` heads: ``None`` (the map ``z ↦ V_h z`` at ``per·d`` queries)
    up to two heads, else :data:`SPACE_QUERIES` (each head's output space; the sweep's twelve blocks)."""
    return None if H <= 2 else SPACE_QUERIES


def bfloat16_queries(d: int, H: int, outputs: int | None = None, *, per: int = SWEEP_QUERIES) -> int:
    """Queries :func:`bfloat16_start` asks: values, the sweep's walk and random queries, the logit maps'
    sequences (:func:`~.coarse.coarse_queries`' count of them)."""
    from attnprobe.learners.positional.coarse import logit_map_queries
    from attnprobe.learners.positional.sweep import sweep_queries

    K = outputs or d
    dh = K // H
    return (2 * d * VALUE_REPEATS + sweep_queries(d, H, K, per=per, spaces=sweep_spaces(H)) + 16
            + logit_map_queries(d, dh, extra=LOGIT_EXTRA * d, query_sets=dh + 8))


def bfloat16_start(oracle, H: int, rng: np.random.Generator, *, base: float | None = None,
                   per: int = SWEEP_QUERIES):
    """A start for the polish from bfloat16 answers (module docstring, stages 1–3): a
    :class:`PositionalAttention` and a dict of what the stages measured."""
    from attnprobe.learners.positional.coarse import (DEFAULT_BASE, LOGIT_OFFSETS, TARGET_LOGIT, coarse_values,
                                                      log_weights, logit_maps, split_value_maps)
    from attnprobe.learners.positional.sweep import sweep_value_maps

    d = oracle.d
    M, c = coarse_values(oracle, rng, math.sqrt(d), repeats=VALUE_REPEATS)
    if M.shape[0] % H:
        raise RecoveryError(f"the output row (K = {M.shape[0]}) does not split into {H} heads of equal width")
    V, misfit = sweep_value_maps(oracle, c, H, rng, per=per, M=M, spaces=sweep_spaces(H))
    Cb, G = split_value_maps(V, M)
    probe = rng.standard_normal((16, len(LOGIT_OFFSETS) + 1, d))  # the logits' size at unit tokens
    ell = log_weights(oracle, Cb, G, c, probe, np.tile(LOGIT_OFFSETS, (16, 1)), -min(LOGIT_OFFSETS))
    med = max(float(np.nanmedian(np.abs(ell))), 1e-12)
    scale = float(np.clip(math.sqrt(TARGET_LOGIT / med), 1e-3, 1e3))
    theta = rope_frequencies(G.shape[1], base or DEFAULT_BASE)
    dh = G.shape[1]
    Wq, Wk, count = logit_maps(oracle, rng, Cb, G, c, theta, scale, extra=LOGIT_EXTRA * d, query_sets=dh + 8)
    model = PositionalAttention(Wq, Wk, G, Cb, bo=c, position="rope", inv_freq=theta, layout="half", scale=1.0,
                                causal=True)
    return model, {"sweep_misfit": misfit, "logit_sequences": count, "token_scale": scale}


def extract_bfloat16_positional(oracle, *, heads, seed=0, check=True, progress=None, base: float | None = None,
                                per: int = SWEEP_QUERIES, asked_before=None):
    """RoPE attention (no biases) from bfloat16 answers at the last position: :func:`bfloat16_start`, checked; the
    learners' hook (:func:`~.polish_hook.polish_extraction`) polishes it on ``POLISH_PER·⌈unknowns/K⌉`` fresh answers
    and :func:`~.route.claim_verdict` then holds its check to :data:`CLAIM`. Needs the number of heads. More than
    two heads, wide heads and layers declaring q/k biases (Qwen2) go to the every-row route
    (:func:`~.bfloat16_rows.extract_bfloat16_rows`, ``biases`` where declared) when the oracle serves every row, and
    are refused in one line before any query when it does not."""
    from attnprobe.errors import ConfigError, UnidentifiableError
    from attnprobe.learners.core.skeleton import Run
    from attnprobe.learners.positional.bias_rows import ROWS_RESULT
    from attnprobe.learners.positional.coarse import DEFAULT_BASE, worst_length_check
    from attnprobe.learners.positional.method import CLAIM_LENGTHS, CLAIM_PER_LENGTH, METHOD
    from attnprobe.learners.positional.polish_hook import serves_causal_rows
    from attnprobe.oracles.wrappers import declared_attribute

    biased = bool(declared_attribute(oracle.fn, "qk_biases"))
    if biased and not serves_causal_rows(oracle):  # every row is read by the route with biases
        raise UnidentifiableError(biased_refusal(oracle.precision) + ROWS_RESULT
                                  + " (docs/positional.md, \"The every-row route with biases\")")
    if heads is None:
        heads = declared_attribute(oracle.fn, "heads", accept=lambda v: isinstance(v, int) and v >= 1)
    if heads is None:
        raise ConfigError(f"the RoPE route for {oracle.precision} answers needs the number of heads", param="heads")
    d = oracle.d
    if biased or bfloat16_refusal(d, heads, oracle.outputs) is not None:  # q/k biases, more heads, wide ones
        from attnprobe.learners.positional.bfloat16_rows import extract_bfloat16_rows

        rows = serves_causal_rows(oracle)
        if (cause := bfloat16_refusal(d, heads, oracle.outputs, rows=rows)) is not None:
            raise UnidentifiableError(cause)
        return extract_bfloat16_rows(oracle, heads=heads, seed=seed, check=check, progress=progress, base=base,
                                     biases=biased, asked_before=asked_before)
    run = Run(oracle, METHOD, seed=seed, check=check, check_lengths=CLAIM_LENGTHS, check_per_length=CLAIM_PER_LENGTH,
              progress=progress, asked_before=asked_before)  # every length: the statistic its claim bounds
    run.plan(bfloat16_queries(d, heads, oracle.outputs, per=per),
             f"the positional learner on {oracle.precision} answers at d={d}", at_least=True)
    with run.phase("bfloat16 start"):
        model, measured = bfloat16_start(oracle, heads, run.rng, base=base, per=per)
    run.report()
    K = model.outputs
    unknowns = PositionalAttention.unknowns(d, heads, heads, K // heads, K)
    details = {"heads": heads, "head_dim": K // heads, "route": "bfloat16", "base_start": base or DEFAULT_BASE,
               "claim": {"error": CLAIM, "norm": "worst", "cause": CLAIM_CAUSE},
               "polish_plan": {"sequences": POLISH_PER * math.ceil(unknowns / K), "rounds": POLISH_ROUNDS,
                               "rows": False},
               **measured}
    notes = [f"{oracle.precision} answers: the bfloat16 RoPE route (value maps from the zero-key sweep at {per}·d "
             f"random queries, logit maps from log-weights, frequencies from base {base or DEFAULT_BASE:g}, fitted by "
             "the polish)"]
    return run.finish(model, unknowns=unknowns, details=details, notes=notes, check_fn=worst_length_check)
