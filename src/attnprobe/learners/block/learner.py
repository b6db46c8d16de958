"""``extract_block``: a pre-norm RMSNorm block (LLaMA: RMSNorm → RoPE attention → residual → RMSNorm → gated FFN →
residual, without biases) from hidden states in and every position out (docs/block.md, "The learner").

Stages (:mod:`.sublayers`): ``linear`` (``y'(0) = I + M'/√ε`` from tiny single tokens), ``eps`` (``√ε`` from two
driven-out tokens whose FFN share zero keys remove), ``ffn`` (the gated FFN learner on ``v ↦ F(w2 ⊙ v)``, one
single-token query per answer), ``attention`` (the RoPE learner with unit queries on the attention's last row,
each answer one block query with the query driven out and the FFN's share solved away, the learned FFN's error at
each distinct query measured on one single token and taken off), ``attention refit`` (each
head's logits refitted from weights read in its own coordinates, :mod:`.refine`), ``attention polish`` (every
weight and the frequencies fitted jointly to fresh sequences of every length, :mod:`.polish`). The result is a
:class:`~attnprobe.models.block.TransformerBlock` in the canonical form of
:func:`~attnprobe.models.block.fold_norm_weights`: norm weights 1, their products with the next projections
learned; ε learned. Checked at every position of fresh sequences of every length 1 … 64, held to the error it claims
(:data:`CLAIM`, the worst length's: :func:`every_position_check`).
"""

from __future__ import annotations

import functools
import math
import types

import numpy as np

from attnprobe.errors import ConfigError, RecoveryError, UnidentifiableError
from attnprobe.learners.block import post_norm_learner
from attnprobe.learners.block.levers import STEPS, rational_keys
from attnprobe.learners.block.sublayers import (MAX_RMS, AttentionThroughBlock, FFNThroughBlock, ffn_scale,
                                                first_rows, linear_part, sqrt_eps)
from attnprobe.learners.block.polish import POLISH_LENGTHS, polish_data, polish_sequences, polish_through_block
from attnprobe.learners.block.refine import refit_data, refit_logits
from attnprobe.learners.core.check import CheckResult, answer_resolution, check_verdict
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.positional.rope import OVERSAMPLE, extract_positional
from attnprobe.learners.smooth_ffn.gated_learner import extract_gated_ffn
from attnprobe.models.block import TransformerBlock
from attnprobe.models.gated_ffn import GATED_FAMILIES, GatedFFN
from attnprobe.models.positional import PositionalAttention
from attnprobe.oracles.wrappers import declared_attribute

METHOD = "block"
#: lengths of the block's functional check: every length up to the longest its claim covers (every position of
#: each compared; a check at a few lengths missed the worst, N = 21 at d = 128: docs/block.md)
CHECK_LENGTHS = tuple(range(1, 65))
CHECK_PER_LENGTH = 4
#: the error a block result claims and its check holds it to: at every checked length, the largest error at any
#: position over the largest entry of the block's own part ``y − x`` (the norm ``worst``)
CLAIM = 1e-6
#: fresh rows of the FFN's check, and the error of the FFN read first above which a failing attention stage is
#: blamed on it (a LLaMA folder at initializer_range 0.05, d = 32: the attention read through the block 7e-6 … 4e-5
#: off and refused as "not RoPE"; at 0.1, 1e-12 off, the block to 4e-8)
FFN_CHECK_ROWS, FFN_EXACT = 64, 1e-8
#: directions u of the eps stage
EPS_TOKENS = 2


def eps_queries(heads: int) -> int:
    """Queries of the eps stage: per token, ``len(STEPS)`` driven-out answers for ``L([u])`` and for each of the
    rational limit's zero-key counts."""
    return EPS_TOKENS * len(STEPS) * (1 + len(rational_keys(heads)))


def _oracle(fn, d, name):
    from attnprobe.oracles.base import Oracle

    return Oracle(fn, d, outputs=d, precision="float64", name=name)


