"""Research: the bfloat16 logit maps by one joint fit (``joint_logits.joint_logit_maps``) on a ``transformers``
LLaMA served in bfloat16 (seed 0), the value side the float64 module's own: each head's row spaces of ``W_Q``,
``W_K`` (sine of the largest principal angle against the module's), the groups read, and the start's function error
(largest relative error over lengths up to 256) against the float64 module.

    PYTHONPATH=src python benchmarks/research/bfloat16_joint_logits.py D H G [PER]
"""
import math
import sys
import time

import numpy as np

from attnprobe.learners.positional.coarse import DEFAULT_BASE, TARGET_LOGIT, split_value_maps
from attnprobe.learners.positional.joint_logits import NUMBERS_PER_UNKNOWN, joint_logit_maps
from attnprobe.learners.positional.logit_samples import LOGIT_OFFSETS, log_weights
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention, rope_frequencies
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.targets.positional_modules import positional_victim, reference_model

d, H, G = map(int, sys.argv[1:4])
per = int(sys.argv[4]) if len(sys.argv) > 4 else NUMBERS_PER_UNKNOWN
kw = dict(d=d, heads=H, kv_heads=G, seed=0)
truth = reference_model(positional_victim("llama", dtype="float64", **kw))
oracle = oracle_from_torch(positional_victim("llama", dtype="bfloat16", **kw), d, precision="bfloat16")
V = truth.value_maps()
Cb, Gm = split_value_maps(V, V.sum(0))
K, dh, g = V.shape[1], V.shape[1] // H, H // G
c = np.zeros(K)
rng = np.random.default_rng(0)
t0 = time.time()
offs = np.array(LOGIT_OFFSETS)
ell = log_weights(oracle, Cb, Gm, c, rng.standard_normal((16, len(offs) + 1, d)), np.tile(offs, (16, 1)),
                  int(-offs.min()))
rho = float(np.clip(math.sqrt(TARGET_LOGIT / np.nanmedian(np.abs(ell))), 1e-3, 1e3))
theta = rope_frequencies(dh, DEFAULT_BASE)
Wq, Wk, groups, S = joint_logit_maps(oracle, rng, Cb, Gm, c, theta, rho, per=per)
print(f"{S} sequences, groups {groups.tolist()}, {time.time()-t0:.0f}s", flush=True)


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
