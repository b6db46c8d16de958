"""Generic (overlapping, non-orthogonal) heads of a multi-head layer from value queries (docs/multihead-generic.md).

``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ(X v_h) + c``; for a last token y and probe z,
``F_y(z) = f([y + z; y]) − f([y; y]) = Σ_h σ(zᵀp_h)·zᵀv_h`` with ``p_h = W_h y + u_h`` (App. C's two-row form).

1. **values** — length-1 queries give ``Σ_h v_h`` and c; on a saturated half circle F is exactly linear per
   cone and jumps by ``±v_h`` at each head's hyperplane (``saturation.py``): every ``v_h`` and H.
2. **isolated** — with the ``v_h`` known, head h alone is a single-head oracle for ``(P_h W_h, P_h v_h, P_h u_h)``,
   ``P_h`` the projector onto ``{v_g : g ≠ h}^⊥`` (``isolation.py``); the low-rank learner (Sec. 5) recovers it
   with ``≈ 2dr`` queries (r: the head dimension, detected or given).
3. **cross** — the rest of ``W_h, u_h`` (along the other heads' value vectors), with every other head switched
   off by saturation (``cross.py``): ``H(r + 1)`` probes per head, twice (the repeat certifies the switch-off).

4. **check** — the functional check, and every head measured alone with the others switched off
   (``headcheck.py``): "passed" bounds each head's W and v error, not only the layer's output.

Heads whose ``(W_h, u_h)`` coincide (Prop. 7.1) cross their hyperplanes together and come back as one head with
the summed value vector: the same function, said in a note. A head with ``v_h = 0`` contributes nothing and is
not found. Needs ``d ≥ 2H`` (room for the switch-off probe of the cross stage). Answers too coarse for the
saturated probes (float32, noise) are refused naming the precision and the value error it left.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from attnprobe.errors import RecoveryError, SaturationError, UnidentifiableError
from attnprobe.learners.head import RANK
from attnprobe.learners.head.exact import learn_value
from attnprobe.learners.head.lowrank import FLOAT32_OVERSAMPLE, default_oversample, extract_lowrank, lowrank_queries
from attnprobe.learners.multihead.cross import cross_components
from attnprobe.learners.multihead.headcheck import check_heads, head_check_queries
from attnprobe.learners.multihead.isolation import isolated_oracle
from attnprobe.learners.multihead.options import HEADS, MAX_HEADS
from attnprobe.learners.multihead.saturation import input_norm_limit, saturated_values
from attnprobe.learners.core.skeleton import Run
from attnprobe.models.precision import machine_epsilon

METHOD = "multihead-generic"
#: the other heads leak into an isolated head through the errors of v̂ (relative size ``ValueStage.leak``); the
#: isolated learner counts that leak as rounding up to this level (measured: float64 MiniLM leaks 4e-12 … 2.4e-10
#: and rank detection then finds 32 per head; floors of 1e-6 … 1e-4 on float32 answers made its saturation
#: thresholds reject good probes and 5 of 9 random float32 layers fail, docs/multihead-generic.md)
LEAK_FLOOR_CAP = 1e-8
#: value vectors measured worse than this (relative, the values stage's own bound) are refused: every isolated head
#: then carries the other heads' leak of that size (measured: random float32 layers whose bound was 5e-4 … 2e-3
#: came out with heads 2.3e-3 … 5e-3 off; float32 MiniLM layers measure 7e-4 … 0.3)
VALUE_ERROR_LIMIT = 1e-3


def planned_rest(d, H, rank, bias):
    """Queries of the isolated and cross stages (no calibration or retries): a lower bound."""
    r = min(rank or d - H + 1, d - H + 1)
    return H * (lowrank_queries(d, r, 0, 0 if rank else 2, bias) + 2 * H * (min(r, d) + 1))


def planned_values(d):
    """The least the values stage costs (one head): length-1 queries, one radius step and its confirmation (12
    each), the labelled grid (24) and two cone gradients (2d + 2 each); the crossing search comes on top."""
    return (d + 1) + 12 + 12 + 24 + 2 * (2 * d + 2)


def _coarse(oracle, value_error=None) -> bool:
    """Answers coarser than float64 rounding, declared noisy, or value vectors measured no better than 1e-8."""
    return oracle.eps > 1e-13 or not oracle.noise.exact or (value_error is not None and value_error > 1e-8)


def precision_said(oracle, value_error=None) -> str:
    """One phrase naming the answers' precision and noise as measured or declared."""
    noise = oracle.noise
    said = f"{oracle.precision} answers (machine epsilon {oracle.eps:.1e})"
    if not noise.exact:
        said += f", declared noise: relative {noise.rel_eps:.1e}, absolute {noise.tolerance:.1e}, σ {noise.sigma:.1e}"
    if value_error is not None:
        said += f"; the saturated probes measured the value vectors only to {value_error:.1e} (relative)"
    return said


