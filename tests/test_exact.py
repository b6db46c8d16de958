"""Thm 4.1: exact recovery with value queries, with and without the biases of real layers."""

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from attnprobe.errors import (BudgetExceededError, OracleAnswerError, RecoveryError, SaturationError,
                              UnidentifiableError)
from attnprobe.learners import extract_exact
from attnprobe.models import AttentionHead
from attnprobe.oracles import Oracle
from attnprobe.targets import random_head
from conftest import rel


def assert_recovered(res, truth, tol):
    m = res.model
    assert rel(m.W, truth.W) <= tol
    assert rel(m.v, truth.v) <= tol
    assert rel(m.u, truth.u) <= tol
    assert abs(m.c - truth.c) <= tol * max(1.0, abs(truth.c))


@pytest.mark.parametrize("d", [16, 64])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 50.0])
@pytest.mark.parametrize("bias", [True, False])
def test_default_probes_recover_to_1e9_with_few_extra_queries(d, scale, bias):
    truth = random_head(d, seed=d, scale=scale, zero_v=d // 4, bias=bias)
    oracle = Oracle(truth, d)
    res = extract_exact(oracle, bias=bias)
    assert_recovered(res, truth, 1e-9)
    assert res.unknowns == (d * d + 2 * d + 1 if bias else d * d + d)
    assert res.unknowns <= res.queries <= 1.02 * res.unknowns
    assert res.details["calibration_queries"] <= 0.02 * res.unknowns
    assert oracle.queries == res.queries + res.check.queries
    assert res.check.error < 1e-9


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 20), seed=st.integers(0, 10**6), log_scale=st.floats(-4, 1.5),
       bias=st.booleans(), zeros=st.integers(0, 5))
@example(d=10, seed=691986, log_scale=1.3132751326074068, bias=True, zeros=1)  # was refused, see below
def test_recovery_is_exact_for_any_head(d, seed, log_scale, bias, zeros):
    truth = random_head(d, seed=seed, scale=10**log_scale, bias=bias, zero_v=min(zeros, d - 1))
    res = extract_exact(Oracle(truth, d), bias=bias, seed=seed)
    assert_recovered(res, truth, 1e-8)


