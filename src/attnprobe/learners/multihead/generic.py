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

Heads whose ``(W_h, u_h)`` coincide (Prop. 7.1) cross their hyperplanes together and come back as one head with
the summed value vector: the same function, said in a note. A head with ``v_h = 0`` contributes nothing and is
not found. Needs ``d ≥ 2H`` (room for the switch-off probe of the cross stage).
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.exact import learn_value
from attnprobe.learners.lowrank import extract_lowrank, lowrank_queries
from attnprobe.learners.multihead.cross import cross_components
from attnprobe.learners.multihead.isolation import isolated_oracle
from attnprobe.learners.multihead.saturation import saturated_values
from attnprobe.learners.skeleton import Run

METHOD = "multihead-generic"


def _planned_rest(d, H, rank, bias):
    """Queries of the isolated and cross stages (no calibration or retries): a lower bound."""
    r = min(rank or d - H + 1, d - H + 1)
    return H * (lowrank_queries(d, r, 0, 0 if rank else 2, bias) + 2 * H * (min(r, d) + 1))


def extract_generic(oracle, *, heads=None, max_heads=None, rank=None, bias=True, seed=0, check=True, progress=None):
    """Recover every head ``(W_h, v_h, u_h)`` and ``c`` of a multi-head oracle (module docstring).

    ``heads``: the number of heads if known (fewer found means merged heads: a note); ``max_heads``: refuse
    more; ``rank``: the head dimension (rank of each ``W_h``), detected when omitted. Returns an
    :class:`~attnprobe.learners.result.Extraction` with a :class:`MultiHeadAttention` (heads up to permutation).
    """
    from attnprobe.models.multihead import MultiHeadAttention

    d = oracle.d
    for name, val in (("heads", heads), ("max_heads", max_heads), ("rank", rank)):
        if val is not None and not (isinstance(val, (int, np.integer)) and val >= 1):
            raise ConfigError(f"{name} must be a positive integer; got {val!r}", param=name)
    if heads is not None and 2 * heads > d:
        raise UnidentifiableError(f"{heads} heads at width d = {d}: switching the other heads off needs d ≥ 2H "
                                  f"(at most {d // 2} heads)")
    run = Run(oracle, METHOD, seed=seed, check=check, progress=progress)
    rng = run.rng
    notes: list[str] = []
    run.plan(d + 1 + 4 * d, f"generic multi-head extraction at d={d} (values stage)", at_least=True)
    with run.phase("values"):
        v_sum, c, _ = learn_value(oracle, bias, "multi-head")  # length 1: [0] ↦ c, [e_i] ↦ (Σ_h v_h)_i + c
        y = rng.standard_normal(d) / np.sqrt(d)
        stage = saturated_values(oracle, y, v_sum, c + y @ v_sum, rng)
    v = stage.v
    H = v.shape[0]
    if heads is not None and H < heads:
        notes.append(f"found {H} heads where {heads} were given: heads with equal (W_h, u_h) attend identically "
                     "(Prop. 7.1) and cannot be told apart from queries; they merge into one head whose value "
                     "vector is their sum, which computes the same function (heads with v_h = 0 contribute "
                     "nothing and are not found either)")
    elif heads is not None and H > heads:
        raise UnidentifiableError(f"found {H} heads (hyperplane crossings of the saturated probe) but heads={heads} "
                                  "was given; omit heads to keep all of them")
    if max_heads is not None and H > max_heads:
        raise UnidentifiableError(f"found {H} heads, more than max_heads = {max_heads}; raise max_heads")
    if 2 * H > d:
        raise UnidentifiableError(f"found {H} heads at width d = {d}: switching the other heads off needs d ≥ 2H")
    run.plan(_planned_rest(d, H, rank, bias), f"generic multi-head extraction at d={d}, H={H} "
             "(isolated and cross stages)", at_least=True)
    run.report(run.queries + _planned_rest(d, H, rank, bias))
    WP = np.empty((H, d, d))
    uP = np.empty((H, d))
    head_rank = []
    with run.phase("isolated"):
        for h in range(H):
            iso = isolated_oracle(oracle, v, h, v_sum)
            iso.raise_floor(stage.leak)  # the other heads leak through the errors of v: rounding to this learner
            r_h = None if rank is None else min(int(rank), d - H + 1)
            res = extract_lowrank(iso, rank=r_h, bias=bias, seed=int(rng.integers(2**31)), check=False,
                                  certificate=0)
            P = iso.fn.P
            WP[h] = P @ res.model.W
            uP[h] = P @ res.model.u
            head_rank.append(int(res.details.get("detected_rank", d)))
            run.report()
    with run.phase("cross"):
        Wx, ux, info = cross_components(oracle, v, v_sum, c, WP, uP, bias=bias, rng=rng)
    model = MultiHeadAttention(WP + Wx, v, uP + ux, c)
    details = {"heads": H, "bias": bias, "seed": seed, "rank_given": rank, "head_rank": head_rank,
               "radius": stage.radius, "crossings": stage.crossings, "value_error": stage.details["value_error"],
               "isolation_leak": stage.leak, "spurious_crossings":
               stage.details.get("spurious_crossings", 0), "sign_residual": stage.details["sign_residual"],
               "switch_off_repeat": info["switch_off_repeat"], "query_bound": MultiHeadAttention.query_bound(d, H)}
    return run.finish(model, unknowns=MultiHeadAttention.unknowns(d, H, bias), details=details, notes=notes,
                      hint=" (heads not generic, or an answer precision too coarse for the saturated probes)")
