"""Unknown orthogonal head subspaces from Hessians (the App. C conjecture), then the known-subspace learner.

For a last token ``y``, ``F_y(z) = f([y + z; y]) − f([y; y]) = Σ_h σ(zᵀp_h)(zᵀv_h)`` with ``p_h = W_h y + u_h``
(App. C with ``y = e_j``). At ``z = 0``: ``4∇²F_y(0) = Σ_h p_h v_hᵀ + v_h p_hᵀ`` (``U⁽ʲ⁾Vᵀ + VU⁽ʲ⁾ᵀ``), a
symmetric matrix that is block-diagonal in the head subspaces when they are mutually orthogonal.

Measuring it. ``F_y(z) − ½ zᵀv̄`` (``v̄ = Σ_h v_h`` and ``c`` from length-1 queries) is even in z, so
``G(hz) = f([y + hz; y]) − c − yᵀv̄ − ½h zᵀv̄ = ½h² zᵀ∇²F_y(0) z + O(h⁴)``: one query per quadratic form, no
central difference needed; polarisation over ``z ∈ {e_a, e_a + e_b}`` gives the whole Hessian with
``d(d+1)/2`` queries (twice that with Richardson extrapolation over the steps h and 2h, which cancels the
``O(h²)`` term; used whenever the query cap allows). Each Hessian reaches ``span{p_h(y), v_h}`` in every head, so
Hessians are added at
random ``y`` until their ranges stop growing (``d_h − 1`` of them cover a ``d_h``-dim head), plus one.

Then :func:`~attnprobe.learners.multihead.blocks.simultaneous_blocks` (finest simultaneous block
diagonalisation, Murota et al.) splits R^d into the head subspaces, and
:func:`~attnprobe.learners.multihead.subspaces.learn_heads_in_subspaces` learns each head inside its own.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import RecoveryError
from attnprobe.learners.head.exact import learn_value
from attnprobe.learners.multihead.blocks import simultaneous_blocks
from attnprobe.learners.multihead.subspaces import learn_heads_in_subspaces
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.core.skeleton import Run
from attnprobe.models.attention import AttentionHead
from attnprobe.models.multihead import MultiHeadAttention

#: relative singular value below which a Hessian direction is noise (the ranges' rank test), at least
#: ``RANK_NOISE × √eps`` (the one-step Hessians' relative error is ~√eps)
RANK_TOL, RANK_NOISE = 1e-6, 30.0
#: finite-difference steps in units of eps^(1/4) (one step) and eps^(1/6) (Richardson); measured best on
#: float64 orthogonal heads with unit logit scale: subspace errors ~1e-7 and ~3e-9 (docs/multihead.md)
STEP_SINGLE, STEP_RICHARDSON = 4.0, 4.0
#: the leakage the heads phase assumes, in units of the block diagonalisation's off-block residual
LEAKAGE_FACTOR = 10.0


def polarization_probes(d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Probes ``e_a`` (a = b) and ``e_a + e_b`` (a < b) and their index pairs, ``d(d+1)/2`` of them."""
    a, b = np.triu_indices(d)
    Z = np.zeros((len(a), d))
    Z[np.arange(len(a)), a] += 1.0
    Z[np.arange(len(a)), b] += np.where(a == b, 0.0, 1.0)
    return Z, a, b


def _quadratic_forms(oracle, y, Z, v_sum, c, step):
    """``zᵀ∇²F_y(0)z + O(h²)`` for every row z of Z, one query each."""
    X = np.empty((len(Z), 2, Z.shape[1]))
    X[:, 0] = y + step * Z
    X[:, 1] = y
    G = oracle(X) - c - y @ v_sum - 0.5 * step * (Z @ v_sum)
    return 2.0 * G / step**2