def extract_block(oracle, *, heads: int, hidden: int | None = None, activation: str | None = None, seed=0,
                  check: bool = True, progress=None, walk: int = 1, ffn=None, attention=None, store=None):
    """Recover a pre-norm RMSNorm block with RoPE attention and a bias-free gated FFN (module docstring).
    ``heads``: the attention's H; ``hidden``: the FFN's gated units if known; ``activation``: ``swiglu``,
    ``geglu``, ``geglu_tanh`` or None (read from the answers); ``ffn``: a gated FFN already read from this block's
    FFN oracle (``v ↦ F(w2 ⊙ v)``, :class:`.sublayers.FFNThroughBlock`): the FFN stage is skipped and its queries
    are not counted here (a long run split in two); ``attention``: likewise the attention read before through this
    block's attention oracle by :func:`read_attention` (a third part: the attention and refit stages skipped)."""
    d = oracle.d
    if oracle.outputs not in (None, d):
        raise ConfigError(f"a block answers d = {d} numbers per row; this oracle answers {oracle.outputs}",
                          param="oracle")
    if activation is not None and activation not in GATED_FAMILIES:
        raise ConfigError(f"the block learner reads gated FFNs ({', '.join(GATED_FAMILIES)}); got {activation!r}",
                          param="activation")
    if ffn is not None and (not isinstance(ffn, GatedFFN) or (ffn.d, ffn.outputs) != (d, d)):
        raise ConfigError(f"ffn must be a gated FFN from d = {d} to d numbers (a block's FFN read before); got "
                          f"{type(ffn).__name__}", param="ffn")
    if attention is not None and (not isinstance(attention, PositionalAttention) or attention.d != d):
        raise ConfigError(f"attention must be a RoPE attention on d = {d} (the block's read before); got "
                          f"{type(attention).__name__}", param="attention")
    if max(oracle.eps, 1e-16) > 1e-15 or not oracle.noise.exact:
        raise UnidentifiableError(f"the block learner reads float64 answers without noise; these answers are "
                                  f"{oracle.precision} or noisy")
    longest, need = declared_attribute(oracle.fn, "max_length"), max(rational_keys(heads)) + 1
    if longest is not None and longest < need:
        raise ConfigError(f"the block learner asks sequences of {need} rows (its ε stage's zero keys); this oracle "
                          f"answers at most {longest}: serve the block with a max_length of {need} or more",
                          param="max_length")
    run = Run(oracle, METHOD, seed=seed, check=check, check_lengths=CHECK_LENGTHS,
              check_per_length=CHECK_PER_LENGTH, progress=progress)
    # m not given: the count at m = d, a lower bound for any FFN at least as wide as the block (it was m = 4d, over
    # twice what a d = 16 block of m = 2d asked, refusing budgets that sufficed)
    run.plan(block_queries(d, heads, hidden or d, walk=walk, check=False),
             f"the block learner at d={d}, H={heads}, " + (f"m={hidden}" if hidden else f"m ≥ d = {d} (not given)"),
             at_least=hidden is None)
    rows = oracle.answer_rows  # the sublayers' oracles ask through it: their queries are counted here, by phase
    with run.phase("linear"):
        zero = rows(np.zeros((1, 1, d)))[0, 0]
        said = post_norm_growth(rows, d) if np.max(np.abs(zero)) > 0 else None
        if said is None and np.max(np.abs(zero)) > 0:
            raise UnidentifiableError(f"the block answers a zero token with {np.abs(zero).max():.1e} ≠ 0: it has "
                                      "biases, which this learner (pre-norm RMSNorm, bias-free LLaMA blocks) does "
                                      "not read yet")
        if said is not None:
            post_norm_learner.too_large(d, hidden, said)
        else:
            K0 = linear_part(rows, d)
    if said is not None:
        model, unknowns, details = post_norm_learner.extract_post_norm(run, heads=heads, hidden=hidden, said=said,
                                                                       seed=seed, store=store)
        return run.finish(model, unknowns=unknowns, details=details, notes=post_norm_learner.notes(said, store),
                          check_fn=functools.partial(every_position_check, claim=post_norm_learner.CLAIM))
    with run.phase("eps"):
        s, misfit = sqrt_eps(rows, K0, run.rng, tokens=EPS_TOKENS, heads=heads)
    if not (s > 0 and misfit < 1e-4):
        raise UnidentifiableError(f"the attention's value map read on the norm's sphere does not match the one read "
                                  f"at the origin (misfit {misfit:.1e}): not a pre-norm RMSNorm block")
    eps = s * s
    M = s * (K0 - np.eye(d))
    ffn_error = None  # the FFN read first, on fresh rows (a given FFN is not checked)
    if ffn is not None:
        ffn = types.SimpleNamespace(model=ffn, queries=0, unknowns=GatedFFN.unknowns(d, ffn.m, d, bias=False))
    else:
        with run.phase("ffn", absorb=True):
            ffn_oracle = _oracle(FFNThroughBlock(rows, M, eps), d, "the block's FFN")
            ffn = extract_gated_ffn(ffn_oracle, seed=seed, activation=activation, hidden=hidden, bias=False,
                                    scale=ffn_scale(d), check=False)
        with run.phase("ffn check"):
            ffn_error = ffn_fresh_error(ffn_oracle, ffn.model, run.rng)
    att_fn = AttentionThroughBlock(rows, ffn.model, eps, d, value_map=M)
    att_oracle = _oracle(att_fn, d, "the block's attention")
    if attention is None:
        try:
            att = read_attention(run, att_oracle, att_fn.query_rms, heads, seed=seed, walk=walk)
        except (RecoveryError, UnidentifiableError) as exc:
            raise inexact_ffn(exc, ffn_error) from exc
    else:
        att = types.SimpleNamespace(model=attention, details={}, queries=0, history=[], unknowns=sum(
            np.size(getattr(attention, k)) for k in ("Wq", "Wk", "Wv", "Wo", "inv_freq")))
    with run.phase("attention polish"):
        data = polish_data(att_oracle, att_fn.query_rms, run.rng, polish_sequences(d, heads, att.model.Wq.shape[1]))
    polished, report = polish_through_block(att.model, data)
    f = ffn.model
    model = TransformerBlock(polished, f, np.ones(d), np.ones(d), norm="rms", eps=eps, layout="pre")
    details = {"eps": eps, "eps_misfit": misfit, "ffn": {"hidden": f.m, "activation": f.activation,
                                                         "queries": ffn.queries,
                                                         "fresh_error": ffn_error},
               "attention": {k: att.details[k] for k in ("heads", "head_dim", "base_estimate", "kv_groups")
                             if k in att.details} | {"queries": att.queries, "refit_residuals": att.history,
                                                     "polish": report.to_dict()},
               "claim": {"error": CLAIM, "norm": "worst",
                         "cause": "every position of every length 1 … 64, relative to the largest |y − x|"}}
    notes = [f"the stages folder {getattr(store, 'folder', '')} is not used: the pre-norm route runs in one sitting"]
    notes = notes[:store is not None] + ["norm weights folded into the next projections (W_Q, W_K, W_V and W_gate, "
                                         "W_up): only the products are identifiable; the result has norm weights 1",
                                         f"ε = {eps:.3e} read from the answers"]
    unknowns = att.unknowns + ffn.unknowns + 1
    return run.finish(model, unknowns=unknowns, details=details, notes=notes, check_fn=every_position_check)


