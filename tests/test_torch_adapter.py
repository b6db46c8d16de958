"""Torch adapters: a real nn.MultiheadAttention + Linear/ReLU/Linear victim, extracted and written back."""

import numpy as np
import pytest
import torch

from attnprobe.errors import OracleError
from attnprobe.models import neuron_errors
from attnprobe.learners.transformer import extract_transformer
from attnprobe.oracles.torch_adapter import (TorchOneLayerTransformer, oracle_from_torch, transformer_from_torch,
                                             transformer_to_torch)
from attnprobe.targets import random_transformer


def victim(d=8, m=8, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return TorchOneLayerTransformer(d, m, dtype=dtype).eval()


def run(module, X):
    with torch.no_grad():
        return module(torch.as_tensor(X, dtype=next(module.parameters()).dtype)).double().numpy()


def test_paper_parameters_of_a_torch_victim_reproduce_it():
    vic = victim(6, 5, dtype=torch.float64)
    truth = transformer_from_torch(vic)
    X = np.random.default_rng(0).standard_normal((16, 4, 6))
    np.testing.assert_allclose(truth(X), run(vic, X), rtol=1e-10, atol=1e-13)


def test_written_back_module_computes_the_model():
    tf = random_transformer(6, 9, seed=1)
    mod = transformer_to_torch(tf, dtype=torch.float64)
    X = np.random.default_rng(1).standard_normal((16, 5, 6))
    np.testing.assert_allclose(run(mod, X), tf(X), rtol=1e-10, atol=1e-13)
    sd = mod.state_dict()
    assert {"attn.in_proj_weight", "attn.out_proj.weight", "fc1.weight", "fc2.weight"} <= set(sd)


def test_oracle_precision_follows_the_module():
    assert oracle_from_torch(victim()).precision == "float32"
    assert oracle_from_torch(victim(dtype=torch.float64)).precision == "float64"
    with pytest.raises(OracleError):
        oracle_from_torch(lambda X: X, d=3)


@pytest.mark.parametrize("d,m", [(8, 8), (8, 16), (16, 16)])
def test_float32_victim_end_to_end(d, m):
    vic = victim(d, m, seed=0)
    truth = transformer_from_torch(vic)
    o = oracle_from_torch(vic)
    res = extract_transformer(o, seed=0)
    assert np.linalg.norm(res.model.W - truth.W) / np.linalg.norm(truth.W) <= 1e-3
    rec = transformer_to_torch(res.model)
    X = np.random.default_rng(2).standard_normal((256, 5, d))
    a, b = run(vic, X), run(rec, X)
    # float32 precision: m = 2d used to lose a weak neuron (3e-3 .. 1e-2); at (8, 8) the orientation solve sat on a
    # knife edge (cond(J) ≈ 1.4e3: the true signs' residual, 1.96e-3·‖v‖ from float32 jump errors, against a
    # 2.0e-3 tolerance, so another CPU's float32 rounding gave 7.6e-4): every neuron must be found, oriented and
    # matched one to one, and the function then agrees to a few float32 roundings of the attention part
    ffn = res.details["ffn"]
    assert ffn["neurons_found"] == m and ffn["orientation_exact"]
    err = neuron_errors(truth.A, truth.w_o, res.model.A, res.model.w_o)
    assert err["matched_one_to_one"] and err["recovered_neurons"] == m and err["direction_error"] <= 1e-4
    assert np.linalg.norm(a - b) / np.linalg.norm(a) <= 3e-5
    qb = res.details["query_breakdown"]
    assert qb["attention"] + qb["ffn"] == res.queries


@pytest.mark.parametrize("seed", [1, 2])
def test_float32_victims_that_pass_their_check_are_right(seed):
    """Other float32 victims at d = m = 16 (seed 0 above is not the only one): whatever the CPU's rounding path
    (which neuron a line misses hangs on the answers' last bits), a run whose check passes agrees with the victim
    to within that check's tolerance, and here every one passes (measured: 1.4e-4 and 2e-6 off, default and
    ATEN_CPU_CAPABILITY=default)."""
    vic = victim(16, 16, seed=seed)
    res = extract_transformer(oracle_from_torch(vic), seed=0)
    X = np.random.default_rng(2).standard_normal((256, 5, 16))
    a, b = run(vic, X), run(transformer_to_torch(res.model), X)
    assert res.check.passed and np.linalg.norm(a - b) / np.linalg.norm(a) <= 3 * res.check.tolerance
    assert sum(res.queries_by_phase.values()) == res.queries


def test_float64_victim_is_exact():
    vic = victim(8, 8, seed=3, dtype=torch.float64)
    truth = transformer_from_torch(vic)
    res = extract_transformer(oracle_from_torch(vic), seed=0)
    assert np.linalg.norm(res.model.W - truth.W) / np.linalg.norm(truth.W) <= 1e-9
    assert res.check["relative_error"] <= 1e-8
