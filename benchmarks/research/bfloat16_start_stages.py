"""Research: the bfloat16 route's start stage by stage (``bfloat16.bfloat16_start``: values, the zero-key sweep's
value maps, the logit maps) on a ``transformers`` LLaMA served in bfloat16 (seed 0), against the float64
module: each head's value map error (heads matched), the start's function error (largest relative error over lengths
up to 256), queries and seconds. No polish.

    PYTHONPATH=src python benchmarks/research/bfloat16_start_stages.py D H G
"""
import sys
import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from attnprobe.learners.positional.bfloat16 import bfloat16_start
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.targets.positional_modules import positional_victim, reference_model

d, H, G = map(int, sys.argv[1:4])
kw = dict(d=d, heads=H, kv_heads=G, seed=0)
truth = reference_model(positional_victim("llama", dtype="float64", **kw))
oracle = oracle_from_torch(positional_victim("llama", dtype="bfloat16", **kw), d, precision="bfloat16")
t0 = time.time()
model, measured = bfloat16_start(oracle, H, np.random.default_rng(0))
V, T = model.value_maps(), truth.value_maps()
C = np.array([[np.linalg.norm(a - b) / np.linalg.norm(b) for b in T] for a in V])
rows, cols = linear_sum_assignment(C)
err = function_error_over_lengths(model, truth, np.random.default_rng(5), (1, 2, 3, 5, 17, 64, 100, 200, 256))
print(f"d={d} {H}/{G}: V_h {np.array2string(C[rows, cols], precision=4)}, "
      f"logit sequences {measured['logit_sequences']}, start {err:.2e}, queries {oracle.queries}, "
      f"{time.time() - t0:.0f}s", flush=True)