def ffn_fresh_error(ffn_oracle, model, rng: np.random.Generator, rows: int = FFN_CHECK_ROWS) -> float:
    """The FFN read first against its oracle on fresh rows drawn as its learner drew them (``ffn_scale``
    per coordinate, inside the norm's ball): the largest error over the largest answer."""
    d = ffn_oracle.d
    V = rng.standard_normal((rows, 1, d)) * ffn_scale(d)
    V *= np.minimum(1.0, 0.97 * MAX_RMS / np.sqrt(np.mean(V * V, axis=2, keepdims=True)))
    y = np.asarray(ffn_oracle(V), dtype=np.float64).reshape(rows, d)
    p = np.asarray(model(V), dtype=np.float64).reshape(rows, d)
    return float(np.max(np.abs(y - p)) / max(np.max(np.abs(y)), 1e-300))


def inexact_ffn(exc: Exception, error: float | None) -> Exception:
    """The attention stage's refusal, with its cause when the FFN read first is not exact: the attention's oracle
    answers through that FFN (:class:`AttentionThroughBlock`) and carries its error, which the RoPE stage (built for
    float64's answers) reads as a position term it cannot fit; ``error`` None: the FFN was given, not read."""
    if error is None or not error > FFN_EXACT:
        return exc
    return type(exc)(f"the block's attention could not be read through its FFN, which was read first only "
                     f"{error:.1e} close on fresh rows (above {FFN_EXACT:.0e}: small pre-activations leave a smooth "
                     f"FFN nearly polynomial, its units poorly told apart); the attention's answers carry that "
                     f"error, and its RoPE stage then failed: {exc}")


def read_attention(run, att_oracle, query_rms: float, heads: int, *, seed=0, walk: int = 1):
    """The attention stages on the block's attention oracle: the RoPE learner with every query at ``query_rms``, then
    each head's logits refitted (:mod:`.refine`). Returns the learner's result with ``model`` the refitted attention
    and ``history`` the refit's residuals."""
    with run.phase("attention", absorb=True):
        att = extract_positional(att_oracle, heads=heads, seed=seed, check=False, walk=walk, query_rms=query_rms)
    with run.phase("attention refit"):
        data = refit_data(att_oracle, query_rms, att.model.Wq.shape[1], run.rng, REFIT_PER_D * att_oracle.d)
    att.model, att.history = refit_logits(att.model, data)
    return att


#: the growth probe of :func:`post_norm_growth`: a token and this multiple of it
GROWTH = 1e3


