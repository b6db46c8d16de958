"""Learners for attention whose logits depend on the offset between positions (RoPE; docs/positional.md).

Registers ``positional`` (whole output rows at the last position, float64 answers) with its options and estimate.
"""

import dataclasses

from attnprobe.learners.core.check import check_queries
from attnprobe.learners.core.estimate import QueryCount
from attnprobe.learners.core.registry import Capabilities, Option, register
from attnprobe.learners.multihead.options import HEADS
from attnprobe.learners.positional.coarse import POLISH_PER, POLISH_ROUNDS, VALUE_QUERIES, coarse_queries
from attnprobe.learners.positional.method import CLAIM_LENGTHS, CLAIM_PER_LENGTH
from attnprobe.learners.positional.rope import (BFLOAT16_ROUNDING, CHECK_LENGTHS, COARSEST, WALK, coarse_refusal,
                                               extract_positional, positional_queries)
from attnprobe.learners.positional.polish import HOOK_CG_STEPS, HOOK_ROUNDS, POLISH_SEQUENCES, POLISH_TARGET
from attnprobe.learners.positional.polish_hook import polish_queries, polish_sequences
from attnprobe.learners.positional.row_polish import chunk_precision, row_polish_plan
from attnprobe.learners.positional.start_plan import coarse_start_tokens
from attnprobe.learners.positional.route import (POLISH, POLISH_SEQUENCES_OPTION, POLISH_TARGET_OPTION, POSITION,
                                                additive_estimate, extract_any_positional)
from attnprobe.models.positional import PositionalAttention
from attnprobe.models.precision import machine_epsilon

#: queries of the pair probe's walk per ⌈K/H⌉: more span each head's output space better (docs/positional.md)
WALK_OPTION = Option("walk", int, "RoPE: queries of the pair probe's walk per ceil(K/H) (more: closer function, "
                     "up to a point)", default=WALK, low=1)


#: key/value groups (GQA) declared for the estimate's plan (the learner reads the groups from the answers)
KV_HEADS = Option("kv_heads", int, "RoPE: key/value groups (GQA) for the estimate's plan (the row polish's fitted "
                  "numbers, time and memory); the learner reads the groups from the answers and notes a mismatch",
                  low=1, metavar="G")


def _positional(oracle, *, seed, progress, heads, position="auto", walk=WALK, polish="auto",
                polish_target=POLISH_TARGET, polish_sequences=None, kv_heads=None):
    if kv_heads is not None and heads is not None and heads % kv_heads:
        from attnprobe.errors import ConfigError

        raise ConfigError(f"the {heads} heads do not split into kv_heads = {kv_heads} key/value groups",
                          param="kv_heads")
    res = extract_any_positional(oracle, heads=heads, seed=seed, progress=progress, position=position, walk=walk,
                                 polish=polish, polish_target=polish_target, polish_sequences=polish_sequences)
    if kv_heads is not None:
        found = len(set(res.details.get("kv_groups") or ())) or None
        res.notes.append(f"kv_heads = {kv_heads} declared (the estimate's plan); " +
                         (f"the learner found {found} key/value groups" if found else
                          "this route does not read the groups: its model and polish keep one key and value map "
                          "per head") +
                         (" — they differ" if found and found != kv_heads else ""))
    return res