def hessian_at(oracle, y: np.ndarray, v_sum: np.ndarray, c: float, step: float,
               richardson: bool = False) -> np.ndarray:
    """``∇²F_y(0)`` from ``d(d+1)/2`` value queries ``[y + h z; y]`` (module docstring); ``richardson`` adds
    the step ``2h`` and cancels the ``O(h²)`` term (twice the queries)."""
    d = oracle.d
    Z, a, b = polarization_probes(d)
    q = _quadratic_forms(oracle, y, Z, v_sum, c, step)
    if richardson:
        q = (4.0 * q - _quadratic_forms(oracle, y, Z, v_sum, c, 2.0 * step)) / 3.0
    diag = np.zeros(d)
    diag[a[a == b]] = q[a == b]
    Hm = np.diag(diag)
    off = a != b
    Hm[a[off], b[off]] = 0.5 * (q[off] - diag[a[off]] - diag[b[off]])
    Hm[b[off], a[off]] = Hm[a[off], b[off]]
    return Hm


def rank_tolerance(eps: float) -> float:
    """Relative size below which a direction of the measured Hessians is finite-difference noise."""
    return max(RANK_TOL, RANK_NOISE * eps ** 0.5)


def _rank(mats: list[np.ndarray], tol: float) -> int:
    s = np.linalg.svd(np.concatenate(mats, axis=1), compute_uv=False)
    return int(np.sum(s > tol * s[0])) if s[0] > 0 else 0


def _step(oracle, richardson: bool) -> float:
    return STEP_RICHARDSON * oracle.eps ** (1 / 6) if richardson else STEP_SINGLE * oracle.eps ** 0.25


