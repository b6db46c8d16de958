"""Research: the post-norm neurons stage's span at MiniLM's size by Gauss–Newton on the Grassmannian, the per-point
corrections eliminated (variable projection) — the step docs/block.md ("Post-norm blocks", stage 7 at MiniLM's
size) proposed after the alternating least squares of ``post_norm_neuron_directions.py`` crawled.

The same data: MiniLM layer 2's exact Jacobians restricted to C centred probe directions U, at N points z_j on n1's
sphere orthogonal to U, ``x_j = Π_q J_j U / r_j``; each ``x_j + q̂_j ⊗ g_j`` lies in the (m + 1)-span S for the
right ``g_j`` (C numbers). For a basis B (dC × k) of the current span, ``g_j`` minimises the residual
``e_j = (I − BBᵀ)(x_j + N_j g_j)`` (``N_j = q̂_j ⊗ I_C``), ``c_j = Bᵀ(x_j + N_j g_j)``. Linearised in a step Δ ⊥ B
and the corrections' steps, the latter eliminated, the normal equations are
``A(Δ) = Q[Δ Σ c_j c_jᵀ − Σ_j P_j Δ c_j c_jᵀ] = Σ_j e_j c_jᵀ`` (``P_j`` the projector onto ``Q N_j``, Q = I − BBᵀ):
symmetric positive semidefinite in the Frobenius product, solved by conjugate gradients preconditioned by
``(Σ c_j c_jᵀ)⁻¹`` (one step of which is the alternating least squares' sweep). Then ``B ← orth(B + Δ)``.

    PYTHONPATH=src python benchmarks/research/post_norm_neuron_span_newton.py C N STEPS CG [ALS] [--save F]

prints per step the residual, the CG's relative residual, the span's sines to the true S (largest, median, 90th
percentile, count within 1e-3) and, with ``--spectrum``, the smallest eigenvalues of the preconditioned A (Lanczos
from the CG's coefficients): a near-zero one is a free direction. ``--step=H``: central differences of the exact
``q(z)`` at step H (the answers' route) in place of exact Jacobians; ``--load=F`` / ``--save=F``: the span's basis;
``--true-span``: S itself. The steps past the span (docs/block.md, "The span by Gauss–Newton …"):
``--rank-one=STARTS`` (Newton in α; ``--alphas=F`` keeps the α's found and resumes, ``--seconds=T`` stops,
``--deflate`` / ``--near=R`` / ``--rest`` the start variants measured; ``--cover=STARTS`` the deflated pencil that
finds them all, ``--plain`` its starts without deflation), ``--extend=NB:CB`` (the directions past the
probes) and ``--curves=EVERY`` (n1's weight and every EVERY-th neuron's curve).
"""
import resource
import sys
import time

import numpy as np
from scipy.special import erf

from attnprobe.oracles.hf_block import block_model, hf_block
from attnprobe.targets.hf import minilm_dir

