"""Learning from membership queries ``MQ(X) = 1[f(X) > 0]`` (App. B, Thm B.1), paper model without biases.

Signs cannot reveal the scale of v (``f`` scales with ‖v‖ and the sign does not), so v is recovered as a
unit vector; W is identified because it is read off attention weights, which do not depend on ‖v‖.

- :func:`extract_membership_paper` — App. B verbatim: ``v̂ = (1/(Rk)) Σ (2 MQ([x_i]) − 1) x_i`` over k random
  unit vectors (eq. 14, k from the Hoeffding bound), then for every ``(i, j)`` a bisection over ``a`` in
  ``[√(μ/8W), √(1/(2Wμ))]`` on the family ``X(a) = [(s/a e_i + a e_j); a e_j]``, ``s = −sign(α̂)/(2W)`` (eq. 18-24).
- :func:`extract_membership` — ours: the direction of v by bisection along great circles
  ``cos θ g_0 + sin θ g_k`` (one sign flip per circle; ``O(d log 1/ε)`` queries), then every ``q_ℓᵀ W p_j`` by a
  bisection that returns ``σ(s qᵀW p)`` directly (the same one-parameter family in orthogonal frames
  with equal ``|qᵀv|``); no bound on W or margin on v needed.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit, gammaln

from attnprobe._validation import check_float, check_int
from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.core.check import CheckResult
from attnprobe.learners.head.sigmoid import sigmoid_inverse
from attnprobe.learners.head.probes import equal_projection_orthogonal, paper_bound, random_orthogonal
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.core.skeleton import Run
from attnprobe.models.attention import AttentionHead

LIPSCHITZ_BOUND = 5.0  # L < 5 for σ⁻¹ on [σ(−½), σ(½)] (Lemma A.1)
#: the sign check: CHECK_PER_LENGTH fresh Gaussian sequences of each length in CHECK_LENGTHS (200 in all)
CHECK_LENGTHS = (1, 2, 4, 8)
CHECK_PER_LENGTH = 50
CHECK_COUNT = len(CHECK_LENGTHS) * CHECK_PER_LENGTH
#: largest share of fresh sequences whose sign may disagree: a correct model disagrees only where |f| is within
#: its error of 0 (measured: 0 of 200 at d = 8, 16); a wrong one disagrees on a constant share
SIGN_TOLERANCE = 0.02
UNIT_NOTE = ("v is recovered as a unit vector: membership answers are signs, which do not change when v is "
             "scaled, so ‖v‖ is not identifiable (App. B)")


def _signs(oracle, X) -> np.ndarray:
    """±1 from the 0/1 answers (eq. 11: h = 2g − 1); refuses answers that are not membership bits."""
    g = oracle(X)
    if not np.all((g == 0) | (g == 1)):
        raise ConfigError("the oracle's answers are not 0/1 membership bits; wrap it in a Membership oracle or "
                          "use a value learner (exact, robust) for value answers", param="oracle")
    return 2.0 * g - 1.0


def membership_unknowns(d: int) -> int:
    """Numbers 0/1 answers determine (App. B): the paper model's ``d + d²`` less the norm of v."""
    return paper_bound(d) - 1


def sphere_constant(d: int) -> float:
    """R = Γ(d/2) / (√π Γ((d+1)/2)) of eq. (12)."""
    return float(math.exp(gammaln(d / 2) - gammaln((d + 1) / 2)) / math.sqrt(math.pi))


def paper_membership_plan(d: int, eps_w: float, w_bound: float, margin: float, delta: float) -> dict:
    """Thm B.1's query count evaluated with the proof's constants.

    ``ε_v = ε_W μ³ / (40 W d)``; value part ``k = ⌈2 / (ε_v² R²) · log(2d/δ)⌉`` (Hoeffding, eq. 15); W part
    ``d²`` bisections to tolerance ``τ_a = η_W μ³ / (8 L W²)`` (``η_W = ε_W / d``, L = 5, the proof's Const = 1)
    over ``[√(μ/8W), √(1/(2Wμ))]``.

    A plan float64 cannot carry out (a bisection tolerance or interval beyond its range) is refused with
    :class:`ConfigError`; a sample count past float64's range is ``inf`` (refused by the learner).
    """
    eps_v = eps_w * margin**3 / (40.0 * w_bound * d)
    R = sphere_constant(d)
    spread = eps_v**2 * R**2
    k = math.ceil(2.0 / spread * math.log(2 * d / delta)) if spread > 1e-300 else math.inf
    lo, hi = math.sqrt(margin / (8 * w_bound)), math.sqrt(1 / (2 * w_bound * margin))
    tau_a = (eps_w / d) * margin**3 / (8 * LIPSCHITZ_BOUND * (w_bound**2 if w_bound < 1e150 else math.inf))
    if not (0 < lo < hi < math.inf and tau_a >= 2.0**-52 * hi):  # finer than float64 resolves on [lo, hi]
        raise ConfigError(f"Thm B.1's bisections cannot be carried out in float64 at ε_W = {eps_w:g}, "
                          f"W = {w_bound:g}, μ = {margin:g}: their tolerance τ_a = ε_W μ³ / (8 L W² d) = {tau_a:.3g} "
                          f"on [√(μ/8W), √(1/2Wμ)] = [{lo:.3g}, {hi:.3g}] is finer than float64 resolves there; "
                          "give a larger "
                          "'eps_w' (or a tighter 'w_bound' and 'margin')", param="eps_w")
    steps = max(1, math.ceil(math.log2((hi - lo) / tau_a)))
    return {"eps_v": eps_v, "R": R, "samples": k, "steps": steps, "interval": (lo, hi), "tau_a": tau_a,
            "queries": k + d * d * steps}


