"""The bias-free coarse RoPE start's plan in tokens (docs/positional.md, "The start at LLaMA-3-8B's size"): a
victim's time grows with the tokens it reads (every token is projected to its query, key and value: about
``d·(H + 2G)·d_h + H·d_h·K`` multiply–adds), not with the number of sequences, and the start's sequences are short
probes (2 … 18 tokens) and logit sequences of ``1 − min(LOGIT_OFFSETS)`` tokens, mostly zeros. Asks nothing.
"""

from __future__ import annotations

import math

from attnprobe.learners.positional import coarse
from attnprobe.learners.positional.logit_samples import LOGIT_OFFSETS, SAMPLES_PER_ENTRY, kept_offsets
from attnprobe.learners.positional.token_scale import PAIRS as TOKEN_PAIRS

#: the token-scale probe's sequences (the walk's stage) and the logit sequences' length
SCALE_PROBES, LOGIT_LENGTH = 16, 1 - min(LOGIT_OFFSETS)


def coarse_start_tokens(d: int, heads: int, kv_heads: int | None = None, outputs: int | None = None, *,
                        walk: int = 1, per: int = coarse.VALUE_QUERIES, row_space: bool = False,
                        key: bool | None = None) -> dict:
    """Each stage of :func:`~.coarse.coarse_start` with the key probe (heads sharing keys and values,
    ``kv_heads`` groups: ``M`` of rank ``G·d_h``) or the pair probe (no kernel): ``{stage: (queries, tokens)}``
    for ``values`` (and the logits' size probe),
    ``walk`` (with the token-scale probe), ``value maps`` (``per·d`` random queries, ``per·G·d_h``
    with ``row_space``) and ``logit maps`` (:func:`~.coarse.logit_settings`). ``key``: the heads' probe (default
    :func:`~.coarse.key_probe_kernel`'s choice). The walk's halved steps apart."""
    K = outputs or d
    dh = K // heads
    rank = (kv_heads or heads) * dh
    if key is None:  # coarse.key_probe_kernel's default choice
        key = rank < d and dh * d > coarse.DENSE_ALS
    settings = coarse.KEY_SETTINGS if key else coarse.SETTINGS
    base = 2 if key else 3  # the key probe: [zeros, ηe, z]; the pair probe: [zeros, −ηe, ηe, z]
    per_direction = 2 * coarse.NODES * len(settings)
    tokens_per_direction = 2 * coarse.NODES * sum(base + zeros for _, zeros in settings)
    first = min(d - rank if key else d, 2 * heads + 8)
    directions = first + (heads + 4) * (walk * math.ceil(K / heads) + 4)
    queries = per * (rank if row_space else d)
    m = len(kept_offsets(LOGIT_OFFSETS, dh))
    extra = coarse.logit_settings(d, dh).get("extra", 16)
    sets = math.ceil((dh + extra) / m)
    logits = 2 * sets * (d + extra) + SAMPLES_PER_ENTRY * dh * dh
    values = 2 * d * coarse.VALUE_REPEATS  # and the logits' size probe: two-token sequences
    return {"values": (values + TOKEN_PAIRS, values + 2 * TOKEN_PAIRS),
            "walk": (per_direction * directions + SCALE_PROBES,
                     tokens_per_direction * directions + SCALE_PROBES * LOGIT_LENGTH),
            "value maps": (per_direction * (heads + 4) * queries, tokens_per_direction * (heads + 4) * queries),
            "logit maps": (logits, logits * LOGIT_LENGTH)}


def victim_macs_per_token(d: int, heads: int, kv_heads: int | None = None, outputs: int | None = None) -> int:
    """Multiply–adds a RoPE attention layer spends on one token's projections (query, key, value, output)."""
    K = outputs or d
    dh = K // heads
    return d * (heads + 2 * (kv_heads or heads)) * dh + heads * dh * K


def row_logit_tokens(d: int, heads: int, per: float = 16, margin: int = 8) -> tuple[int, int]:
    """``(sequences, tokens)`` of :func:`~.row_logits.row_logit_maps` at ``per·d`` tokens in sequences of
    ``d_h − margin`` (every row of each answered: the logit stage's plan when the value maps come from
    :mod:`.value_span`)."""
    length = d // heads - margin
    sequences = math.ceil(per * d / length)
    return sequences, sequences * length
