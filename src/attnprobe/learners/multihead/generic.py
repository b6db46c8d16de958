"""Generic (overlapping, non-orthogonal) heads of a multi-head layer from value queries.

Stages (docs/multihead-generic.md):

1. **values** — length-1 queries give ``Σ_h v_h`` and ``c``; the saturated half circle (``saturation.py``)
   gives every ``v_h`` exactly and the number of heads H.
2. **isolated** — with all ``v_h`` known, head h alone is a single-head oracle (``isolation.py``) for
   ``(P_h W_h, P_h v_h, P_h u_h)``, ``P_h`` the projector onto ``{v_g : g ≠ h}^⊥``; the low-rank learner
   (Sec. 5 sketch) recovers it with ``≈ 2dr`` queries.
3. **cross** — the missing ``C_hᵀW_h``, ``C_hᵀu_h`` along the other heads' value vectors, with every other
   head switched off by saturation (``cross.py``).
"""

from __future__ import annotations

import time

import numpy as np

from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.check import finish
from attnprobe.learners.lowrank import extract_lowrank
from attnprobe.learners.multihead.cross import cross_components
from attnprobe.learners.multihead.isolation import isolated_oracle
from attnprobe.learners.multihead.saturation import saturated_values
from attnprobe.learners.result import Extraction


def _value_sum(oracle, bias):
    d = oracle.d
    X = np.eye(d)[:, None, :]
    if bias:
        X = np.concatenate([np.zeros((1, 1, d)), X])
    a = oracle(X)
    c = float(a[0]) if bias else 0.0
    return (a[1:] - c if bias else a.copy()), c


def extract_generic(oracle, *, heads=None, max_heads=None, rank=None, bias=True, seed=0, check=True, progress=None):
    """Recover every head ``(W_h, v_h, u_h)`` and ``c`` of a multi-head oracle (module docstring)."""
    from attnprobe.models.multihead import MultiHeadAttention

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    d = oracle.d
    by_phase = {}
    notes = []
    q0 = oracle.queries
    v_sum, c = _value_sum(oracle, bias)
    y = rng.standard_normal(d) / np.sqrt(d)
    base = c + y @ v_sum
    vs = saturated_values(oracle, y, v_sum, base, rng)
    by_phase["values"] = oracle.queries - q0
    v = vs.v
    H = v.shape[0]
    if heads is not None and H != heads:
        notes.append(f"found {H} heads where {heads} were given: heads with parallel W_h y + u_h (equal W_h, u_h, "
                     "Prop. 7.1) merge into one head with the summed value vector, which computes the same function")
    if max_heads is not None and H > max_heads:
        raise UnidentifiableError(f"found {H} heads, more than max_heads = {max_heads}")
    if 2 * H - 1 > d:
        raise UnidentifiableError(f"{H} heads at width d = {d}: isolating a head needs d ≥ 2H − 1")
    q1 = oracle.queries
    WP = np.empty((H, d, d))
    uP = np.empty((H, d))
    head_rank = []
    for h in range(H):
        iso = isolated_oracle(oracle, v, h, v_sum)
        r_h = None if rank is None else min(int(rank), d - H + 1)
        res = extract_lowrank(iso, rank=r_h, bias=bias, seed=int(rng.integers(2**31)), check=False, certificate=0)
        P = iso.fn.P
        WP[h] = P @ res.model.W
        uP[h] = P @ res.model.u
        head_rank.append(res.details.get("detected_rank"))
    by_phase["isolated"] = oracle.queries - q1
    q2 = oracle.queries
    Wx, ux, info = cross_components(oracle, v, v_sum, c, WP, uP, bias, rng)
    by_phase["cross"] = oracle.queries - q2
    model = MultiHeadAttention(WP + Wx, v, uP + ux, c)
    result = Extraction("multihead-generic", model, oracle.queries - q0, MultiHeadAttention.unknowns(d, H, bias), 0.0,
                        details={"heads": H, "queries_by_phase": by_phase, "head_rank": head_rank,
                                 "radius": vs.radius, "switch_off_repeat": info["switch_off_repeat"]},
                        notes=notes)
    return finish(result, oracle, rng, check, t0=t0)