def sign_check(oracle, model, rng, lengths=CHECK_LENGTHS, per_length: int = CHECK_PER_LENGTH) -> CheckResult:
    """Agreement of ``1[f̂(X) > 0]`` with the oracle's bits on ``per_length`` fresh Gaussian sequences of each
    length: ``error`` is the share that disagrees (``per_length`` holds it per length, ``extra`` the
    agreement); ``passed`` when it is at most ``SIGN_TOLERANCE``."""
    before = oracle.queries
    agree = total = 0
    per = {}
    for N in lengths:
        X = rng.standard_normal((per_length, N, oracle.d))
        same = oracle(X) == (np.asarray(model(X)) > 0).astype(float)
        per[int(N)] = 1.0 - float(np.mean(same))
        agree += int(np.sum(same))
        total += len(same)
    error = 1.0 - agree / total
    return CheckResult(passed=bool(error <= SIGN_TOLERANCE), error=error, tolerance=SIGN_TOLERANCE,
                       queries=oracle.queries - before, lengths=tuple(map(int, lengths)), per_length=per,
                       extra={"sign_agreement": agree / total, "per_length_count": per_length})


def _membership_run(oracle, seed, check, progress) -> Run:
    """A :class:`Run` whose check is the sign agreement on ``CHECK_COUNT`` fresh sequences."""
    return Run(oracle, "membership", scalar=True, seed=seed, check=check, check_lengths=CHECK_LENGTHS,
               check_per_length=CHECK_PER_LENGTH, progress=progress)


def _bisect(oracle, build, small_sign, lo, hi, steps):
    """Parallel bisection: ``build(t)`` gives one query per problem at parameters ``t``; the answer's sign is
    ``small_sign`` below each root and the opposite above. Returns the final midpoints."""
    lo, hi = np.array(lo, float), np.array(hi, float)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        below = _signs(oracle, build(mid)) == small_sign
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return 0.5 * (lo + hi)


# ------------------------------------------------------------------------------------------------- ours
BIAS_PROBES = 4