def with_polish(count: QueryCount, setting, heads: int, bias: bool, position: str = "rope", *,
                per: float | None = None, rounds: int = HOOK_ROUNDS, checks: int | None = None) -> QueryCount:
    """``count`` with the joint polish's fresh sequences and its check (:func:`~.polish_hook.polish_queries`, for at
    most one key/value group per head): in every end with polish ``always``; in the upper end only with ``auto``
    (it polishes only when the check's error is above the target: measured, LLaMA and GPT-NeoX at d = 128 do, T5
    does not); none with ``never``. ``per``: the route's fresh sequences per ⌈unknowns/K⌉ (default the hook's);
    ``rounds``: its Levenberg–Marquardt rounds. Causal rows declared: the row polish's sequences, and its
    expected time and peak memory (:func:`~.row_polish.row_polish_plan`)."""
    mode = setting.option("polish") or "auto"
    if mode == "never":
        return count
    K = setting.outputs or setting.d
    unknowns = PositionalAttention.unknowns(setting.d, heads, setting.option("kv_heads") or heads,
                                            setting.d // heads, K, bias=bias,
                                            position=position)
    if setting.positions == "causal":
        return with_row_polish(count, setting, heads, mode,
                               setting.option("polish_sequences") or polish_sequences(unknowns, K, per or
                                                                                      POLISH_SEQUENCES), rounds)
    given = setting.option("polish_sequences")
    if checks is None:  # the polished model's check: the route's own (``checks``) or the positional one
        checks = check_queries(CHECK_LENGTHS) if setting.check else 0
    extra = polish_queries(unknowns, K, checks,
                           given or polish_sequences(unknowns, K, per or POLISH_SEQUENCES))
    fresh = f"{given} fresh sequences (given)" if given else f"fresh sequences {per or POLISH_SEQUENCES:g}·⌈unknowns/K⌉"
    always = extra if mode == "always" else 0
    return QueryCount(count.queries + always, count.low + always, count.high + extra,
                      f"{count.basis}; polish {extra} ({fresh} for up to {unknowns} unknowns, "
                      f"and its check; polish {mode}" + (": when the check's error is above the target)" if
                                                           mode == "auto" else ")"))


def with_row_polish(count: QueryCount, setting, heads: int, mode: str, rows: int, rounds: int) -> QueryCount:
    """:func:`with_polish` when the oracle answers causal rows: the hook polishes on every-position answers
    (:func:`~.polish_hook.polish_extraction`), ``rows`` of them (its count of sequences, or the ``polish_sequences``
    option, counts rows then) in sequences of :data:`~.row_polish.ROW_LENGTH` tokens, with the plan's time and
    memory for at most one key/value group per head."""
    groups = setting.option("kv_heads")
    plan = row_polish_plan(setting.d, heads, groups or heads, setting.outputs, rounds=rounds, cg_steps=HOOK_CG_STEPS,
                           rows=rows, compute=chunk_precision(setting.precision))
    extra = plan.sequences + (check_queries(CHECK_LENGTHS) if setting.check else 0)
    always = extra if mode == "always" else 0
    seconds = plan.seconds + (count.seconds or 0.0)
    peak = max(plan.peak_bytes, count.peak_bytes or 0)
    return QueryCount(count.queries + always, count.low + always, count.high + extra,
                      f"{count.basis}; polish {extra} ({plan.describe()}; "
                      + (f"{groups} key/value groups (kv_heads)" if groups else
                         "key/value groups not declared (kv_heads): one per head")
                      + f"; the victim's own time apart; and its check; polish {mode}"
                      + (": when the check's error is above the target)" if mode == "auto" else ")"),
                      seconds, peak)


