"""Multi-head attention from whole output rows (vector answers; docs/multihead-vector.md).

The attention sublayer of a real model answers, at the query position, the K-vector
``f(X) = Σ_h softmax(X W_h x_N + X u_h)ᵀ X V_hᵀ + c`` (App. C's concatenate-then-project layer, ``V_h = W_O[:, h]
W_V[h]``). One query shows every head's attention at once; no saturation is needed and probes stay moderate.

1. **values** — length-1 queries ``[x] ↦ M x + c`` with ``M = Σ_h V_h`` (2d queries, ±x).
2. **calibrate** — a token norm ρ at which the heads' logits are of order one (``max_input_norm`` respected).
3. **separate** — for a probe difference δ, ``r(b) = f([b + δ; b]) − M b − c = Σ_h σ(δᵀ(W_h b + u_h)) V_h δ`` is a
   sigmoid network in ``b`` (:mod:`vector_heads`): its rank is H; Jennrich's method on two finite-difference
   Jacobians and variable projection give every ``V_h δ`` exactly. Nearby δ's keep the labels. Either the heads'
   column spaces ``C_h = span{V_h δ}`` split ``M`` (when they are well-conditioned), or d differences
   ``δ_k`` give ``V_h`` directly.
4. **logits** — with every ``V_h`` known, ``[b + p_1; …; b + p_m; b]`` measures ``p_iᵀ(W_h b + u_h)`` for every
   head and token (:mod:`vector_logits`): ``u_h`` at ``b = 0`` and ``W_h`` column block by column block.

Identifiable (and returned): ``W_h``, ``u_h``, ``V_h`` (the product ``W_O[:, h] W_V[h]``, not its factors) and
``c``, heads up to permutation. Heads with equal ``(W_h, u_h)`` (Prop. 7.1) attend identically and come back as
one head holding the sum of their ``V_h``.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError, RecoveryError, UnidentifiableError
from attnprobe.learners.multihead.vector_heads import fit_delta, jennrich, theta_from_values
from attnprobe.learners.multihead.vector_logits import chunks, read_logits, token_queries
from attnprobe.learners.probes import random_orthogonal
from attnprobe.learners.skeleton import Run
from attnprobe.oracles.input_bound import refuse_clipping

METHOD = "multihead-vector"
#: the column spaces split M when their stacked bases are at most this ill-conditioned (else d differences)
SUBSPACE_COND = 1e2
#: target size of the nonlinear part of a two-row answer, relative to its linear part (logits of order one)
TARGET_NONLINEARITY = 0.5
#: token norm of the logits stage relative to the calibrated one (m + 1 tokens spread the logits further)
LOGIT_SCALE = 0.5
#: differences δ_k = δ_0 + step·q_k, relative to |δ_0|: short ones inherit δ_0's head labels; long ones (coarse
#: answers) give V_h without dividing the fits' errors by a short step
SMALL_STEP, FAR_STEP = 0.05, 1.0
#: answers coarser than this unit roundoff (float32's is 6e-8) that fail to separate are refused naming it
COARSEST_EPS = 1e-6


def _values(oracle, rng, rho):
    """``M`` (K, d) and ``c`` (K,) from ``[±x]`` for the rows x of a scaled random orthogonal matrix."""
    d = oracle.d
    P = rho * random_orthogonal(d, rng)
    y = oracle(np.concatenate([P, -P])[:, None, :])
    M = ((y[:d] - y[d:]) / 2).T @ P / rho**2  # P orthogonal·ρ: P⁻¹ = Pᵀ/ρ²
    c = (y[:d] + y[d:]).mean(axis=0) / 2
    return M, c


class _Layer:
    """The oracle seen through the length-1 part: residuals ``f(X) − M x_N − c`` (K, B)."""

    def __init__(self, oracle, M, c):
        self.oracle, self.M, self.c = oracle, M, c

    def residuals(self, X):
        y = self.oracle(X)
        return (y - X[:, -1, :] @ self.M.T - self.c).T


def _calibrate(layer, rng, d, rho_max):
    """Token norm ρ at which two-row answers are about half nonlinear (logits of order one)."""
    rho = min(1.0, rho_max)
    for _ in range(12):
        b = rng.standard_normal((4, d)) * rho / np.sqrt(d)
        delta = rng.standard_normal((4, d)) * rho / np.sqrt(d)
        R = layer.residuals(np.stack([b + delta, b], axis=1))
        lin = (delta @ layer.M.T).T / 2
        ratio = float(np.median(np.linalg.norm(R - lin, axis=0) / np.maximum(np.linalg.norm(lin, axis=0), 1e-300)))
        if 0.25 <= ratio <= 1.0 or (ratio < 0.25 and rho >= rho_max):
            break
        rho = min(rho_max, rho * float(np.clip(np.sqrt(TARGET_NONLINEARITY / max(ratio, 1e-6)), 0.25, 4.0)))
    return rho, ratio


def extract_vector(oracle, *, heads=None, seed=0, check=True, progress=None, tokens=None, design=None):
    """Recover every head ``(W_h, u_h, V_h)`` and ``c`` of a layer answering K-vectors (module docstring).

    ``heads``: H if known (detected from the rank of the two-row residuals otherwise); ``tokens``: probe tokens
    per query in the logits stage (default 16, or 8 for answers coarser than float64); ``design``: design points
    per difference δ (default max(20, H + q + 6), 48 for coarse answers). Returns an
    :class:`~attnprobe.learners.result.Extraction` whose model is a
    :class:`~attnprobe.models.multihead.MultiHeadAttention` in the vector layout.
    """
    try:
        return _extract(oracle, heads=heads, seed=seed, check=check, progress=progress, tokens=tokens,
                        design=design)
    except RecoveryError as exc:
        eps = float(oracle.eps)
        if eps <= COARSEST_EPS:
            raise
        raise RecoveryError(f"answers in {oracle.precision} (unit roundoff {eps:.1e}, coarser than float32) are too "
                            f"coarse to separate the heads of a whole output row ({exc}); ask for float32 or finer "
                            f"answers; {oracle.queries} queries were spent") from exc


def _extract(oracle, *, heads, seed, check, progress, tokens, design):
    from attnprobe.models.multihead import MultiHeadAttention

    d = oracle.d
    for name, val in (("heads", heads), ("tokens", tokens), ("design", design)):
        if val is not None and not (isinstance(val, (int, np.integer)) and val >= 1):
            raise ConfigError(f"{name} must be a positive integer; got {val!r}", param=name)
    run = Run(oracle, METHOD, seed=seed, check=check, progress=progress)
    rng = run.rng
    eps = max(float(oracle.eps), 1e-16)
    coarse = eps > 1e-10

    max_norm = getattr(oracle, "max_input_norm", None)
    rho_max = np.inf if max_norm is None else float(max_norm) / 3.0
    run.plan(2 * d, f"vector multi-head extraction at d={d} (values stage)", at_least=True)
    notes: list[str] = []
    with run.phase("values"):
        M, c = _values(oracle, rng, min(1.0, rho_max))
    K = M.shape[0]
    if K < 2:
        raise ConfigError("the vector multi-head learner needs answers with K ≥ 2 outputs; use the scalar learners "
                          "for one output", param="method")
    layer = _Layer(oracle, M, c)
    with run.phase("calibrate"):
        rho, ratio = _calibrate(layer, rng, d, rho_max)
    with run.phase("input bound"):
        refuse_clipping(oracle, 3 * rho, seed=int(rng.integers(2**31)))
    if ratio < 30 * eps:
        raise UnidentifiableError(f"two-row answers are affine in the input (nonlinear part {ratio:.1e} of the "
                                  "linear one at the largest probe norm): no head's attention depends on the input")
    # ---------------------------------------------------------------------------------------------- separate
    q = 8 if coarse else 3  # design plane: wider and denser for coarse answers (the fit averages their rounding)
    s = rho / np.sqrt(d)
    b0 = rng.standard_normal(d) * s
    Z = np.linalg.qr(rng.standard_normal((d, q)))[0] * rho
    with run.phase("separate"):
        delta0 = rng.standard_normal(d) * s
        n0 = max(48 if coarse else 24, 2 * (heads or 0) + q + 4)
        T0 = np.zeros((0, q))
        R0 = np.zeros((K, 0))
        while True:  # the residuals' rank is the number of heads: add design points until it shows a gap
            T_new = rng.standard_normal((n0 - len(T0), q)) / np.sqrt(q)
            R0 = np.concatenate([R0, layer.residuals(_two_row(b0 + T_new @ Z.T, delta0))], axis=1)
            T0 = np.concatenate([T0, T_new])
            sv = np.linalg.svd(R0, compute_uv=False)
            floor = 100 * eps * sv[0] * np.sqrt(R0.shape[1])
            found = int(np.sum(sv > floor))
            if found == 0:
                raise RecoveryError("the two-row residuals are all below the answers' rounding: no head's "
                                    "attention is visible at these probes")
            if found < min(R0.shape) - 4:
                break
            if n0 >= K:
                raise RecoveryError(f"the two-row residuals have rank {found} of at most {min(R0.shape)}: more "
                                    "heads than K outputs can separate, or answers noisier than their precision "
                                    "says")
            n0 = min(K, 2 * n0)
        H = found if heads is None else int(heads)
        if heads is not None and found != heads:
            notes.append(f"the two-row residuals have rank {found} where heads={heads} was given"
                         + (": heads with equal (W_h, u_h) attend identically (Prop. 7.1) and merge" if found < heads
                            else ""))
            H = min(found, heads)
        n = design or max(48 if coarse else 20, H + q + 6)  # H² + Hq unknowns, H numbers per design point
        tokens = int(tokens or max(1, min(8 if coarse else 16, K // (2 * H))))  # Hm unknowns ≤ K/2 per query
        per_delta = n
        rest = 4 * H + d * per_delta * (2 if coarse else 1) + (d + 1) * -(-d // tokens)
        # (a difference whose continuation fails is restarted with 4H more queries: charged beyond this plan)
        planned = run.queries + rest
        run.plan(rest,
                 f"vector multi-head extraction at d={d}, H={H} (at most)")
        eta = rho * (1e-5 if eps < 1e-10 else 3e-3)

        def from_scratch(delta, R, T_design):
            """Jennrich on two finite-difference Jacobians (4H queries), then variable projection."""
            U = np.linalg.svd(R, full_matrices=False)[0][:, :H]
            G = rng.standard_normal((d, H)) * s
            Js = []
            for _ in range(2):
                bb = b0 + Z @ (rng.standard_normal(q) / np.sqrt(q))
                Js.append((layer.residuals(_two_row(bb + eta * G.T, delta))
                           - layer.residuals(_two_row(bb - eta * G.T, delta))) / (2 * eta))
            w = jennrich(Js[0], Js[1], U, M @ delta)
            return fit_delta(R, T_design, M @ delta, theta_from_values(w, R, T_design))

        fit0 = from_scratch(delta0, R0, T0)
        tol = _fit_tolerance(eps)
        if fit0.residual > tol:
            raise RecoveryError(f"the heads did not separate along the first probe difference (misfit "
                                f"{fit0.residual:.1e} > {tol:.1e}): the layer is not a sum of H={H} softmax heads "
                                "with independent value maps, or its answers are noisier than their precision")
        T = rng.standard_normal((n, q)) / np.sqrt(q)
        Q = random_orthogonal(d, rng)
        step = SMALL_STEP * np.linalg.norm(delta0)
        far = coarse  # coarse answers: long differences, their labels carried over from short ones
        ws, deltas, worst = [fit0.w], [delta0], fit0.residual
        V, route = None, None
        batch = 16

        restarts = 0

        def separate(dk, thetas):
            nonlocal restarts
            Rk = layer.residuals(np.concatenate([_two_row(b0 + T @ Z.T, dl) for dl in dk]))
            fits = []
            for j, (dl, th) in enumerate(zip(dk, thetas)):
                fk = fit_delta(Rk[:, j * n:(j + 1) * n], T, M @ dl, th)
                if fk.residual > tol:  # the continuation fell into another minimum: start this δ afresh
                    restarts += 1
                    fk = _relabel(from_scratch(dl, Rk[:, j * n:(j + 1) * n], T), th.T, None)
                if fk.residual > tol:
                    raise RecoveryError(f"a probe difference did not separate into the {H} heads found first "
                                        f"(misfit {fk.residual:.1e} > {tol:.1e}); retry with another seed")
                fits.append(fk)
            return fits

        for k0 in range(0, d, batch):
            ks = range(k0, min(d, k0 + batch))
            dk = [delta0 + step * Q[k] for k in ks]
            fits = [_relabel(f, fit0.w, f.w) for f in separate(dk, [fit0.theta] * len(dk))]
            if far:  # θ is linear in δ: extrapolate the short difference's θ to the long one, then fit there
                ratio_far = FAR_STEP / SMALL_STEP
                dk = [delta0 + FAR_STEP * np.linalg.norm(delta0) * Q[k] for k in ks]
                guess = [fit0.theta + ratio_far * (f.theta - fit0.theta) for f in fits]
                fits = [_relabel(f, g.T, f.theta.T) for f, g in zip(separate(dk, guess), guess)]
            for dl, fk in zip(dk, fits):
                worst = max(worst, fk.residual)
                ws.append(fk.w)
                deltas.append(dl)
            run.report()
            if not far and (len(ws) >= 16 and (len(ws) - 1) % 32 == 0 or len(deltas) == d + 1):
                V, route = _value_maps(np.stack(ws, axis=2), np.stack(deltas, axis=1), M, eps,
                                       final=len(deltas) == d + 1)
                if V is not None:
                    break
        if V is None:
            V, route = _value_maps(np.stack(ws, axis=2), np.stack(deltas, axis=1), M, eps, final=True)
    # ------------------------------------------------------------------------------------------------ logits
    with run.phase("logits"):
        rl = LOGIT_SCALE * rho  # many tokens per query: keep the largest logit moderate
        P = rl * random_orthogonal(d, rng)  # token offsets p (rows)
        Bs = np.concatenate([np.zeros((1, d)), rl * random_orthogonal(d, rng)])  # b = 0, then rl·O
        Y = np.empty((H, d, d + 1))  # columns: P (W_h b + u_h) for each b
        smallest = 1.0
        for Pc_idx in chunks(np.arange(d), tokens):
            Pc = P[Pc_idx]
            R = layer.residuals(token_queries(Bs, Pc)).T  # (d+1, K)
            L, sm = read_logits(R, V, Pc)
            smallest = min(smallest, sm)
            Y[:, Pc_idx, :] = L.transpose(1, 2, 0)
            run.report()
        Pb = np.einsum("ed,heb->hdb", P, Y) / rl**2  # W_h b + u_h for each b (P orthogonal·rl)
        u = Pb[:, :, 0]
        W = np.einsum("hdb,be->hde", Pb[:, :, 1:] - u[:, :, None], Bs[1:]) / rl**2
    model = MultiHeadAttention(W, V, u, c)
    details = {"heads": H, "outputs": K, "token_norm": rho, "nonlinearity": ratio, "route": route,
               "differences": len(deltas), "separation_misfit": worst, "restarts": restarts, "tokens_per_query": tokens,
               "smallest_attention": smallest, "head_rank": [int(r) for r in _ranks(V, eps)],
               "largest_probe_norm": float(getattr(oracle, "max_input_norm_used", np.nan)), "check_scale": s,
               "planned": planned}
    return run.finish(model, unknowns=MultiHeadAttention.unknowns(d, H, True, K), details=details, notes=notes,
                      check_scale=s, hint=" (the layer is not a sum of softmax heads over whole output rows, or "
                                          "its answers are coarser than their precision says)")


def _relabel(fit, ref, got):
    """The fit with its heads put in the order of the reference: columns of ``got`` (a view of the fit) matched to
    the nearest columns of ``ref`` (Hungarian assignment), so every difference keeps δ_0's head labels."""
    from scipy.optimize import linear_sum_assignment

    got = fit.theta.T if got is None else got
    cost = np.linalg.norm(got[:, :, None] - ref[:, None, :], axis=0)
    rows, cols = linear_sum_assignment(cost)
    order = rows[np.argsort(cols)]
    fit.w, fit.theta = fit.w[:, order], fit.theta[order]
    return fit


