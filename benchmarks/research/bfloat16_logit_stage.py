"""Research: the bfloat16 route's logit maps at a cheap setting, the value side the float64 module's own.

``coarse.logit_maps``' stages (a)–(c) without its alternating refinement, ``KSETS`` fixed key sets and ``QSETS``
fixed queries of ``d + EXTRA`` sequences each and ``SAMPLES·d_h²`` free ones, on a ``transformers`` LLaMA served in
bfloat16 (seed 0), each head's output space and ``G`` the float64 module's: the row spaces of ``W_Q``, ``W_K`` (sine
of the largest principal angle against the module's) and the start's function error (largest relative error over
lengths up to 256).

    PYTHONPATH=src python benchmarks/research/bfloat16_logit_stage.py D H G KSETS QSETS EXTRA SAMPLES
"""
import math
import sys
import time

import numpy as np

from attnprobe.learners.positional.coarse import (DEFAULT_BASE, LOGIT_OFFSETS, TARGET_LOGIT, log_weights,
                                                  reliability, split_value_maps)
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention, rope_frequencies, rotation_matrix
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.targets.positional_modules import positional_victim, reference_model

d, H, G = map(int, sys.argv[1:4])
ksets, qsets, extra, samples = map(int, sys.argv[4:8])
kw = dict(d=d, heads=H, kv_heads=G, seed=0)
truth = reference_model(positional_victim("llama", dtype="float64", **kw))
oracle = oracle_from_torch(positional_victim("llama", dtype="bfloat16", **kw), d, precision="bfloat16")
V = truth.value_maps()
M = V.sum(0)
Cb, Gm = split_value_maps(V, M)
K = M.shape[0]
dh = K // H
c = np.zeros(K)
rng = np.random.default_rng(0)
t0 = time.time()
offs = np.array(LOGIT_OFFSETS)
m = len(offs)
span = int(-offs.min())
probe = rng.standard_normal((16, m + 1, d))
ell = log_weights(oracle, Cb, Gm, c, probe, np.tile(offs, (16, 1)), span)
rho = float(np.clip(math.sqrt(TARGET_LOGIT / np.nanmedian(np.abs(ell))), 1e-3, 1e3))
theta = rope_frequencies(dh, DEFAULT_BASE)
def reg(F, y):
    ok = np.isfinite(y)
    w = reliability(y[ok])
    return np.linalg.lstsq(F[ok] * w[:, None], y[ok] * w, rcond=None)[0]
n = d + extra
seqs, Us, Vs = [], [], []
for _ in range(ksets):
    toks = np.repeat(rng.standard_normal((1, m + 1, d)) * rho, n, axis=0)
    toks[:, -1] = rng.standard_normal((n, d)) * rho
    e = log_weights(oracle, Cb, Gm, c, toks, np.tile(offs, (n, 1)), span)
    Us.append(np.stack([[reg(toks[:, -1], e[:, h, j]) for j in range(m)] for h in range(H)]))
    seqs.append((toks, e))
for _ in range(qsets):
    toks = rng.standard_normal((n, m + 1, d)) * rho
    toks[:, -1] = rng.standard_normal(d) * rho
    e = log_weights(oracle, Cb, Gm, c, toks, np.tile(offs, (n, 1)), span)
    Vs.append(np.stack([[reg(toks[:, j], e[:, h, j]) for j in range(m)] for h in range(H)]))
    seqs.append((toks, e))
free = samples * dh * dh
toks = rng.standard_normal((free, m + 1, d)) * rho
seqs.append((toks, log_weights(oracle, Cb, Gm, c, toks, np.tile(offs, (free, 1)), span)))
Us, Vs = np.concatenate(Us, 1), np.concatenate(Vs, 1)
toks = np.concatenate([t for t, _ in seqs])
ell = np.concatenate([e for _, e in seqs])
print(f"sequences {len(toks)} asked in {time.time()-t0:.0f}s rho {rho:.2f}", flush=True)
R = [rotation_matrix(float(o), theta, dh) for o in offs]
g = H // G
def angle(A, B):
    return np.linalg.norm(B - A @ (A.T @ B), 2)
Wq, Wk, red = [], [], []
for h in range(H):
    U = np.linalg.svd(Us[h].T, full_matrices=False)[0][:, :dh]
    Vv = np.linalg.svd(Vs[h].T, full_matrices=False)[0][:, :dh]
    tq = np.linalg.svd(truth.Wq[h].T, full_matrices=False)[0]
    tk = np.linalg.svd(truth.Wk[h // g].T, full_matrices=False)[0]
    zq = toks[:, -1] @ U
    Ms = []
    for j in range(m):
        kx = toks[:, j] @ Vv
        Ms.append(reg((zq[:, :, None] * kx[:, None, :]).reshape(len(zq), -1), ell[:, h, j]).reshape(dh, dh))
    ref = np.linalg.inv(Ms[0])
    eye = np.eye(dh)
    rows = [np.kron((ref @ Ms[j]).T, eye) - np.kron(eye, R[j] @ R[0].T) for j in range(1, m)]
    null = np.linalg.svd(np.concatenate(rows), full_matrices=False)[2][-dh:]
    Ak = (rng.standard_normal(dh) @ null).reshape(dh, dh, order="F")
    lhs = np.concatenate([R[j] @ Ak for j in range(m)], axis=1)
    AqT = np.linalg.lstsq(lhs.T, np.concatenate(Ms, axis=1).T, rcond=None)[0].T
    Wq.append(AqT.T @ U.T)
    Wk.append(Ak @ Vv.T)
    print(f"h{h} rowspace Q {angle(U, tq):.3f} K {angle(Vv, tk):.3f}", flush=True)
Wq, Wk = np.array(Wq), np.array(Wk)
model = PositionalAttention(Wq, Wk, Gm, Cb, bo=c, position="rope", inv_freq=theta, layout="half", scale=1.0,
                            causal=True)
err = function_error_over_lengths(model, truth, np.random.default_rng(5), (1, 2, 3, 5, 17, 64, 100, 200, 256))
print(f"start error {err:.2e}  total {time.time()-t0:.0f}s", flush=True)
