"""Research: the post-norm neurons stage's span at MiniLM's size through C probe directions (docs/block.md,
"Post-norm blocks", stage 7 at MiniLM's size).

MiniLM layer 2's FFN as the block sees it (through n1 and n2), its exact Jacobians restricted to C centred probe
directions U, at N points z_j on n1's sphere orthogonal to U (so the sphere's column correction ``k z_jᵀU`` vanishes
and only n2's ``q_j gᵀ`` is left): ``x_j = Π_q J_j U / r_j`` (``Π_q = I − q qᵀ/d``). Alternating least squares: each
point's correction ``q_j ⊗ g_j`` against the current span (a C × C solve), then one subspace-iteration step of the
corrected points
per sweep the span's sines to the true S (the m factors ``w̃_i (a_iᵀU)`` and the linear part
``P diag(w1) U``, m + 1 of d·C dimensions): largest, median, 90th percentile, and how many within 1e-3.

    PYTHONPATH=src python benchmarks/research/post_norm_neuron_directions.py C N SWEEPS

Exact derivatives (no queries): on answers each point costs 2C + 1 single tokens (central differences along U).
"""
import resource
import sys
import time

import numpy as np
from scipy.special import erf
from attnprobe.oracles.hf_block import block_model, hf_block
from attnprobe.targets.hf import minilm_dir

C, n, sweeps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
t = block_model(hf_block(str(minilm_dir()), 2))
d = t.d
P = np.eye(d) - 1 / d
w1, b1 = t.norm1_w, t.norm1_b
W1, c1, W2, c2 = t.ffn.W1, t.ffn.b1, t.ffn.W2, t.ffn.b2
m = W1.shape[0]
k = m + 1
rng = np.random.default_rng(0)
U = np.linalg.qr(P @ rng.standard_normal((d, C)))[0]          # centred orthonormal probes
Z = rng.standard_normal((n, d))
Z = Z @ P
Z -= (Z @ U) @ U.T
Z /= np.sqrt(np.mean(Z**2, axis=1, keepdims=True))
H = Z * w1 + b1
pre = H @ W1.T + c1
gelu = 0.5 * pre * (1 + erf(pre / np.sqrt(2)))
dgelu = 0.5 * (1 + erf(pre / np.sqrt(2))) + pre * np.exp(-pre**2 / 2) / np.sqrt(2 * np.pi)
Uc = (H + gelu @ W2.T + c2) @ P
r = np.sqrt(np.mean(Uc**2, axis=1))
Q = Uc / r[:, None]
AU = (W1 * w1) @ U                                               # m x C
Wt = P @ W2                                                      # d x m
X = np.empty((n, d, C))
for j in range(n):
    JU = (P * w1) @ U + Wt @ (dgelu[j][:, None] * AU)
    JU = JU - np.outer(Q[j], Q[j] @ JU) / d
    X[j] = JU / r[j]
X = X.reshape(n, d * C)
F = np.hstack([np.einsum("ki,ci->kci", Wt, AU.T).reshape(d * C, m), ((P * w1) @ U).reshape(-1, 1)])
Ftrue = np.linalg.qr(F)[0]
Qh = Q / np.linalg.norm(Q, axis=1, keepdims=True)


def sine(B):
    s = np.linalg.svd(Ftrue.T @ B, compute_uv=False)
    sn = np.sqrt(np.clip(1 - s**2, 0, None))
    return (f"max {sn.max():.2e} median {np.median(sn):.2e} 90% {np.quantile(sn, 0.9):.2e} "
            f"within 1e-3: {(sn < 1e-3).sum()}")


t0 = time.time()
B = np.linalg.svd(X.T, full_matrices=False)[0][:, :k]
print(f"C={C} n={n} dC={d*C} k={k} start sine {sine(B)} ({time.time()-t0:.0f}s)", flush=True)
for s in range(sweeps):
    B3 = B.reshape(d, C, k)
    Y = np.empty_like(X)
    res = 0.0
    for lo in range(0, n, 256):
        hi = min(n, lo + 256)
        M = np.einsum("kcm,jk->jcm", B3, Qh[lo:hi])              # (b, C, k): Cj^T B
        x = X[lo:hi]
        Bx = x @ B                                               # (b, k)
        Cx = np.einsum("jkc,jk->jc", x.reshape(-1, d, C), Qh[lo:hi])  # (b, C)
        rhs = -(Cx - np.einsum("jcm,jm->jc", M, Bx))
        G = np.eye(C)[None] - np.einsum("jcm,jem->jce", M, M)
        g = np.linalg.solve(G, rhs[..., None])[..., 0]
        y = x + (Qh[lo:hi][:, :, None] * g[:, None, :]).reshape(-1, d * C)
        e = y - (y @ B) @ B.T
        res += float(np.sum(e * e))
        Y[lo:hi] = y
    B = np.linalg.qr(Y.T @ (Y @ B))[0]
    print(f"sweep {s+1}: residual {np.sqrt(res/np.sum(X*X)):.2e} sine {sine(B)} ({time.time()-t0:.0f}s)", flush=True)
print("peak GB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