@contextmanager
def _blamed_on_precision(oracle, stage: str, value_error=None):
    """A stage that fails on coarse answers fails because of them: say so instead of the stage's guess."""
    try:
        yield
    except (RecoveryError, SaturationError, UnidentifiableError) as exc:
        if not _coarse(oracle, value_error) or getattr(exc, "cause_named", False):
            raise
        raise precision_error(f"the answers are too coarse for the generic multi-head learner: "
                              f"{precision_said(oracle, value_error)}; its {stage} stage could not separate the heads "
                              f"({type(exc).__name__}). The saturated probes need float64 answers without noise; "
                              "declare the precision if it is known") from exc


def precision_error(message: str) -> RecoveryError:
    """A refusal whose cause is the answers' precision (``cause_named``: no other learner is tried)."""
    err = RecoveryError(message)
    err.cause_named = True
    return err


def _heads_found(H, d, heads, max_heads, notes):
    """Refuse what cannot be right; say what cannot be told apart (Prop. 7.1), always."""
    if heads is not None and H > heads:
        raise UnidentifiableError(f"found {H} heads (hyperplane crossings of the saturated probe) but heads={heads} "
                                  "was given; omit heads to keep all of them")
    if max_heads is not None and H > max_heads:
        raise UnidentifiableError(f"found {H} heads, more than max_heads = {max_heads}; raise max_heads")
    if 2 * H > d:
        raise UnidentifiableError(f"found {H} heads at width d = {d}: switching the other heads off needs d ≥ 2H")
    tied = ("heads with equal (W_h, u_h) attend identically (Prop. 7.1) and cannot be told apart from queries; they "
            "merge into one head whose value vector is their sum, which computes the same function (heads with "
            "v_h = 0 contribute nothing and are not found either)")
    if heads is not None and H < heads:
        notes.append(f"found {H} heads where {heads} were given: {tied}")
    elif heads is None:
        notes.append(f"found {H} heads: the number of distinct attention patterns; {tied}, so the layer may have "
                     "more heads than found")


def _isolated(run, stage, rank, bias):
    """Stage 2: every head alone through :func:`isolated_oracle`, sketched by the low-rank learner."""
    oracle, v, rng = run.oracle, stage.v, run.rng
    H, d = v.shape
    v_sum = stage.gradients[-1] + stage.gradients[0]
    WP, uP, ranks = np.empty((H, d, d)), np.empty((H, d)), []
    for h in range(H):
        iso = isolated_oracle(oracle, v, h, v_sum)
        iso.eps_floor = max(iso.eps_floor, oracle.eps_floor, min(stage.leak, LEAK_FLOOR_CAP))  # the leak: rounding
        r_h = None if rank is None else min(int(rank), d - H + 1)
        # oversampling averages the answers' rounding and noise: chosen for them, not for the leak floor
        over = default_oversample(oracle) if stage.details["measured_noise"] is None else FLOAT32_OVERSAMPLE
        res = extract_lowrank(iso, rank=r_h, oversample=over, bias=bias,
                              seed=int(rng.integers(2**31)), check=False, certificate=0)
        P = iso.fn.P
        WP[h] = P @ res.model.W
        uP[h] = P @ res.model.u
        ranks.append(int(res.details.get("detected_rank", d)))
        run.report()
    return WP, uP, ranks


def _numerical_ranks(W: np.ndarray, rel: float) -> list[int]:
    """Rank of each returned W_h: singular values above ``rel`` of the largest."""
    s = np.linalg.svd(W, compute_uv=False)
    return [int(np.sum(si > rel * si[0])) if si[0] > 0 else 0 for si in s]


