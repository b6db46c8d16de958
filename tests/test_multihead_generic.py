"""The generic multi-head learner: saturated values, isolated heads, switched-off cross components."""

import numpy as np
import pytest

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.learners.multihead.isolation import IsolatedHead
from attnprobe.models.attention import AttentionHead
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.oracles.base import Oracle
from attnprobe.targets.multihead import random_multihead, shared_attention_multihead


@pytest.mark.parametrize("d,H,d_h,seed", [(8, 2, None, 0), (8, 4, 8, 1), (12, 3, 12, 2), (16, 4, 4, 3),
                                          (16, 2, 16, 4)])
def test_generic_heads_recovered_up_to_permutation(d, H, d_h, seed):
    target = random_multihead(d, H, d_h, seed=seed)
    oracle = Oracle(target, d)
    res = extract_generic(oracle, seed=seed)
    assert res.model.H == H
    match = match_heads(target, res.model)
    assert match.worst <= 1e-6, match.as_dict()
    assert match.c <= 1e-9
    assert res.check.passed and res.check.error <= 1e-8
    # exact accounting: every oracle query is in one phase or in the check, and the paper's bound holds
    assert sum(res.queries_by_phase.values()) == res.queries
    assert res.queries + res.check.queries == oracle.queries
    assert res.queries <= MultiHeadAttention.query_bound(d, H)
    # the cross stage asks exactly H probes per head and last token, twice (the 4L repeat): last tokens are 0 and a
    # basis of W_h's row space (rank d_h), or all of R^d when P_h W_h is full rank on the (d−H+1)-dim S_h
    r = d_h or d // H
    last_tokens = (r if r < d - H + 1 else d) + 1
    assert res.queries_by_phase["cross"] == H * 2 * H * last_tokens
    assert set(res.queries_by_phase) == {"values", "isolated", "cross"}


def test_without_biases():
    target = random_multihead(10, 3, 10, seed=5, bias=False)
    res = extract_generic(Oracle(target, 10), bias=False, seed=1)
    match = match_heads(target, res.model)
    assert match.worst <= 1e-6
    assert np.all(res.model.u == 0) and res.model.c == 0


def test_isolated_head_is_exactly_a_single_head():
    """f(X') − x_Nᵀ(Σv − P_h v_h) equals the head (P_h W_h, P_h v_h, P_h u_h, c) on sequences of any length."""
    target = random_multihead(9, 3, 9, seed=7)
    iso = IsolatedHead(target, target.v, 1, target.v.sum(0))
    P = iso.P
    head = AttentionHead(P @ target.W[1], P @ target.v[1], P @ target.u[1], target.c)
    rng = np.random.default_rng(0)
    for N in (1, 2, 5):
        X = rng.standard_normal((6, N, 9))
        np.testing.assert_allclose(iso(X), head(X), rtol=1e-12, atol=1e-12)


def test_tied_heads_merge_with_a_note():
    """Prop. 7.1: heads sharing W and u cannot be split; they come back as one head computing the same f."""
    target = shared_attention_multihead(10, 3, tied=2, seed=3)
    oracle = Oracle(target, 10)
    res = extract_generic(oracle, heads=3, seed=0)
    assert res.model.H == 2
    assert any("merge" in n for n in res.notes)
    X = np.random.default_rng(1).standard_normal((64, 4, 10))
    gap = np.abs(res.model(X) - target(X)).max() / np.abs(target(X)).max()
    assert gap <= 1e-8
    tied_v = target.v[:2].sum(0)
    assert min(np.linalg.norm(res.model.v - tied_v, axis=1)) <= 1e-8 * np.linalg.norm(tied_v)


def test_too_many_heads_for_the_width_is_refused():
    target = random_multihead(7, 4, 7, seed=0)  # found H = 4 heads, but the switch-off probe needs d ≥ 2H
    with pytest.raises(UnidentifiableError, match="d ≥ 2H"):
        extract_generic(Oracle(target, 7))
    with pytest.raises(UnidentifiableError, match="at most 3 heads"):  # refused before any query
        extract_generic(Oracle(target, 7, budget=0), heads=4)


def test_max_heads_is_enforced():
    target = random_multihead(12, 3, 12, seed=0)
    with pytest.raises(UnidentifiableError, match="max_heads"):
        extract_generic(Oracle(target, 12), max_heads=2)


def test_attention_that_ignores_the_probe_is_refused():
    """W = 0 and u = 0: every head attends uniformly, F is linear, the heads cannot be told apart."""
    target = MultiHeadAttention(np.zeros((2, 6, 6)), np.random.default_rng(0).standard_normal((2, 6)))
    with pytest.raises(UnidentifiableError, match="linear in the probe"):
        extract_generic(Oracle(target, 6))


def test_torch_multihead_attention_layer():
    """A real ``torch.nn.MultiheadAttention`` (float64, biases, d_h = d/H) read at one output row."""
    import torch

    from attnprobe.oracles.torch_adapter import oracle_from_torch
    from attnprobe.oracles.torch_multihead import TorchMultiheadRow, multihead_from_torch

    torch.manual_seed(3)
    module = TorchMultiheadRow(12, 3, row=2)
    with torch.no_grad():
        module.attn.in_proj_bias.normal_(0, 0.5)  # torch initialises the biases to 0: make u_h and c visible
        module.attn.out_proj.bias.normal_(0, 0.5)
    truth = multihead_from_torch(module)
    res = extract_generic(oracle_from_torch(module, 12), seed=0)
    assert res.model.H == 3
    assert match_heads(truth, res.model).worst <= 1e-6
    assert res.check.passed


def test_budget_is_refused_before_the_first_query():
    from attnprobe.errors import BudgetExceededError

    target = random_multihead(16, 2, 16, seed=0)
    oracle = Oracle(target, 16, budget=50)
    with pytest.raises(BudgetExceededError):
        extract_generic(oracle)
    assert oracle.queries == 0


def test_cli_generic_multihead_with_the_head_dimension_given(tmp_path):
    """--rank reaches the generic learner: every isolated head is sketched at rank d_h, heads recovered exactly."""
    import json

    from attnprobe.cli import main
    from attnprobe.models import load_model, save_model
    from attnprobe.models.multihead import match_heads
    from attnprobe.targets import random_multihead

    truth = random_multihead(16, 2, 4, seed=5)
    t = save_model(truth, tmp_path / "layer.npz")
    out = tmp_path / "got.npz"
    assert main(["extract", "--target", str(t), "--method", "multihead", "--rank", "4", "--quiet",
                 "--out", str(out)]) == 0
    got = load_model(out)
    assert match_heads(truth, got).worst <= 1e-6
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["passed"] is True
    assert sum(summary["queries_by_phase"].values()) == summary["queries"] <= 4 * 2 * 16**2 - 2 * 2 + 1