def post_norm_growth(answer_rows, d: int) -> str | None:
    """How a post-norm block (BERT: ``y = n2(h + F(h))``, ``h = n1(x + A(x))``) is told apart, or None for a
    residual block: its answers stay on the output LayerNorm's surface however large the input, where a residual
    block's grow with it (two single tokens, ``u`` and :data:`GROWTH`·u). The pre-norm route does not carry over
    (the FFN is reachable only on n1's output surface and answers only up to n2's per-row scale and shift): such a
    block goes to :mod:`.post_norm_learner` (docs/block.md)."""
    u = np.random.default_rng(0).standard_normal(d)
    y = first_rows(answer_rows, np.stack([u, GROWTH * u])[:, None, :])
    ratio = float(np.linalg.norm(y[1]) / np.linalg.norm(y[0]))
    if ratio < GROWTH / 30:
        return (f"a post-norm block (its answers stay bounded: a token scaled by {GROWTH:.0e} moves the answer's "
                f"norm by ×{ratio:.2f})")
    return None


#: sequences of the attention's logit refit per model width (:func:`.refine.refit_data`)
REFIT_PER_D = 8
def every_position_check(oracle, model, rng, lengths, per_length, *, claim: float = CLAIM) -> CheckResult:
    """Every row of ``per_length`` fresh N(0, 1) sequences at each length against the model's: per length the
    largest ``|ŷ − y|`` over the largest ``|y − x|`` (the block's own part: the residual removed, so the identity
    cannot hide an error), and the worst length's. ``passed`` only when that is within :data:`CLAIM` by more than
    the answers' resolution (:func:`~attnprobe.learners.core.check.check_verdict`; ``claim``: a post-norm result's
    :data:`.post_norm_learner.CLAIM`): the error a result claims, not
    the learner's tolerance, and not an average over lengths or positions (a NaN fails)."""
    before, d = oracle.queries, oracle.d
    per, resolution = {}, 0.0
    for N in lengths:
        X = rng.standard_normal((per_length, N, d))
        y = np.asarray(oracle.answer_rows(X), dtype=np.float64)
        signal = float(np.max(np.abs(y - X)))
        per[int(N)] = float(np.max(np.abs(np.asarray(model.every_position(X), dtype=np.float64) - y))) / signal
        resolution = max(resolution, answer_resolution(oracle, float(np.max(np.abs(y))), signal))
    errors = np.array(list(per.values()))
    worst = float(np.max(errors))  # NaN propagates: a model answering NaN anywhere fails
    verdict = check_verdict(worst, claim, resolution)
    return CheckResult(passed=verdict == "passed", error=worst, tolerance=claim, queries=oracle.queries - before,
                       lengths=tuple(map(int, lengths)), per_length=per,
                       extra={"per_length_count": per_length, "measured_on": "every position, y - x",
                              "norm": "worst", "worst_length": int(list(per)[int(np.nanargmax(errors))])
                              if np.isfinite(errors).any() else None,
                              "resolution": resolution, "verdict": verdict})


def calibration_queries(d: int, H: int, *, walk: int = 1) -> int:
    """Single tokens the attention oracle asks to measure the learned FFN's error at each distinct query row
    (:class:`~.sublayers.AttentionThroughBlock`): the pair probe's first query and walk, the logits stage's
    calibration, query basis and random queries, and one per refit sequence (the values stage's single tokens are
    their own; a halved walk step asks one more)."""
    return 1 + walk * math.ceil(d / H) + 4 + 8 + d + max(2, d // H) + OVERSAMPLE + REFIT_PER_D * d


def polish_queries(d: int, H: int) -> int:
    """Queries of the attention polish (:mod:`.polish`): each sequence once and its query row once as a single token
    (the learned FFN's error there, :class:`~.sublayers.AttentionThroughBlock`), a length-1 sequence being its own."""
    n = polish_sequences(d, H, d // H)
    ones = len(range(0, n, len(POLISH_LENGTHS)))  # sequences of length POLISH_LENGTHS[0] = 1
    return 2 * n - ones


def block_queries(d: int, H: int, m: int, *, walk: int = 1, check: bool = True) -> int:
    """Queries of :func:`extract_block` with the FFN's width m given: 1 + 6d (linear) + the eps stage's + the gated
    learner's plan and its fresh rows + the unit-query RoPE learner's plan + the check."""
    from attnprobe.learners.positional.rope import positional_queries
    from attnprobe.learners.smooth_ffn.gated_learner import gated_plan

    n = 1 + 6 * d + eps_queries(H) + sum(gated_plan(d, d, m).values()) + FFN_CHECK_ROWS
    n += positional_queries(d, H, max(2, d // H), outputs=d, walk=walk)
    n += REFIT_PER_D * d + calibration_queries(d, H, walk=walk) + polish_queries(d, H)
    return n + (len(CHECK_LENGTHS) * CHECK_PER_LENGTH if check else 0)