def extract_generic(oracle, *, heads=None, max_heads=None, rank=None, bias=True, seed=0, check=True, progress=None,
                    asked_before=None):
    """Recover every head ``(W_h, v_h, u_h)`` and ``c`` of a multi-head oracle (module docstring).

    ``heads``: the number of heads if known (fewer found means merged heads: a note); ``max_heads``: refuse
    more; ``rank``: the head dimension (rank of each ``W_h``), detected when omitted; ``asked_before``: queries this
    extraction asked before this learner, by phase (:class:`~attnprobe.learners.core.skeleton.Run`). Returns an
    :class:`~attnprobe.learners.core.result.Extraction` with a :class:`MultiHeadAttention` (heads up to permutation).
    """
    from attnprobe.models.multihead import MultiHeadAttention

    d = oracle.d
    heads, max_heads, rank = HEADS.validate(heads), MAX_HEADS.validate(max_heads), RANK.validate(rank)
    if heads is not None and 2 * heads > d:
        raise UnidentifiableError(f"{heads} heads at width d = {d}: switching the other heads off needs d ≥ 2H "
                                  f"(at most {d // 2} heads)")
    input_norm_limit(oracle, precision=False)  # refused before any query when max_input_norm is too small
    run = Run(oracle, METHOD, seed=seed, check=check, progress=progress, asked_before=asked_before)
    rng = run.rng
    notes: list[str] = []
    run.plan(planned_values(d), f"generic multi-head extraction at d={d} (values stage)", at_least=True)
    with run.phase("values", absorb=True), _blamed_on_precision(oracle, "values"):  # absorb: the input-bound check
        v_sum, c, _ = learn_value(oracle, bias, "multi-head")  # length 1: [0] ↦ c, [e_i] ↦ (Σ_h v_h)_i + c
        y = rng.standard_normal(d) / np.sqrt(d)
        stage = saturated_values(oracle, y, v_sum, c + y @ v_sum, rng, max_crossings=heads or max_heads)
    H, verr = stage.v.shape[0], stage.details["value_error"]
    _heads_found(H, d, heads, max_heads, notes)
    if stage.details["measured_noise"] is not None:
        alone = machine_epsilon(oracle.precision)
        notes.append(f"the answers carry relative noise of about {stage.details['measured_noise']:.1e} (measured on "
                     f"the saturated probes; {oracle.precision} rounding alone is {alone:.0e}): used as their "
                     "rounding floor, and by the check's tolerance")
    if verr > VALUE_ERROR_LIMIT:
        raise precision_error(f"the answers are too coarse for the generic multi-head learner: "
                              f"{precision_said(oracle, verr)} (> {VALUE_ERROR_LIMIT:.0e}): every isolated head would "
                              f"carry the other heads' leak of that size; refused after {run.queries} queries")
    rest = planned_rest(d, H, rank, bias) + (head_check_queries(H) if check else 0)
    run.plan(rest, f"generic multi-head extraction at d={d}, H={H} (isolated and cross stages, per-head check)",
             at_least=True)
    run.report(run.queries + rest)
    with run.phase("isolated"), _blamed_on_precision(oracle, "isolated-head", verr):
        WP, uP, head_rank = _isolated(run, stage, rank, bias)
    with run.phase("cross"), _blamed_on_precision(oracle, "cross", verr):
        Wx, ux, info = cross_components(oracle, stage.v, v_sum, c, WP, uP, bias=bias, rng=rng)
    model = MultiHeadAttention(WP + Wx, stage.v, uP + ux, c)
    details = {"heads": H, "bias": bias, "seed": seed, "rank_given": rank, "isolated_rank": head_rank,
               "head_rank": _numerical_ranks(model.W, max(1e-6, 100 * min(stage.leak, LEAK_FLOOR_CAP))),
               "radius": stage.radius, "max_input_norm_used": stage.details["max_input_norm"],
               "crossings": stage.crossings, "value_error": verr, "isolation_leak": stage.leak,
               "measured_noise": stage.details["measured_noise"],
               "spurious_crossings": stage.details.get("spurious_crossings", 0),
               "sign_residual": stage.details["sign_residual"], "switch_off_repeat": info["switch_off_repeat"],
               "query_bound": MultiHeadAttention.query_bound(d, H)}
    return run.finish(model, unknowns=MultiHeadAttention.unknowns(d, H, bias), details=details, notes=notes,
                      hint=f" ({precision_said(oracle, verr)})" if _coarse(oracle, verr) else " (heads not generic?)",
                      then_check=lambda chk: _head_check(run, model, chk, verr))


def _head_check(run, model, chk, value_error):
    """Every head measured alone (``headcheck.py``), after the functional check ``chk``: the check's error is the
    worst of the functional error and the heads' bounds, so "passed" bounds each head's W and v error by the
    tolerance. Returns the combined check and the note for a head the functional check let pass."""
    oracle = run.oracle
    with oracle.phase("check"):
        hc = check_heads(oracle, model, run.rng)
    worst = float(np.max(hc.bound))
    ok = chk.passed and worst <= chk.tolerance
    combined = replace(chk, passed=bool(ok), error=max(chk.error, worst), queries=chk.queries + hc.queries,
                       extra={**chk.extra, "functional_error": chk.error, "heads": hc.as_dict()})
    said = f"; {precision_said(oracle, value_error)}" if _coarse(oracle, value_error) else ""
    return combined, (f"functional check FAILED: head {int(np.argmax(hc.bound))} is measured up to {worst:.1e} off "
                      f"(W/v, relative; the layer's output is off by {chk.error:.1e}) > tolerance "
                      f"{chk.tolerance:.1e}{said}")
