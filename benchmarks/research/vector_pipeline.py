"""Research prototype of the vector-answer multi-head learner, stage by stage against the truth.

    PYTHONPATH=src python benchmarks/research/vector_pipeline.py [layer] [dtype]
"""

from __future__ import annotations

import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from vector_common import minilm_whole_layer  # noqa: E402

from attnprobe.learners.multihead.vector_heads import fit_delta, jennrich, theta_from_values  # noqa: E402
from attnprobe.learners.head.probes import random_orthogonal  # noqa: E402

layer = int(sys.argv[1]) if len(sys.argv) > 1 else 0
dtype = sys.argv[2] if len(sys.argv) > 2 else "float64"
q = int(sys.argv[3]) if len(sys.argv) > 3 else 3
n = int(sys.argv[4]) if len(sys.argv) > 4 else 24
step = float(sys.argv[5]) if len(sys.argv) > 5 else 0.3
true = minilm_whole_layer(layer)
f = true.with_dtype(dtype)
H, K, d = true.v.shape
rng = np.random.default_rng(1)
count = [0]


def ask(X):
    count[0] += len(X)
    return f(X)


rho = 12.0
t0 = time.time()
# (a) length-1
P = rho * random_orthogonal(d, rng)
y = ask(np.concatenate([P, -P])[:, None, :])
M = np.linalg.solve(P, (y[:d] - y[d:]) / 2).T
c = (y[:d] + y[d:]).mean(0) / 2
Mt = true.v.sum(0)
print(f"M err {np.linalg.norm(M - Mt) / np.linalg.norm(Mt):.2e}  "
      f"c err {np.linalg.norm(c - true.c) / np.linalg.norm(true.c):.2e}")


def resid(X):
    out = ask(X)
    return (out - X[:, -1, :] @ M.T - c).T  # (K, B)


# design plane
b0 = rng.standard_normal(d) * rho / np.sqrt(d)
Z = np.linalg.qr(rng.standard_normal((d, q)))[0] * rho
T = rng.standard_normal((n, q)) / np.sqrt(q)


def design(delta, T):
    B = b0 + T @ Z.T
    X = np.stack([B + delta, B], axis=1)
    return X


delta0 = rng.standard_normal(d) * rho / np.sqrt(d)
R0 = resid(design(delta0, T))
sv = np.linalg.svd(R0, compute_uv=False)
print("sv of R0:", np.array2string(sv[:H + 2] / sv[0], precision=2))
U = np.linalg.svd(R0, full_matrices=False)[0][:, :H]
# Jennrich with H random directions
G = rng.standard_normal((d, H)) * rho / np.sqrt(d)
eta = 1e-4 if dtype == "float64" else 1e-2
Js = []
for tb in (rng.standard_normal(q) / np.sqrt(q), rng.standard_normal(q) / np.sqrt(q)):
    bb = b0 + Z @ tb
    Xp = np.stack([np.stack([bb + eta * g + delta0, bb + eta * g]) for g in G.T])
    Xm = np.stack([np.stack([bb - eta * g + delta0, bb - eta * g]) for g in G.T])
    Js.append((resid(Xp) - resid(Xm)) / (2 * eta))
m0 = M @ delta0
w0 = jennrich(Js[0], Js[1], U, m0)
wt = np.einsum("hkd,d->kh", true.v, delta0)


def match(w, wt):
    from scipy.optimize import linear_sum_assignment
    C = np.linalg.norm(w[:, :, None] - wt[:, None, :], axis=0) / np.linalg.norm(wt, axis=0)
    r, cidx = linear_sum_assignment(C)
    return C[r, cidx].max(), cidx


e, _ = match(w0, wt)
print(f"jennrich w err {e:.2e}  queries {count[0]}")
th0 = theta_from_values(w0, R0, T)
fit0 = fit_delta(R0, T, m0, th0)
e, perm = match(fit0.w, wt)
print(f"varpro w err {e:.2e} residual {fit0.residual:.2e}")
# true theta
lt = np.einsum("d,hde->he", delta0, true.W)  # δᵀW_h
tt = np.concatenate([(lt @ Z), (lt @ b0 + true.u @ delta0)[:, None]], axis=1)
print("theta spread", np.round(np.abs(tt).max(1), 2))
# other deltas
Q = random_orthogonal(d, rng)
ws = [fit0.w]
deltas = [delta0]
worst = 0
bad = 0
for k in range(int(sys.argv[6]) if len(sys.argv) > 6 else d):
    dk = delta0 + step * np.linalg.norm(delta0) * Q[k]
    Rk = resid(design(dk, T))
    fk = fit_delta(Rk, T, M @ dk, fit0.theta)
    ws.append(fk.w)
    deltas.append(dk)
    ek, pk = match(fk.w, np.einsum("hkd,d->kh", true.v, dk))
    if not np.array_equal(pk, perm):
        bad += 1
    if k % 32 == 0:
        print(k, f"{ek:.1e} res {fk.residual:.1e} {time.time() - t0:.1f}s", flush=True)
    worst = max(worst, ek)
print(f"per-delta worst w err {worst:.2e}, label changes {bad}, queries {count[0]}, {time.time() - t0:.1f}s")
Wv = np.stack(ws, axis=2)  # (K, H, m)
Dl = np.stack(deltas, axis=1)  # (d, m)
V = np.einsum("khm,md->hkd", Wv, np.linalg.pinv(Dl))
errs = [np.linalg.norm(V[h] - true.v[perm[h]]) / np.linalg.norm(true.v[perm[h]]) for h in range(H)]
print("V_h errors", np.array2string(np.array(errs), precision=1))
print("ranks", [int(np.sum(np.linalg.svd(V[h], compute_uv=False) > 1e-9 * np.linalg.norm(V[h], 2))) for h in range(H)])
np.savez("/tmp/vstage.npz", V=V, M=M, c=c, perm=perm)
# subspace route: C_h = span{w_h(δ_j)}, V_h = P_h M (oblique projector onto C_h along the others)
bases = []
for h in range(H):
    Uh, sh, _ = np.linalg.svd(Wv[:, h, :], full_matrices=False)
    r = int(np.sum(sh > 1e-10 * sh[0]))
    bases.append(Uh[:, :r])
E = np.concatenate(bases, axis=1)
print("stacked basis", E.shape, f"cond {np.linalg.cond(E):.1e}")
coef = np.linalg.lstsq(E, M, rcond=None)[0]
i = 0
errs = []
for h in range(H):
    r = bases[h].shape[1]
    Vh = bases[h] @ coef[i:i + r]
    i += r
    errs.append(np.linalg.norm(Vh - true.v[perm[h]]) / np.linalg.norm(true.v[perm[h]]))
print("V_h errors (subspace route)", np.array2string(np.array(errs), precision=1))
