"""Research: the bfloat16 logit maps by one joint fit, instead of one linear regression per fixed query and offset
(``coarse.logit_maps``): every head's ``W_Q`` and each key/value group's shared ``W_K`` fitted at once by L-BFGS,
from a small random start, to each head's log-weights ``ℓ_hj = (W_Q,h z)ᵀ R(δ_j) W_K,g x_j``
(``logit_samples.log_weights``, weighted by ``reliability``) of fully random sequences (keys at the nine logit
offsets, the query last), on a ``transformers`` LLaMA served in bfloat16 (seed 0; the tokens rounded to bfloat16 as
the layer rounds them). The value side is the float64 module's own, perturbed by ``VALUE_NOISE`` (relative Frobenius
per head, a random direction; ``M`` kept exact: it is read to ~1e-3). Prints each head's row spaces of ``W_Q``,
``W_K`` (sine of the largest principal angle against the module's) and the start's function error (largest
relative error over lengths up to 256) against the float64 module.

    PYTHONPATH=src python benchmarks/research/bfloat16_joint_logits.py D H G SEQUENCES [ROUNDS [VALUE_NOISE [ALS]]]

``ROUNDS`` of 50 L-BFGS steps (default 6); ``ALS``: alternating least-squares rounds per head after them
(``coarse.refine_logit_maps``, default 0). Measured in docs/positional.md ("bfloat16 answers"): not used by the route.
"""
import math
import os
import sys
import time

import ml_dtypes
import numpy as np
import torch

from attnprobe.learners.positional.coarse import DEFAULT_BASE, TARGET_LOGIT, refine_logit_maps, split_value_maps
from attnprobe.learners.positional.logit_samples import LOGIT_OFFSETS, log_weights, reliability
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention, rope_frequencies, rotation_matrix
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.targets.positional_modules import positional_victim, reference_model

d, H, G, S = map(int, sys.argv[1:5])
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 6
noise = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
als = int(sys.argv[7]) if len(sys.argv) > 7 else 0
kw = dict(d=d, heads=H, kv_heads=G, seed=0)
truth = reference_model(positional_victim("llama", dtype="float64", **kw))
oracle = oracle_from_torch(positional_victim("llama", dtype="bfloat16", **kw), d, precision="bfloat16")
V = truth.value_maps()
E = np.random.default_rng(9).standard_normal(V.shape)
V = V + noise * E * (np.linalg.norm(V, axis=(1, 2)) / np.linalg.norm(E, axis=(1, 2)))[:, None, None]
c = np.zeros(V.shape[1])
if os.environ.get("VALUE_MAPS"):  # stage 1 of bfloat16_rows.py: V from the span sweep, M and c from the values
    V = np.load(os.environ["VALUE_MAPS"])["V"]
    c = np.load(os.environ["VALUE_MAPS"].replace("split_", "values_"))["c"]
    print("value maps from", os.environ["VALUE_MAPS"], flush=True)
Cb, Gm = split_value_maps(V, V.sum(0))
K, dh, g = V.shape[1], V.shape[1] // H, H // G
rng = np.random.default_rng(0)
t0 = time.time()
offs = np.array(LOGIT_OFFSETS if not os.environ.get("LONG_OFFSETS") else
                (-1, -2, -4, -8, -16, -32, -64, -100, -150, -200, -255))
span = int(-offs.min())
ell = log_weights(oracle, Cb, Gm, c, rng.standard_normal((16, len(offs) + 1, d)), np.tile(offs, (16, 1)), span)
rho = float(np.clip(math.sqrt(TARGET_LOGIT / np.nanmedian(np.abs(ell))), 1e-3, 1e3))
toks = (rng.standard_normal((S, len(offs) + 1, d)) * rho).astype(ml_dtypes.bfloat16).astype(np.float64)
ell = log_weights(oracle, Cb, Gm, c, toks, np.tile(offs, (S, 1)), span)  # (S, H, 10)
theta = rope_frequencies(dh, DEFAULT_BASE)
R = torch.tensor(np.stack([rotation_matrix(float(o), theta, dh) for o in np.append(offs, 0)]))
ok = np.isfinite(ell)
X, y = torch.tensor(toks), torch.tensor(np.where(ok, ell, 0.0))
w = torch.tensor(np.where(ok, reliability(np.where(ok, ell, 0.0)), 0.0))
member = torch.tensor(np.arange(H) // g)
scale = 1.0 / math.sqrt(d * rho ** 2)
wq = torch.nn.Parameter(torch.tensor(rng.standard_normal((H, dh, d)) * scale))
wk = torch.nn.Parameter(torch.tensor(rng.standard_normal((G, dh, d)) * scale))
opt = torch.optim.LBFGS([wq, wk], lr=1, max_iter=50, history_size=50, tolerance_grad=1e-12, tolerance_change=1e-15,
                        line_search_fn="strong_wolfe")
total = float((w ** 2).sum())


def misfit():
    opt.zero_grad()
    q = torch.einsum("hkd,sd->shk", wq, X[:, -1])
    k = torch.einsum("tab,gbd,std->sgta", R, wk, X)[:, member]  # (S, H, T+1, d_h)
    loss = ((w * (torch.einsum("shk,shtk->sht", q, k) - y)) ** 2).sum() / total
    loss.backward()
    return loss


for r in range(rounds):
    opt.step(misfit)
print(f"{S} sequences, {rounds}x50 L-BFGS steps, misfit {math.sqrt(float(misfit().detach())):.2e}, "
      f"{time.time()-t0:.0f}s", flush=True)
Wq, Wk = wq.detach().numpy(), np.repeat(wk.detach().numpy(), g, axis=0)
if als:  # then each head alone by alternating least squares (coarse.refine_logit_maps: a W_K of its own)
    pairs = [refine_logit_maps(Wq[h], Wk[h], toks, offs, ell[:, h], theta, als) for h in range(H)]
    Wq, Wk = np.stack([q for q, _ in pairs]), np.stack([k for _, k in pairs])
    print(f"then {als} alternating rounds per head, {time.time()-t0:.0f}s", flush=True)


def angle(A, B):
    A = np.linalg.svd(A.T, full_matrices=False)[0]
    B = np.linalg.svd(B.T, full_matrices=False)[0]
    return np.linalg.norm(B - A @ (A.T @ B), 2)


for h in range(H):
    print(f"h{h} rowspace Q {angle(Wq[h], truth.Wq[h]):.3f} K {angle(Wk[h], truth.Wk[h // g]):.3f}", flush=True)
model = PositionalAttention(Wq, Wk, Gm, Cb, bo=c, position="rope", inv_freq=theta, layout="half", scale=1.0,
                            causal=True)
err = function_error_over_lengths(model, truth, np.random.default_rng(5), (1, 2, 3, 5, 17, 64, 100, 200, 256))
print(f"start error {err:.2e}  total {time.time()-t0:.0f}s", flush=True)