@pytest.mark.parametrize("probes", ["basis", "gaussian"])
@pytest.mark.parametrize("d", [1, 5, 24])
def test_paper_probes_use_exactly_d_plus_d2_queries(probes, d):
    truth = random_head(d, seed=7, bias=False, zero_v=d // 3)
    oracle = Oracle(truth, d)
    res = extract_exact(oracle, probes=probes, bias=False, check=False)
    assert res.queries == oracle.queries == d + d * d
    assert rel(res.model.W, truth.W) < 1e-9 and rel(res.model.v, truth.v) < 1e-12


@pytest.mark.parametrize("probes", ["basis", "gaussian"])
def test_paper_probes_with_bias_use_exactly_the_unknowns(probes):
    d = 12
    truth = random_head(d, seed=3)
    res = extract_exact(Oracle(truth, d), probes=probes, check=False)
    assert res.queries == d * d + 2 * d + 1
    assert_recovered(res, truth, 1e-9)


def test_basis_probes_handle_zero_entries_of_v():
    d = 10
    truth = random_head(d, seed=11, bias=False, zero_v=4)
    assert (truth.v == 0).sum() == 4
    res = extract_exact(Oracle(truth, d), probes="basis", bias=False)
    assert rel(res.model.W, truth.W) < 1e-12
    assert any("zero entries of v" in n for n in res.notes)


def test_unidentifiable_when_v_is_zero():
    d = 6
    base = random_head(d, seed=1)
    for truth in (AttentionHead(base.W, np.zeros(d), base.u, 0.7), AttentionHead(base.W, np.zeros(d))):
        oracle = Oracle(truth, d)
        with pytest.raises(UnidentifiableError, match="v = 0"):
            extract_exact(oracle)
        assert oracle.queries == d + 1  # it stopped right after the length-1 queries


def test_saturated_attention_is_an_error_for_fixed_probes():
    truth = random_head(16, seed=5, scale=200.0)
    with pytest.raises(SaturationError, match="probes='orthogonal'"):
        extract_exact(Oracle(truth, 16), probes="basis")
    # ...while the default probes rescale themselves
    res = extract_exact(Oracle(truth, 16))
    assert_recovered(res, truth, 1e-9)


def test_budget_too_small_fails_before_any_query():
    truth = random_head(8, seed=0)
    oracle = Oracle(truth, 8, budget=100)
    with pytest.raises(BudgetExceededError, match="needs 121 more"):
        extract_exact(oracle)
    assert oracle.queries == 0
    exact_budget = Oracle(random_head(8, seed=0, bias=False), 8, budget=8 * 8 + 8)
    res = extract_exact(exact_budget, probes="basis", bias=False, check=False)
    assert res.queries == 72


def test_non_finite_answers_are_reported():
    truth = random_head(5, seed=2)

    def broken(X):
        y = truth(X)
        if X.shape[1] == 2:
            y[3] = np.nan
        return y

    with pytest.raises(OracleAnswerError, match="non-finite"):
        extract_exact(Oracle(broken, 5))


def test_float32_answers_with_orthogonal_probes_beat_the_papers():
    d = 48
    truth = random_head(d, seed=8, rank=8)
    errs = {}
    for probes in ("orthogonal", "basis", "gaussian"):
        oracle = Oracle(truth.with_dtype("float32"), d, precision="float32")
        errs[probes] = rel(extract_exact(oracle, probes=probes, check=False).model.W, truth.W)
    assert errs["orthogonal"] < 1e-4
    assert errs["orthogonal"] < min(errs["basis"], errs["gaussian"])


def test_result_is_reproducible_and_saves(tmp_path):
    truth = random_head(9, seed=4)
    a = extract_exact(Oracle(truth, 9), seed=3)
    b = extract_exact(Oracle(truth, 9), seed=3)
    assert np.array_equal(a.model.W, b.model.W) and a.queries == b.queries
    npz, js = a.save(tmp_path / "out.npz")
    import json

    summary = json.loads(js.read_text())
    assert {"method", "d", "queries", "seconds", "check"} <= set(summary)
    assert summary["queries"] == a.queries and summary["d"] == 9
    with np.load(npz) as f:
        assert set(f.files) >= {"W", "v", "u", "c"}
        assert np.array_equal(f["W"], a.model.W)


def test_wrong_model_class_is_reported():
    truth = random_head(8, seed=0)  # has biases
    for probes in ("orthogonal", "basis", "gaussian"):
        with pytest.raises(RecoveryError, match="bias=False"):
            extract_exact(Oracle(truth, 8), probes=probes, bias=False)
    # a target whose length-2 answers stay consistent but that is not a head fails the functional check
    def two_heads(X):
        return truth(X) + 0.5 * truth(X[:, ::-1, :])

    res = extract_exact(Oracle(two_heads, 8), probes="gaussian")
    assert not res.check.passed and res.check.error > 1e-3
    assert any("FAILED" in n for n in res.notes)
    ok = extract_exact(Oracle(truth, 8))
    assert ok.check.passed and not ok.notes


def test_float16_answers_do_not_overflow_the_calibration():
    """A target with u = 0 gives zero logits to the u calibration; growing the probes must stop before the
    float16 forward pass overflows (it used to answer NaN)."""
    d = 16
    truth = random_head(d, seed=0, bias=False)
    oracle = Oracle(truth.with_dtype("float16"), d, precision="float16")
    res = extract_exact(oracle)
    assert rel(res.model.W, truth.W) < 5e-2
    assert np.linalg.norm(res.model.u) < 5e-2 * np.linalg.norm(truth.W)  # the true u is 0


@pytest.mark.parametrize("seed, log_scale, pass_refused", [(21, 1.5, "columns 0..0 of W"),
                                                          (9, -4.0, "the query-bias pass")])
def test_a_large_output_bias_is_never_refused_as_outside_the_mixed_values(seed, log_scale, pass_refused):
    """Regression: an exact float64 head whose output bias c dwarfs v (here c ≈ 300 ‖v‖/√d) was refused with
    "answers for {pass_refused} lie outside the two values the attention mixes": y0 = c + bᵀv̂ carries the
    rounding of v̂ (each entry learned from an answer c + v_i, off by ~eps·|c|) times ‖b‖₁, far above
    4 eps |y0|, so a weight near 0 or 1 looked like no convex combination. Now it is saturated and asked again."""
    d = 13
    h = random_head(d, seed=seed, scale=10**log_scale)
    big_c = AttentionHead(h.W, h.v, h.u, 1000 * h.c)
    res = extract_exact(Oracle(big_c, d), seed=seed)
    assert res.passed
    assert rel(res.model.W, h.W) <= 1e-8 and rel(res.model.u, h.u) <= 1e-8


def test_a_saturated_probe_against_a_large_b_is_re_measured_not_refused():
    """Regression (found by a random search over test_recovery_is_exact_for_any_head's domain; 1 in ~45 000 heads):
    a steep head (‖W‖_F = 20.6) whose one-probe calibration under-estimated ν_W put ‖b‖ = 432 in the first column's
    lead probes. Their logits (−69 .. −256) saturate, so the answer sits at y0 = c + bᵀv̂ = 11.3, but y0 is a sum of
    terms of size ‖b‖·‖v‖ ≈ 580 and rounds with them: 3 of 4 answers fell more than 4 eps|y0| below it and the
    exact float64 head was refused as "no softmax average". Now the outside test allows the terms' rounding."""
    d, seed = 10, 691986
    truth = random_head(d, seed=seed, scale=10**1.3132751326074068, zero_v=1)
    res = extract_exact(Oracle(truth, d), seed=seed)
    assert_recovered(res, truth, 1e-12)
    # whether the lead probes saturate hangs on the last bit of the one-probe calibration (a BLAS kernel's
    # rounding), so their re-measurement is accounted for, not pinned; the head must be recovered either way
    assert res.passed and res.queries_by_phase.get("retries", 0) == res.details["retry_queries"]
    assert sum(res.queries_by_phase.values()) == res.queries


@pytest.mark.parametrize("d, seed, log_scale, zeros", [(10, 121105, -0.12131163971078962, 4),
                                                       (10, 691986, 1.3132751326074068, 1)])
def test_a_calibration_that_missed_nu_w_is_corrected_after_the_first_column(d, seed, log_scale, zeros):
    """Regression (random search over the property test's domain, 1 in ~9 000): the one-probe calibration at
    d = 10 under-estimated ν_W by ~280x, so every column was measured with ‖b‖ = 637 against ‖a‖ ≈ 0.03 and W
    came out with error 1.6e-8 (> the 1e-8 the property test demands). The first column, measured with d
    probes, shows the real ν_W: the scales are re-derived and that column is asked again (d queries, rare)."""
    truth = random_head(d, seed=seed, scale=10**log_scale, zero_v=zeros)
    res = extract_exact(Oracle(truth, d), seed=seed)
    assert_recovered(res, truth, 1e-12)
    assert "rebalanced_scales" in res.details and res.queries <= res.unknowns + 3 * d  # one column again + retries


@pytest.mark.parametrize("d, scale", [(16, 300.0), (16, 3000.0), (32, 3000.0)])
def test_steep_heads_cost_at_most_two_percent_over_the_unknowns(d, scale):
    """Heads whose logits saturate unit probes (RMS logit `scale` on unit inputs): the calibration's saturated
    steps size the query bias, saturated probes shrink as far as their saturation proves, and blocks steer from
    their resolved logits, so the whole extraction stays within 1.02x the unknowns, and exact."""
    for seed in range(2):
        h = random_head(d, seed=seed, scale=scale)
        res = extract_exact(Oracle(h, d), seed=0)
        assert res.check.passed and res.queries <= 1.02 * res.unknowns, (seed, res.queries, res.queries_by_phase)
        assert np.linalg.norm(res.model.W - h.W) <= 1e-9 * np.linalg.norm(h.W)


def test_a_steep_one_dimensional_head_is_found_in_a_few_shrinks():
    """d = 1, logits ~1e4 at unit scale and no calibration budget: each saturated retry shrinks by the ~22x its
    saturation proves, and the pass then steers from the resolved logit, so u and W cost at most 6 queries each
    (a 4x-per-retry search needs up to 8)."""
    for seed in range(6):
        h = random_head(1, seed=seed, scale=3000.0)
        res = extract_exact(Oracle(h, 1), seed=0)
        assert res.check.passed and res.queries <= 2 + 6 + 6, (seed, res.queries_by_phase)

def test_same_seed_reproduces_bit_for_bit_on_float32_answers():
    truth = random_head(12, seed=4)
    a, b = (extract_exact(Oracle(truth.with_dtype("float32"), 12, precision="float32"), seed=3) for _ in range(2))
    assert a.queries == b.queries and a.queries_by_phase == b.queries_by_phase and a.check.error == b.check.error
    for name in ("W", "v", "u"):
        np.testing.assert_array_equal(getattr(a.model, name), getattr(b.model, name))