def _refuse_bias(oracle, rng, eps: float = 1e-6) -> None:
    """App. B's model has no bias, so ``sign f([x]) = −sign f([−x])``. A bias c ≠ 0 gives both tiny ±x the sign
    of c: refuse with a clear error (``BIAS_PROBES`` queries)."""
    G = rng.standard_normal((BIAS_PROBES // 2, oracle.d))
    G *= eps / np.linalg.norm(G, axis=1, keepdims=True)
    h = _signs(oracle, np.concatenate([G, -G])[:, None, :])
    if np.all(h[: len(G)] == h[len(G):]):
        raise UnidentifiableError("the membership answers are not antisymmetric (f([x]) and f([−x]) share their "
                                  "sign for tiny x): either v = 0 (every answer is then the same and W is "
                                  "invisible) or the target has an output bias c ≠ 0; App. B's model (and this "
                                  "learner) needs c = 0 and v ≠ 0")


def learn_direction(oracle, rng, steps: int = 48, rough_steps: int = 12) -> np.ndarray:
    """Unit direction of v from signs of length-1 queries ``[x] ↦ 1[xᵀv > 0]``.

    On each great circle ``cos θ g_0 + sin θ g_k`` (θ ∈ [0, π]) the sign flips once, at ``cot θ* = −w_k/w_0``
    with ``w = G v``. A rough pass in a random frame, then a precise pass in a frame whose ``g_0`` is the rough
    direction (so every circle is well conditioned). ``2 + (d − 1)(rough_steps + steps)`` queries.
    """
    d = oracle.d
    if d == 1:
        s = _signs(oracle, np.ones((1, 1, 1)))[0]
        return np.array([s])
    G = random_orthogonal(d, rng)
    for n in (rough_steps, steps):
        s0 = _signs(oracle, G[:1, None, :])[0]  # sign of w_0

        def build(theta, G=G):
            return (np.cos(theta)[:, None] * G[0] + np.sin(theta)[:, None] * G[1:])[:, None, :]

        theta = _bisect(oracle, build, s0, np.zeros(d - 1), np.full(d - 1, np.pi), n)
        w = np.concatenate([[1.0], -np.cos(theta) / np.sin(theta)]) * s0
        direction = G.T @ w
        direction /= np.linalg.norm(direction)
        G = np.vstack([direction, _complement(direction, rng)])
    return direction


def _complement(x, rng):
    """Orthonormal basis (rows) of the complement of unit x, randomly rotated."""
    d = x.shape[0]
    Z = rng.standard_normal((d, d))
    Z[:, 0] = x
    Q, _ = np.linalg.qr(Z)
    return Q[:, 1:].T


def extract_membership(oracle, *, seed: int = 0, steps: int = 48, w_steps: int = 50, scale: float = 1.0,
                       check: bool = True, progress=None) -> Extraction:
    """Recover the direction of v and W from membership answers, with no bound on W (see module doc).

    For probes ``q, p`` (rows of orthogonal frames with equal ``|qᵀv̂|``) and ``s = −sign(r)·scale`` with
    ``r = qᵀv / pᵀv``, the query ``[(s/a q + a p); a p]`` at ``a = √(t |s r|)`` answers
    ``sign(a pᵀv + σ(s qᵀWp)(s/a) qᵀv)``, which flips exactly at ``t = σ(s qᵀWp)``: a bisection over
    ``t ∈ (0, 1)`` yields the attention weight itself. Entries whose weight comes out within 1e-6 of 0 or 1 are
    bisected again at a 16x smaller ``scale`` (phase ``"rebisection"``). Queries: ``4 + 2 + (d − 1)(12 + steps)
    + d² w_steps`` (+ redos; the first 4 refuse targets with an output bias), plus the sign check's 200.
    """
    steps = check_int(steps, "steps", min_value=1)
    w_steps = check_int(w_steps, "w_steps", min_value=1)
    scale = check_float(scale, "scale", min_value=0.0, strict_min=True)
    d = oracle.d
    run = _membership_run(oracle, seed, check, progress)
    run.plan(BIAS_PROBES + 2 + (d - 1) * (12 + steps) + d * d * w_steps, f"membership extraction at d={d}")
    with run.phase("bias_test"):
        _refuse_bias(oracle, run.rng)
    with run.phase("direction"):
        v = learn_direction(oracle, run.rng, steps)
    run.report()
    Q = equal_projection_orthogonal(v, run.rng)
    P = equal_projection_orthogonal(v, run.rng)
    Z = _bisect_weights(run, Q, P, v, scale, w_steps)
    details = {"probes": "bisection", "direction_steps": steps, "w_steps": w_steps, "scale": scale,
               "redo_queries": run.queries_by_phase().get("rebisection", 0), "planned_queries": run.planned}
    return run.finish(AttentionHead(Q.T @ Z @ P, v), unknowns=membership_unknowns(d), details=details,
                      notes=[UNIT_NOTE], check_fn=sign_check)


def _bisect_weights(run, Q, P, v, scale, w_steps):
    """``Z[ℓ, j] = q_ℓᵀ W p_j`` by sign bisection over ``t = σ(s qᵀW p)``; saturated entries are bisected again
    at a 16x smaller scale (up to 5 times)."""
    oracle, d = run.oracle, run.oracle.d
    qv, pv = Q @ v, P @ v
    ell, j = np.divmod(np.arange(d * d), d)
    r = qv[ell] / pv[j]
    S = -np.sign(r) * float(scale)
    small = np.sign(S * qv[ell])  # sign of f for a -> 0
    Z = np.empty(d * d)
    todo = np.arange(d * d)
    for attempt in range(6):
        idx = todo

        def build(t, idx=idx):
            a = np.sqrt(t * np.abs(S[idx] * r[idx]))
            X = np.empty((len(idx), 2, d))
            X[:, 1, :] = a[:, None] * P[j[idx]]
            X[:, 0, :] = (S[idx] / a)[:, None] * Q[ell[idx]] + X[:, 1, :]
            return X

        with run.phase("rebisection" if attempt else "weights"):
            t = _bisect(oracle, build, small[idx], np.zeros(len(idx)), np.ones(len(idx)), w_steps)
        edge = (t < 1e-6) | (t > 1 - 1e-6)
        Z[idx] = sigmoid_inverse(t) / S[idx]
        run.report()
        if not edge.any():
            return Z.reshape(d, d)
        todo = idx[edge]
        if attempt == 5:
            raise UnidentifiableError(f"{len(todo)} attention weights stay at 0 or 1 even at probe scale "
                                      f"{scale / 16**5:g}; the logits are too steep for sign bisection")
        oracle.require(len(todo) * w_steps, "re-bisecting saturated entries")
        S[todo] /= 16.0
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------------------------ paper
def extract_membership_paper(oracle, *, w_bound: float, margin: float, eps_w: float = 0.1, delta: float = 0.05,
                             samples: int | None = None, max_samples: int = 10**8, seed: int = 0,
                             check: bool = True, progress=None) -> Extraction:
    """App. B verbatim. ``samples`` overrides the Hoeffding count k (then the guarantee no longer applies:
    the result says so); k above ``max_samples`` is refused with the number it would take."""
    w_bound = check_float(w_bound, "w_bound", min_value=2.0)
    margin = check_float(margin, "margin", min_value=0.0, max_value=1.0, strict_min=True)
    for name, value in (("eps_w", eps_w), ("delta", delta)):
        if not check_float(value, name, min_value=0.0, strict_min=True) < 1:
            raise ConfigError(f"Thm B.1 needs the {name!r} parameter in (0, 1); got {value}", param=name)
    samples = check_int(samples, "samples", min_value=1, allow_none=True)
    d = oracle.d
    plan = paper_membership_plan(d, eps_w, w_bound, margin, delta)
    k = plan["samples"] if samples is None else samples
    notes = [UNIT_NOTE]
    if samples is None and k > max_samples:  # k may be inf: more than float64 holds
        raise ConfigError(f"Thm B.1 asks for k = {k:.3e} random sign queries for ε_W = {eps_w:g} (ε_v = "
                          f"{plan['eps_v']:.3e}); give the 'samples' parameter to run with fewer (no guarantee) or "
                          "use the bisection learner (extract_membership)", param="samples")
    if k < plan["samples"]:
        notes.append(f"ran with k = {k} sign samples instead of the {plan['samples']:.3e} Thm B.1 asks for: "
                     "its guarantee does not apply")
    steps = plan["steps"]
    run = _membership_run(oracle, seed, check, progress)
    run.plan(k + d * d * steps, f"Thm B.1 at d={d}")
    acc = np.zeros(d)
    chunk = 2**16
    for i0 in range(0, k, chunk):
        n = min(chunk, k - i0)
        x = run.rng.standard_normal((n, d))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        with run.phase("values"):
            acc += _signs(oracle, x[:, None, :]) @ x
        run.report()
    v = acc / (plan["R"] * k)  # eq. (14)
    if np.any(v == 0):
        raise UnidentifiableError("an entry of v̂ is exactly 0; App. B needs min |v_i| ≥ μ > 0")
    with run.phase("weights"):
        W = _paper_weights(oracle, v, w_bound, margin, plan)
    details = {"probes": "paper", "w_bound": w_bound, "margin": margin, "eps_w": eps_w, "delta": delta,
               "samples": k, "bisection_steps": steps, "plan": plan, "v_unnormalised": v,
               "guarantee": {"eps_W": eps_w, "eps_v_inf": plan["eps_v"], "probability": 1 - delta}}
    return run.finish(AttentionHead(W, v / np.linalg.norm(v)), unknowns=membership_unknowns(d), details=details,
                      notes=notes, check_fn=sign_check)


def _paper_weights(oracle, v, w_bound, margin, plan):
    """App. B's W: for every ``(i, j)`` a bisection over ``a`` on ``X(a) = [(s/a e_i + a e_j); a e_j]``,
    ``s = −sign(α̂)/(2W)`` (eq. 18-24), then ``σ⁻¹`` of the clipped weight."""
    d = oracle.d
    ii, jj = np.divmod(np.arange(d * d), d)
    alpha = v[jj] / v[ii]
    s = -np.sign(alpha) / (2 * w_bound)
    small = np.sign(v[ii]) * np.sign(s)  # h(X(a)) for a -> 0
    lo, hi = plan["interval"]
    E = np.eye(d)

    def build(a):
        X = np.empty((d * d, 2, d))
        X[:, 1, :] = a[:, None] * E[jj]
        X[:, 0, :] = (s / a)[:, None] * E[ii] + X[:, 1, :]
        return X

    a = _bisect(oracle, build, small, np.full(d * d, lo), np.full(d * d, hi), plan["steps"])
    a = np.clip(a, 0.0, math.sqrt(1 / (2 * w_bound * margin)))
    sig = np.clip(a**2 * np.abs(alpha) * 2 * w_bound, expit(-0.5), expit(0.5))
    return (sigmoid_inverse(sig) / s).reshape(d, d)