def _two_row(B, delta):
    """Queries ``[b + δ; b]`` for the rows b of ``B``."""
    B = np.atleast_2d(B)
    return np.stack([B + delta, B], axis=1)


def _fit_tolerance(eps):
    """Largest relative misfit of a correct separation: the answers' rounding, generously amplified."""
    return max(1e4 * eps, 1e-11)


def _ranks(V, eps):
    """Numerical rank of each ``V_h`` (singular values above √eps of the largest: the separation's errors are
    far below that, the head dimension's values far above it)."""
    return [int(np.sum(np.linalg.svd(Vh, compute_uv=False) > 10 * np.sqrt(eps) * np.linalg.norm(Vh, 2))) for Vh in V]


def _value_maps(Wv, D, M, eps, final):
    """The value maps ``V_h`` from the separated ``w_h(δ_j) = V_h δ_j`` (``Wv (K, H, m)``, ``D (d, m)``): the
    heads' column spaces split ``M`` when well-conditioned; with d + 1 differences, ``V_h = w_h D⁺`` directly."""
    K, H, m = Wv.shape
    if final:
        return np.einsum("khm,md->hkd", Wv, np.linalg.pinv(D)), "differences"
    bases = []
    for h in range(H):
        Uh, sh, _ = np.linalg.svd(Wv[:, h, :], full_matrices=False)
        r = int(np.sum(sh > max(1e3 * eps, 1e-11) * sh[0]))
        if r >= m - 8:  # the column space is not exhausted yet
            return None, None
        bases.append(Uh[:, :r])
    E = np.concatenate(bases, axis=1)
    if E.shape[1] > K or np.linalg.cond(E) > SUBSPACE_COND:
        return None, None
    coef, *_ = np.linalg.lstsq(E, M, rcond=None)
    if np.linalg.norm(M - E @ coef) > 1e3 * eps * np.linalg.norm(M):
        return None, None
    out, i = [], 0
    for Eh in bases:
        out.append(Eh @ coef[i:i + Eh.shape[1]])
        i += Eh.shape[1]
    return np.stack(out), "column spaces"