def positional_estimate(setting) -> QueryCount:
    """The plan of :func:`extract_positional` (:func:`positional_queries`) plus its check on lengths up to 256."""
    H = setting.needs("heads", "a positional estimate needs the number of heads H")
    groups = setting.option("kv_heads")
    if groups is not None and H % groups:
        from attnprobe.errors import ConfigError

        raise ConfigError(f"the {H} heads do not split into kv_heads = {groups} key/value groups", param="kv_heads")
    if setting.option("position") in ("t5", "alibi"):
        return with_polish(additive_estimate(setting), setting, H, True, setting.option("position"))
    if setting.coarse:
        eps = machine_epsilon(setting.precision)
        if eps > BFLOAT16_ROUNDING:
            from attnprobe.errors import ConfigError

            raise ConfigError(f"{coarse_refusal(setting.precision, eps)}: nothing to estimate", param="precision")
        if eps > COARSEST:
            from attnprobe.errors import ConfigError
            from attnprobe.learners.positional import bfloat16

            rows = setting.positions == "causal"
            if (cause := bfloat16.bfloat16_refusal(setting.d, H, setting.outputs, rows=rows)) is not None:
                raise ConfigError(f"{cause}: nothing to estimate", param="precision")
            if bfloat16.bfloat16_refusal(setting.d, H, setting.outputs) is not None:  # the every-row route
                from attnprobe.learners.positional.bfloat16_rows import rows_estimate

                return rows_estimate(setting, H)
            checks = check_queries(CLAIM_LENGTHS, CLAIM_PER_LENGTH) if setting.check else 0
            q = bfloat16.bfloat16_queries(setting.d, H, setting.outputs) + checks
            return with_polish(QueryCount(q, q, q, f"{setting.precision} answers, the bfloat16 route: values, the "
                                                   f"zero-key sweep at {bfloat16.SWEEP_QUERIES}·d random queries, the "
                                                   "logit maps' sequences, check"),
                               dataclasses.replace(setting, positions=None), H, False,  # it polishes last positions
                               per=bfloat16.POLISH_PER, checks=checks)
        from attnprobe.learners.positional.route import PROBE_LENGTH

        checks = check_queries(CHECK_LENGTHS) if setting.check else 0
        q = coarse_queries(setting.d, H, setting.outputs) + checks
        biased = PROBE_LENGTH + coarse_queries(setting.d, H, setting.outputs, biases=True) + checks
        tokens = sum(t for _, t in coarse_start_tokens(setting.d, H, groups, setting.outputs).values())
        return with_polish(QueryCount(q, q, max(q, biased),
                                      f"{setting.precision} answers, the coarse route: values, the pair (or key) "
                                      f"probe's walk and its value maps at {VALUE_QUERIES}·d random queries (16 "
                                      f"Chebyshev steps each), the logit maps' sequences, check; the start's sequences "
                                      f"hold about "
                                      f"{tokens:.3g} tokens (the victim's time grows with them); up to {biased} with "
                                      "q/k biases (the route's probe, the key probe, the logit maps with biases)"),
                           setting, H, False, per=POLISH_PER, rounds=POLISH_ROUNDS)
    head_dim = setting.d // H
    walk = setting.option("walk") or WALK
    checks = check_queries(CHECK_LENGTHS) if setting.check else 0
    q = positional_queries(setting.d, H, head_dim, outputs=setting.outputs, walk=walk) + checks
    extra = positional_queries(setting.d, H, head_dim, outputs=setting.outputs, walk_only=True, walk=walk)
    biased = biased_route_queries(setting.d, H, head_dim, q - checks, outputs=setting.outputs, walk=walk) + checks
    return with_polish(QueryCount(q, q, max(q + extra, biased + extra),
                                  f"values 2d, the pair probe at 4 settings on walk·⌈K/H⌉ + 5 queries "
                                  f"(walk = {walk}; up to twice when steps of the walk are halved), logit "
                                  f"sketches 4d(d_h + 8) with d_h = {head_dim}, check {checks}; up to {biased} with "
                                  "q/k biases (the route's probe, a refused attempt, sketches at ±z)"), setting, H,
                       False)


def biased_route_queries(d: int, H: int, head_dim: int, bias_free: int, **kw) -> int:
    """The route's queries on RoPE with q/k biases (:func:`~.route.extract_any_positional`, the check apart): its
    probe, the attempt that refuses first (the additive plan or the bias-free plan ``bias_free``, at most), and the
    RoPE learner with ``key_bias`` (:func:`positional_queries` with ``query_bias``)."""
    from attnprobe.learners.positional.additive import additive_queries
    from attnprobe.learners.positional.route import PROBE_LENGTH

    return (PROBE_LENGTH + max(additive_queries(d, H, head_dim), bias_free)
            + positional_queries(d, H, head_dim, query_bias=True, **kw))


register("positional", _positional, recovers="positional",
         capabilities=Capabilities(vector_answers=True, fine_answers=True), estimate=positional_estimate,
         help="attention with position terms from whole output rows at the last position: RoPE (LLaMA/Mistral: "
              "rotary, GQA, no biases; per head and frequency pair W_Q, W_K up to a scaled rotation of the pair, the "
              "frequencies, V_h), T5 relative buckets and ALiBi (an additive bias: B_h, u_h, V_h, the bias per "
              "bucket or the slope)",
         options=[HEADS, POSITION, WALK_OPTION, POLISH, POLISH_TARGET_OPTION, POLISH_SEQUENCES_OPTION, KV_HEADS])

__all__ = ["extract_positional", "positional_estimate", "positional_queries"]
