"""The every-row route's start for RoPE layers with q/k/v biases (Qwen2) from bfloat16 every-position rows
(docs/positional.md, "bfloat16 answers", "Qwen2 (q/k/v biases) from every-position rows").

Behind a token ``x₀`` with every group's key and value zero (:func:`~.bias_rows.biased_row_value_maps`) the layer on
``u = x − x₀`` is bias-free but for the query bias ``b' = W_Q x₀ + b_Q`` and the output constant: copies of ``x₀``
are the zero tokens the bias-free stages need. So

1. **values** — ``M``, ``c`` (:func:`~.coarse.coarse_values`);
2. **value maps** — :func:`~.bias_rows.biased_row_value_maps`: ``x₀``, then the span and the sweep on the shifted
   rows;
3. **logit maps** — :mod:`.absolute_logits` on the shifted rows, the alternating fit with the queries augmented by a
   1 (``query_bias``: ``ℓ = (W_Q u_i + b')ᵀ R(δ) W_K u_s``);
4. the model on ``u`` (the route's assembly, :func:`~.bfloat16_rows.grouped_start`, with ``b_Q = b'``) mapped back
   to ``x`` (:func:`~.bias_rows.shifted_back`: every bias moved by ``−W x₀``), for the row polish on the layer's
   own rows, which fits every bias the layer has (:func:`~.polish.fitted_names`; those it declares it lacks held at
   zero: :func:`~.polish.absent_biases`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from attnprobe.models.positional import PositionalAttention


#: :func:`~.bias_rows.neutral_token`'s settings beyond its defaults (a test shrinks the probe)
ZERO_TOKEN_OPTIONS: dict = {}


def start_behind(Wq: np.ndarray, Wk: np.ndarray, Cb: np.ndarray, Gh: np.ndarray, c0: np.ndarray, theta: np.ndarray,
                 x0: np.ndarray, *, assemble) -> PositionalAttention:
    """Stage 4 (module docstring): the layer on ``x`` from the maps read behind the zero token ``x₀`` — ``Wq (H, d_h,
    d + 1)`` (its last column the query bias ``b'``), ``Wk (G, d_h, d)``, the value split ``Cb``, ``Gh`` and ``c0``,
    what a sequence of copies of ``x₀`` answers — assembled by ``assemble(Wq, Wk, Cb, Gh, c0, theta)`` (the route's
    :func:`~.bfloat16_rows.grouped_start`) with ``b_Q = b'``, then :func:`~.bias_rows.shifted_back`."""
    from attnprobe.learners.positional.bias_rows import shifted_back

    return shifted_back(replace(assemble(Wq[..., :-1], Wk, Cb, Gh, c0, theta), bq=Wq[..., -1]), x0)


def biased_logit_start(oracle, H: int, rng: np.random.Generator, *, assemble, settings: dict,
                       base: float | None = None, log=None, report=None) -> tuple[PositionalAttention, dict]:
    """Stages 1–4 (module docstring) with the route's ``assemble`` (:func:`start_behind`) and ``settings``
    (``value_repeats``, ``value_options``, ``logit_rounds``: the every-row route's): the start (a
    :class:`PositionalAttention` with every bias) and a dict of what they measured (the zero token's probe, the
    groups, the mixing misfit, the logit samples and misfit, whether the frequencies are declared — a Hugging Face
    folder's config's — or from ``base``); ``log(line)`` a line per stage and round, ``report()`` after each stage's
    queries."""
    from attnprobe.learners.positional.absolute_logits import absolute_logit_samples, fit_logit_maps
    from attnprobe.learners.positional.bias_rows import biased_row_value_maps
    from attnprobe.learners.positional.coarse import coarse_values, split_value_maps, start_frequencies
    from attnprobe.oracles.subspace import shift_inputs

    log = log or (lambda line: None)
    report = report or (lambda: None)
    with oracle.phase("values"):
        M, c = coarse_values(oracle, rng, math.sqrt(oracle.d), repeats=settings["value_repeats"])
    with oracle.phase("value maps"):
        V, x0, measured = biased_row_value_maps(oracle, H, rng, M=M, c=c, log=log,
                                                value_options=settings["value_options"], **ZERO_TOKEN_OPTIONS)
    report()
    log(f"value maps behind the zero token: {measured['groups']} key/value groups, mixing misfit "
        f"{measured['mixing_misfit']:.1e}")
    Cb, Gh = split_value_maps(V, M)
    c0 = c + M @ x0  # what a sequence of copies of x₀ answers
    theta, source = start_frequencies(oracle, Gh.shape[1], base)
    with oracle.phase("logit maps"):
        samples = absolute_logit_samples(shift_inputs(oracle, x0, name="shifted by a zero token"), Cb, Gh, c0, rng)
    report()
    Wq, Wk, misfit = fit_logit_maps(samples, H, measured["groups"], theta, rng, rounds=settings["logit_rounds"],
                                   query_bias=True, log=log)
    return start_behind(Wq, Wk, Cb, Gh, c0, theta, x0, assemble=assemble), {
        **measured, "zero_token_norm": float(np.linalg.norm(x0)),
        "frequencies": source,
        "logit_samples": int((samples["w"] > 0).sum()), "logit_misfit": misfit}
