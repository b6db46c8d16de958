"""A joint polish of the block's attention on answers read through the block (docs/block.md, "The learner", stage 6).

After the RoPE learner and the per-head logit refit (:mod:`.refine`) the attention through a d = 128 block is
~4e-7 off, the heads' value maps and output spaces (the pair probe's finite differences of fixed-point answers)
bounding it: the block is then 2.5e-6 off at its worst length, above the 1e-6 it claims. The positional polish
(:func:`~attnprobe.learners.positional.polish.polish`: Levenberg–Marquardt on every weight and the RoPE frequencies
at once, conjugate gradients on the normal equations) fits values and logits together — the coupling a value refit
given the logits lacked (it drifted: docs/block.md, "What did not help") — to the attention oracle's last rows
(:class:`~.sublayers.AttentionThroughBlock`: ~2e-10 off) on fresh sequences of every length up to the check's
longest, the keys' rms spread below the norm's ball, the query at the oracle's rms. Each length's residuals are
weighted by its own spread (the check reads each length relative to its own). Measured (d = 32, 2/1 heads, true
FFN): 2 sequences per ⌈unknowns/d⌉ take the block's worst length from 3.5e-7 to 8.6e-8, 8 to 2.1e-8 (fewer
numbers than that leave directions the fit moves freely: trained 4e-9, fresh 4e-8); d = 128 (8/2 heads) end to end
with :data:`PER_UNKNOWNS` = 4: the attention 3.9e-7 → 3.0e-9, the block's worst length 1.8e-8 (benchmarks/block.md).
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.learners.positional.polish import PolishReport, polish
from attnprobe.models.positional import PositionalAttention

#: lengths of the polish's sequences (cycled): every length the check reads is near one
POLISH_LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: the keys' rms, uniform between these (inside the rows the attention oracle reaches, 0.98; the block's own rows
#: are of rms just below 1)
KEY_RMS = (0.7, 0.98)
#: fresh sequences per ⌈unknowns / d⌉ (the fewest whose answers hold as many numbers as the unknowns)
PER_UNKNOWNS = 4
#: Levenberg–Marquardt rounds and conjugate-gradient steps per round
ROUNDS, CG_STEPS = 3, 200
#: the arrays fitted: the weights and the RoPE frequencies (the block has no attention biases)
FITTED = ("Wq", "Wk", "Wv", "Wo", "inv_freq")


def polish_sequences(d: int, heads: int, head_dim: int, per: float = PER_UNKNOWNS) -> int:
    """Sequences of the polish for ``heads`` heads of width ``head_dim`` at model width d (one key and value map per
    head, as the logit refit leaves them): ``per`` × ⌈unknowns / d⌉."""
    unknowns = 4 * heads * head_dim * d + head_dim // 2
    return int(per * math.ceil(unknowns / d))


def polish_data(att_oracle, query_rms: float, rng: np.random.Generator, sequences: int) -> list:
    """``sequences`` random sequences, lengths cycled from :data:`POLISH_LENGTHS`, each row of rms uniform in
    :data:`KEY_RMS` but the last (the query) of rms ``query_rms``, and the attention oracle's last rows: a list of
    ``(Z (B, N, d), Y (B, d))`` per length."""
    d = att_oracle.d
    per = np.bincount(np.arange(sequences) % len(POLISH_LENGTHS), minlength=len(POLISH_LENGTHS))
    data = []
    for N, b in zip(POLISH_LENGTHS, per):
        if not b:
            continue
        Z = rng.standard_normal((int(b), N, d))
        r = rng.uniform(*KEY_RMS, size=(int(b), N, 1))
        r[:, -1] = query_rms
        Z *= r / np.sqrt(np.mean(Z * Z, axis=2, keepdims=True))
        data.append((Z, np.asarray(att_oracle(Z), dtype=np.float64)))
    return data


def polish_through_block(model: PositionalAttention, data, *, rounds: int = ROUNDS,
                         cg_steps: int = CG_STEPS) -> tuple[PositionalAttention, PolishReport]:
    """The positional polish on :data:`FITTED` (biases held), each length relative to its spread; it keeps a step
    only where the misfit falls, so the result fits ``data`` no worse than ``model``."""
    return polish(model, data, frequencies=True, rounds=rounds, cg_steps=cg_steps, only=FITTED, relative=True)