args = [a for a in sys.argv[1:] if not a.startswith("--")]
C, n, steps, cg_iters = (int(a) for a in args[:4])
als = int(args[4]) if len(args) > 4 else 0
save = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--save=")), None)
load = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--load=")), None)
spectrum = "--spectrum" in sys.argv
layer = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--layer=")), 2)
step = next((float(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--step=")), None)
starts = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--rank-one=")), 0)
found_file = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--alphas=")), None)
curves = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--curves=")), 0)
extend = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--extend=")), None)
deflate = "--deflate" in sys.argv
rest = "--rest" in sys.argv
near = next((float(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--near=")), None)
seconds = next((float(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--seconds=")), 1e9)
cover = next((int(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--cover=")), 0)
plain = "--plain" in sys.argv

t = block_model(hf_block(str(minilm_dir()), layer))
d = t.d
P = np.eye(d) - 1 / d
w1, b1 = t.norm1_w, t.norm1_b
W1, c1, W2, c2 = t.ffn.W1, t.ffn.b1, t.ffn.W2, t.ffn.b2
m = W1.shape[0]
k = m + 1
rng = np.random.default_rng(0)
U = np.linalg.qr(P @ rng.standard_normal((d, C)))[0]          # centred orthonormal probes
Z = rng.standard_normal((n, d)) @ P
Z -= (Z @ U) @ U.T
Z /= np.sqrt(np.mean(Z**2, axis=1, keepdims=True))
H = Z * w1 + b1
pre = H @ W1.T + c1
gelu = 0.5 * pre * (1 + erf(pre / np.sqrt(2)))
dgelu = 0.5 * (1 + erf(pre / np.sqrt(2))) + pre * np.exp(-pre**2 / 2) / np.sqrt(2 * np.pi)
Uc = (H + gelu @ W2.T + c2) @ P
r = np.sqrt(np.mean(Uc**2, axis=1))
Qo = Uc / r[:, None]
AU = (W1 * w1) @ U                                               # m x C
Wt = P @ W2                                                      # d x m
X = np.empty((n, d, C))


def q_of(Zs):
    """The centred unit answer q(z) read through n2 (rows of Zs)."""
    Hs = Zs * w1 + b1
    ps = Hs @ W1.T + c1
    us = (Hs + 0.5 * ps * (1 + erf(ps / np.sqrt(2))) @ W2.T + c2) @ P
    return us / np.sqrt(np.mean(us**2, axis=1, keepdims=True))


for j in range(n):
    if step is None:  # exact
        JU = (P * w1) @ U + Wt @ (dgelu[j][:, None] * AU)
        X[j] = (JU - np.outer(Qo[j], Qo[j] @ JU) / d) / r[j]
    else:  # central differences along U at this step (the answers' route: 2C single tokens a point)
        X[j] = (q_of(Z[j] + step * U.T) - q_of(Z[j] - step * U.T)).T / (2 * step)
X = X.reshape(n, d * C)
F = np.hstack([np.einsum("ki,ci->kci", Wt, AU.T).reshape(d * C, m), ((P * w1) @ U).reshape(-1, 1)])
Ftrue = np.linalg.qr(F)[0]
Qh = Qo / np.linalg.norm(Qo, axis=1, keepdims=True)
xs = float(np.sqrt(np.sum(X * X)))


def sine(B):
    """The sines of the principal angles between span(B) and S, as the singular values of B's part off S (accurate
    down to rounding, unlike √(1 − cos²))."""
    sn = np.linalg.svd(B - Ftrue @ (Ftrue.T @ B), compute_uv=False)
    return (f"max {sn.max():.2e} median {np.median(sn):.2e} 90% {np.quantile(sn, 0.9):.2e} "
            f"within 1e-3: {(sn < 1e-3).sum()}")


def corrections(B):
    """Per point: (unused), ``S_j = (I − M_j M_jᵀ)⁻¹``, the optimal c_j, e_j (the library's
    :func:`attnprobe.learners.block.post_norm_probe_span.point_corrections`)."""
    from attnprobe.learners.block.post_norm_probe_span import point_corrections

    return (None, *point_corrections(B, X, Qh, C))


def project(B, D):
    return D - B @ (B.T @ D)


def operator(B, S, c, Mc, D):
    """A(Δ) = Q[Δ Σ c cᵀ − Σ_j P_j Δ c_j c_jᵀ]."""
    T = (D @ c.T).reshape(d, C, n)                               # Δ c_j, columns
    w = np.einsum("jce,je->jc", S, np.einsum("dcj,jd->jc", T, Qh))
    V = np.empty((d, C, k))
    for e in range(C):
        V[:, e] = Qh.T @ (w[:, e:e + 1] * c)
    return project(B, D @ Mc - V.reshape(d * C, k))


def gn_step(B, iters):
    Mj, S, c, E = corrections(B)
    res = float(np.sqrt(np.sum(E * E))) / xs
    Mc = c.T @ c
    Minv = np.linalg.inv(Mc)
    G = project(B, E.T @ c)
    D = np.zeros_like(B)
    R = G.copy()
    Zp = R @ Minv
    Pd = Zp.copy()
    rz = float(np.sum(R * Zp))
    g0 = float(np.sqrt(np.sum(R * R)))
    alphas, betas = [], []
    for _ in range(iters):
        AP = operator(B, S, c, Mc, Pd)
        a = rz / float(np.sum(Pd * AP))
        D += a * Pd
        R -= a * AP
        Zp = R @ Minv
        rz_new = float(np.sum(R * Zp))
        b = rz_new / rz
        alphas.append(a)
        betas.append(b)
        rz = rz_new
        Pd = Zp + b * Pd
    cg = float(np.sqrt(np.sum(R * R))) / g0
    eig = None
    if spectrum and len(alphas) > 1:  # Lanczos tridiagonal of the preconditioned operator from the CG coefficients
        Tm = np.zeros((len(alphas), len(alphas)))
        for i, a in enumerate(alphas):
            Tm[i, i] = 1 / a + (betas[i - 1] / alphas[i - 1] if i else 0)
            if i + 1 < len(alphas):
                Tm[i, i + 1] = Tm[i + 1, i] = np.sqrt(betas[i]) / a
        eig = np.linalg.eigvalsh(Tm)
    return np.linalg.qr(B + D)[0], res, cg, eig


def als_sweep(B):
    _, _, c, E = corrections(B)
    Y = E + c @ B.T
    return np.linalg.qr(Y.T @ (Y @ B))[0], float(np.sqrt(np.sum(E * E))) / xs


def rank_one(B, total, batch=32, iters=14, pool=4096):
    """Rank-one d × C elements ``w ⊗ α`` of span(B): Newton on the unit sphere of α ∈ R^C for the largest
    eigenvalue of ``K(α) = Σ α_c α_e B_c B_eᵀ`` (``B_c`` the rows of B at probe c, d × k), which is 1 exactly where
    some ``w ⊗ α`` lies in the span (w its eigenvector); exact Hessian from the eigendecomposition. ``batch`` starts
    at a time, each the candidate (of ``pool`` random ones) farthest from every α found so far. Prints, per batch,
    how many converged (1 − λ < 1e-12), the distinct factors, how many true factors they match (|cos| of α and of w
    above 1 − 1e-8), and the time."""
    B3 = B.reshape(d, C, k)
    G = np.empty((C, C, d, d))
    for c in range(C):
        for e in range(c, C):
            G[c, e] = B3[:, c, :] @ B3[:, e, :].T
            G[e, c] = G[c, e].T
    Gf = G.reshape(C * C, d * d)
    At = AU / np.linalg.norm(AU, axis=1, keepdims=True)
    Wn = Wt / np.linalg.norm(Wt, axis=0)
    alphas = np.zeros((0, C))
    rest_n, Br = -1, None
    if found_file and __import__("os").path.exists(found_file):
        alphas = np.load(found_file)["alphas"]
    matched = np.zeros(m, bool)
    if len(alphas):
        matched[np.max(np.abs(At @ alphas.T), axis=1) > 1 - 1e-8] = True
    t1 = time.time()
    for lo in range(0, total, batch):
        cand = rng.standard_normal((pool, C))
        cand /= np.linalg.norm(cand, axis=1, keepdims=True)
        if len(alphas) and rest:  # starts from random elements of the span's part off the factors found
            if len(alphas) != rest_n:
                Kf = (np.einsum("bc,be->bce", alphas, alphas).reshape(len(alphas), C * C) @ Gf).reshape(-1, d, d)
                wf = np.linalg.eigh(Kf)[1][:, :, -1]
                found_f = np.einsum("bx,bc->xcb", wf, alphas).reshape(d * C, -1)
                Bc = B.T @ found_f
                Br = B @ np.linalg.svd(Bc, full_matrices=True)[0][:, len(alphas):]
                rest_n = len(alphas)
            S3 = (Br @ rng.standard_normal((Br.shape[1], batch))).T.reshape(batch, d, C)
            cand = np.linalg.eigh(np.einsum("bkc,bke->bce", S3, S3))[1][:, :, -1]
        elif len(alphas) and near:  # starts beside found α's (clusters of nearly parallel α_i)
            cand = alphas[rng.integers(0, len(alphas), batch)] + near * rng.standard_normal((batch, C))
            cand /= np.linalg.norm(cand, axis=1, keepdims=True)
        elif len(alphas):
            score = 1 - np.max(np.abs(cand @ alphas.T), axis=1)
            cand = cand[np.argsort(-score)[:batch]]
        a = cand[:batch].copy()
        l1_all, v1_all = np.zeros(batch), np.zeros((batch, d))
        act = np.arange(batch)
        for it in range(iters):
            K = (np.einsum("bc,be->bce", a[act], a[act]).reshape(len(act), C * C) @ Gf).reshape(len(act), d, d)
            lam, V = np.linalg.eigh(K)
            v1, l1 = V[:, :, -1], lam[:, -1]
            l1_all[act], v1_all[act] = l1, v1
            done = 1 - l1 < 1e-12
            act, V, lam, v1, l1 = act[~done], V[~done], lam[~done], v1[~done], l1[~done]
            if not len(act):
                break
            Gv = np.einsum("cexy,by->bcex", G, v1, optimize=True)
            GTv = np.einsum("ceyx,by->bcex", G, v1, optimize=True)
            Dv = np.einsum("be,bcex->bcx", a[act], Gv + GTv)               # D_c v1
            g = np.einsum("bcx,bx->bc", Dv, v1)
            W = np.einsum("bcx,bxl->bcl", Dv, V[:, :, :-1]) / np.sqrt(l1[:, None, None] - lam[:, None, :-1]
                                                                        + 1e-300)
            H = 2 * np.einsum("bcex,bx->bce", Gv, v1) + 2 * np.einsum("bcl,bel->bce", W, W)
            for b_, o in enumerate(act):
                Pt = np.eye(C) - np.outer(a[o], a[o])
                gt = Pt @ g[b_]
                ev, EV = np.linalg.eigh(Pt @ (H[b_] - 2 * l1[b_] * np.eye(C)) @ Pt)
                keep = np.abs(EV.T @ a[o]) < 0.5
                if np.all(ev[keep] < 0):
                    stepv = -EV[:, keep] @ ((EV[:, keep].T @ gt) / ev[keep])
                    if deflate and len(alphas):  # Farrell's deflation: Newton on η·∇λ, η = Π(|α ∓ α_i|⁻² + 1)
                        sg = np.sign(alphas @ a[o])[:, None]
                        diff = a[o] - sg * alphas
                        r2 = np.sum(diff * diff, axis=1)
                        u = np.sum((-2 * diff / r2[:, None] ** 2) / (1 / r2 + 1)[:, None], axis=0)
                        stepv = stepv / (1 - u @ stepv)
                else:
                    stepv = 0.1 * gt / max(np.linalg.norm(gt), 1e-300)
                nrm = np.linalg.norm(stepv)
                a[o] = a[o] + (stepv * 0.3 / nrm if nrm > 0.3 else stepv)
                a[o] /= np.linalg.norm(a[o])
        ok = 1 - l1_all < 1e-12
        for b_ in np.flatnonzero(ok):
            if len(alphas) == 0 or np.max(np.abs(alphas @ a[b_])) < 1 - 1e-8:
                alphas = np.vstack([alphas, a[b_]])
                i = int(np.argmax(np.abs(At @ a[b_])))
                if abs(At[i] @ a[b_]) > 1 - 1e-8 and abs(Wn[:, i] @ v1_all[b_]) > 1 - 1e-8:
                    matched[i] = True
        if found_file:
            np.savez(found_file, alphas=alphas)
        print(f"rank-one starts {lo + batch}: {ok.sum()} of {batch} converged, distinct {len(alphas)}, true "
              f"factors matched {matched.sum()} of {m} ({time.time() - t1:.0f}s)", flush=True)
        if len(alphas) >= m or time.time() - t1 > seconds:
            break


def coverage(B, total):
    """Every factor by the deflated pencil (:func:`attnprobe.learners.block.post_norm_factors.probe_factors`),
    resumed from ``--alphas=F`` (the α's of the plain search or of this: polished, each w from K(α)), saved
    there after every batch; ``--plain`` the same starts on K(α) alone. Prints per batch the factors found and the
    true ones matched (α and w to |cos| 1 − ``--match``, default 1e-8; 1e-6 on a span from differences), and at
    the end :func:`~attnprobe.learners.block.post_norm_factors.factors_complete`."""
    import os

    from attnprobe.learners.block import post_norm_factors as pf

    At = AU / np.linalg.norm(AU, axis=1, keepdims=True)
    Wn = Wt / np.linalg.norm(Wt, axis=0)
    W, A = np.zeros((0, d)), np.zeros((0, C))
    if found_file and os.path.exists(found_file):
        saved = np.load(found_file)
        A = saved["alphas"] if "alphas" in saved else saved["A"]
        W, A = pf.polish_factors(B, d, C, A)  # the plain search's α's (1 − λ < 1e-12) to the rounding, w from K(α)
    t1 = time.time()
    print(f"cover: {len(W)} factors to start from", flush=True)

    tol = next((float(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--match=")), 1e-8)

    def log(done, W, A):
        hit = (np.max(np.abs(At @ A.T), axis=1) > 1 - tol) & (np.max(np.abs(Wn.T @ W.T), axis=1) > 1 - tol)
        if found_file:
            np.savez(found_file, W=W, A=A)
        print(f"cover starts {done}: factors {len(W)}, true matched {hit.sum()} of {m} ({time.time() - t1:.0f}s)",
              flush=True)
        if time.time() - t1 > seconds:
            raise TimeoutError

    try:
        W, A = pf.probe_factors(B, d, C, m, rng, total, found=(W, A), deflate=not plain, log=log)
    except TimeoutError:
        return
    ok, detail = pf.factors_complete(B, W, A, U)
    print(f"cover: complete {ok} {detail} ({time.time() - t1:.0f}s)", flush=True)


def extension(nb, Cb):
    """The neurons' directions past the probes U: C_b more centred directions U_b, ``nb`` points orthogonal to U and
    U_b. Each point's U-Jacobian, corrected by ``q̂ ⊗ g``, has coordinates ĉ_j on the unit factors ``ŵ_i ⊗ α̂_i``
    (signs arbitrary, as the rank-one search returns them) and the span's direction ℓ orthogonal to them; then
    ``x^b_j + q̂_j g_jᵀ = Σ_i ĉ_ij ŵ_i θ_iᵀ + ĉ_ℓj Λ`` is linear in ``θ_i = U_bᵀa_i/|Uᵀa_i|`` (m × C_b), Λ (d × C_b)
    and g_j: one least squares for all C_b columns. Prints its size, rank, condition and θ's error per neuron."""
    rs = np.random.default_rng(5)
    sgn = rs.choice([-1.0, 1.0], m)
    nA = np.linalg.norm(AU, axis=1)
    What = Wt / np.linalg.norm(Wt, axis=0) * sgn
    Fh = np.einsum("ki,ic->kci", What, AU / nA[:, None]).reshape(d * C, m)
    ell = F[:, m] - Fh @ np.linalg.lstsq(Fh, F[:, m], rcond=None)[0]
    basis = np.hstack([Fh, (ell / np.linalg.norm(ell))[:, None]])
    Ub = np.linalg.qr(np.hstack([U, P @ rs.standard_normal((d, Cb))]))[0][:, C:]
    UU = np.hstack([U, Ub])
    t1 = time.time()
    rows, rhs = [], []
    for j in range(nb):
        z = P @ rs.standard_normal(d)
        z -= UU @ (UU.T @ z)
        z /= np.sqrt(np.mean(z**2))
        if step is None:
            xs_, qz = exact_jacobian(z, UU)
        else:
            xs_ = ((q_of(z + step * UU.T) - q_of(z - step * UU.T)).T / (2 * step))
            qz = q_of(z[None])[0]
        qh = qz / np.linalg.norm(qz)
        sol = np.linalg.lstsq(np.hstack([basis, np.kron(qh[:, None], np.eye(C))]), xs_[:, :C].reshape(-1),
                              rcond=None)[0]
        A = np.zeros((d, m + d + nb))
        A[:, :m] = What * sol[:m]
        A[:, m:m + d] = sol[m] * np.eye(d)
        A[:, m + d + j] = qh
        rows.append(A)
        rhs.append(xs_[:, C:])
    A, R = np.vstack(rows), np.vstack(rhs)
    sol, _, rank, sv = np.linalg.lstsq(A, R, rcond=None)
    true = ((W1 * w1) @ Ub) / nA[:, None]
    e = np.linalg.norm(sol[:m] - true, axis=1) / np.linalg.norm(true, axis=1)
    print(f"extension nb={nb} Cb={Cb}: {A.shape[0]} x {A.shape[1]}, rank {rank}, condition {sv[0] / sv[-1]:.2e}, "
          f"misfit {np.linalg.norm(A @ sol - R) / np.linalg.norm(R):.1e}; θ relative error median "
          f"{np.median(e):.1e} 90% {np.quantile(e, 0.9):.1e} max {e.max():.1e} ({time.time() - t1:.0f}s)", flush=True)


def neuron_curves_through_probes(B, every):
    """Past the factors (taken as the rank-one search returns them: unit, signs arbitrary) and the full directions
    (``â_i = a_i/|Uᵀa_i|``, as the extension returns them): the span's element ``P diag(w) U`` (n1's weight up to
    scale, a null vector), every point's coordinates on ``[ŵ_i ⊗ α̂_i…, P diag(w) U]`` (its correction from B),
    and per neuron (every ``every``-th) the ratio to the linear part's, ``κ σ'(s t + c)`` with ``t = â_i·z_j``,
    fitted by :func:`attnprobe.learners.block.post_norm_neurons.derivative_curve`. Prints n1's weight's error
    (up to scale) and the neurons' ``s â_i`` against ``a_i`` and ``c`` against the true bias."""
    from attnprobe.learners.block.post_norm_neurons import derivative_curve

    t1 = time.time()
    Gm = np.einsum("ki,ic->kci", P, U).reshape(d * C, d)             # columns vec(P e_i e_iᵀ U)
    w = np.linalg.svd(Gm - B @ (B.T @ Gm), full_matrices=False)[2][-1]
    w_err = np.linalg.norm(w / (w @ w1) * (w1 @ w1) - w1) / np.linalg.norm(w1)
    rs = np.random.default_rng(5)
    sgn = rs.choice([-1.0, 1.0], m)
    nA = np.linalg.norm(AU, axis=1)
    Fh = np.einsum("ki,ic->kci", Wt / np.linalg.norm(Wt, axis=0) * sgn, AU / nA[:, None]).reshape(d * C, m)
    basis = np.hstack([Fh, ((P * w) @ U).reshape(-1, 1)])
    _, _, cB, _ = corrections(B)
    coef = np.linalg.solve(B.T @ basis, cB.T)                        # (m + 1) × n
    ratio = coef[:m] / coef[m]
    ahat = (W1 * w1) / nA[:, None]
    bias = W1 @ b1 + c1
    errs, berrs, mis = [], [], []
    for i in range(0, m, every):
        (kappa, s_, c_), misfit = derivative_curve(Z @ ahat[i], ratio[i], "gelu")
        errs.append(abs(s_ - nA[i]) / nA[i])
        berrs.append(abs(c_ - bias[i]) / max(1.0, abs(bias[i])))
        mis.append(misfit)
    errs, berrs = np.array(errs), np.array(berrs)
    print(f"curves: n1's weight {w_err:.1e} off (up to scale); {len(errs)} neurons: |a_i| relative error median "
          f"{np.median(errs):.1e} max {errs.max():.1e}, bias error median {np.median(berrs):.1e} max "
          f"{berrs.max():.1e}, curve misfit max {max(mis):.1e} ({time.time() - t1:.0f}s)", flush=True)


def exact_jacobian(z, V):
    """``Π_q J V / r`` at the sphere point z (exact) and q."""
    h = z * w1 + b1
    p = h @ W1.T + c1
    dg = 0.5 * (1 + erf(p / np.sqrt(2))) + p * np.exp(-p**2 / 2) / np.sqrt(2 * np.pi)
    u = (h + (0.5 * p * (1 + erf(p / np.sqrt(2)))) @ W2.T + c2) @ P
    rr = np.sqrt(np.mean(u**2))
    q = u / rr
    JV = (P * w1) @ V + Wt @ (dg[:, None] * ((W1 * w1) @ V))
    return (JV - np.outer(q, q @ JV) / d) / rr, q


t0 = time.time()
if "--true-span" in sys.argv:  # S itself (what the Gauss–Newton steps reach to 6e-14): for the steps past it
    B = Ftrue
elif load:
    B = np.load(load)["B"]
else:
    B = np.linalg.svd(X.T, full_matrices=False)[0][:, :k]
print(f"layer {layer} C={C} n={n} dC={d*C} k={k} start sine {sine(B)} ({time.time()-t0:.0f}s)", flush=True)
for s in range(als):
    B, res = als_sweep(B)
    print(f"als {s+1}: residual {res:.2e} sine {sine(B)} ({time.time()-t0:.0f}s)", flush=True)
for s in range(steps):
    B, res, cg, eig = gn_step(B, cg_iters)
    line = f"gn {s+1}: residual before {res:.2e} cg {cg:.1e} sine {sine(B)} ({time.time()-t0:.0f}s)"
    if eig is not None:
        line += f" ritz low {eig[:3]} high {eig[-1]:.2f}"
    print(line, flush=True)
    if save:
        np.savez(save, B=B)
if starts:
    rank_one(B, starts)
if cover:
    coverage(B, cover)
if curves:
    neuron_curves_through_probes(B, curves)
if extend:
    extension(*(int(v) for v in extend.split(":")))
_, _, _, E = corrections(B)
print(f"final residual {np.sqrt(np.sum(E * E)) / xs:.2e}; peak GB",
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