def heads_reserve(d: int, H: int) -> int:
    """Queries the head pass needs for ``H`` heads of dimension ``⌈d/H⌉`` (with 10 % for calibration)."""
    dh = -(-d // max(H, 1))
    return int(1.1 * H * (dh + 1) ** 2)


def measure_hessians(oracle, v_sum: np.ndarray, c: float, rng: np.random.Generator, *, budget: float,
                     heads: int | None = None, extra: int = 1, richardson: bool | None = None,
                     max_hessians: int | None = None, progress=None) -> tuple[list[np.ndarray], dict]:
    """Phase function: Hessians at random last tokens until the rank of their ranges stops growing, plus
    ``extra``, within ``budget`` queries (less what the head passes will need: :func:`heads_reserve`).

    ``richardson``: True/False for every Hessian, or None (auto): Richardson (2 queries per entry, ~30x more
    accurate) whenever the Hessians still expected (``d_h − 1 + extra``, with ``d_h = d/H`` and H known or read
    from the first Hessian's rank ``2H``) fit with it, one-step otherwise.
    """
    d = oracle.d
    per = d * (d + 1) // 2
    cap = max_hessians if max_hessians is not None else d + 1
    mats, ranks, modes, after_full = [], [], [], 0
    used0 = oracle.queries
    while len(mats) < cap:
        H_est = heads or (max(1, ranks[0] // 2) if ranks else 2)
        left = budget - (oracle.queries - used0) - heads_reserve(d, H_est)
        if ranks:
            need = max(1, -(-(d - ranks[-1]) // max(1, H_est)) + extra - after_full)
        else:
            need = -(-d // H_est) - 1 + extra
        rich = richardson if richardson is not None else left >= (need + 1) * per
        if left < per * (2 if rich else 1):
            break
        y = rng.standard_normal(d)
        mats.append(hessian_at(oracle, y, v_sum, c, _step(oracle, rich), rich))
        modes.append(bool(rich))
        ranks.append(_rank(mats, rank_tolerance(oracle.eps)))
        if progress:
            progress(len(mats), cap)
        grown = len(ranks) == 1 or ranks[-1] > ranks[-2]
        if ranks[-1] == d or not grown:
            after_full += 1
            if after_full > extra:
                break
    return mats, {"hessians": len(mats), "ranks": ranks, "richardson": modes, "queries_per_hessian": per}


def extract_multihead_orthogonal(oracle, *, heads: int | None = None, bias: bool = True, seed: int = 0,
                                 check: bool = True, max_queries: int | None = None,
                                 richardson: bool | None = None, max_hessians: int | None = None,
                                 progress=None, max_heads: int | None = None, asked_before: dict | None = None,
                                 notes: tuple[str, ...] = ()) -> Extraction:
    """Heads in unknown mutually orthogonal subspaces (App. C conjecture): Hessians → finest simultaneous block
    diagonalisation → each head by the exact learner in its subspace (small probe logits, so the leakage of
    the other heads through the estimated subspaces is not amplified). Phases: values, hessians, heads.

    ``heads`` fixes H (else detected from the block structure). ``max_queries`` caps the extraction's queries
    (default: ``4Hd² − 2H + 1`` when H is known, else the oracle's budget); more heads than ``max_heads`` get a
    note. ``asked_before``: queries this extraction asked before this learner, by phase (:class:`Run`);
    ``notes``: what the caller has to say of them.
    """
    run = Run(oracle, "multihead-orthogonal", seed=seed, check=check, progress=progress, asked_before=asked_before)
    rng = run.rng
    d = oracle.d
    cap = oracle.remaining - run.check_queries
    if max_queries is None and heads is not None:
        max_queries = MultiHeadAttention.query_bound(d, heads)
    if max_queries is not None:
        cap = min(cap, max_queries)
    first = d + 1 + d * (d + 1) // 2
    run.plan(first, f"orthogonal multi-head extraction at d={d} (values and one Hessian)", at_least=True)

    with run.phase("values"):
        v_sum, c, _ = learn_value(oracle, bias=True, learner="multi-head")
    with run.phase("hessians"):
        mats, hdetails = measure_hessians(oracle, v_sum, c, rng, budget=cap - run.queries, heads=heads,
                                          richardson=richardson, max_hessians=max_hessians,
                                          progress=lambda *_: run.report())
    split = simultaneous_blocks(mats, rng, blocks=heads, kernel_tol=max(1e-7, rank_tolerance(oracle.eps) ** 2))
    bases = split.bases
    if heads is not None and len(bases) != heads:
        raise RecoveryError(f"found {len(bases)} head subspaces, expected heads={heads}; "
                            f"{run.queries} queries spent")
    with run.phase("heads"):
        model, head_details = learn_heads_in_subspaces(oracle, bases, bias=bias, seed=seed,
                                                       leakage=LEAKAGE_FACTOR * split.residual_after)
    if not bias:
        model = MultiHeadAttention(model.W, model.v, None, 0.0)
    H = model.H
    details = {**hdetails, **head_details,
               "blocks": {"sizes": [int(b.shape[1]) for b in bases], "kernel_dim": int(split.kernel.shape[1]),
                          "residual_before_refine": split.residual_before,
                          "residual_after_refine": split.residual_after,
                          "weakest_kept_edge": split.weakest_kept, "strongest_cut_edge": split.strongest_cut},
               "query_bound": MultiHeadAttention.query_bound(d, H)}
    notes = list(notes)
    if max_heads is not None and H > max_heads:
        notes.append(f"found {H} heads, more than max_heads={max_heads}")
    if split.kernel.shape[1]:
        notes.append(f"{split.kernel.shape[1]} input directions reach no head (common kernel of the Hessians); "
                     "the heads are taken to be zero there")
    # per-head parameters inside the subspaces, one shared c, and the subspaces themselves (a point of the flag
    # manifold: d(d−1)/2 rotation angles less those inside each block)
    dims = [b.shape[1] for b in bases]
    unknowns = (sum(AttentionHead.unknowns(k, bias) for k in dims) - (H - 1) * int(bias)
                + (d * (d - 1) - sum(k * (k - 1) for k in dims)) // 2)
    return run.finish(model, unknowns=unknowns, details=details, notes=notes,
                      hint=" (heads in mutually orthogonal subspaces, App. C; overlapping heads need "
                           "method='generic')")
