"""Thm 5.1: rank-one measurements from two-row queries and nuclear-norm recovery through cvxpy."""

import json

import numpy as np
import pytest

from attnprobe.cli import main
from attnprobe.errors import ConfigError, RecoveryError
from attnprobe.learners.core.check import check_queries
from attnprobe.learners.head.scaling import LogitProbe
from attnprobe.learners.head.nuclear import (default_measurements, extract_nuclear, nuclear_solve, polish,
                                             rop_measurements)
from attnprobe.models import save_model
from attnprobe.oracles import Oracle
from attnprobe.targets import random_head

import cvxpy  # noqa: F401  (the test extra installs it: these tests run, never skip)
from conftest import rel


def test_rop_measurements_are_bilinear_forms():
    d = 10
    h = random_head(d, rank=2, seed=1)
    o = Oracle(h, d)
    rng = np.random.default_rng(0)
    Ga, Gb = rng.standard_normal((30, d)), rng.standard_normal((30, d))
    A, B, t, noise = rop_measurements(LogitProbe(o, h.v, h.c), Ga, Gb, 1.0, 1.0, h.u)
    assert o.queries == 30
    np.testing.assert_allclose(t, np.sum((A @ h.W) * B, axis=1), atol=1e-12)
    assert np.all(noise < 1e-12)


def test_cvxpy_path_recovers_small_head_exactly():
    d, r = 12, 1
    h = random_head(d, rank=r, seed=3)
    o = Oracle(h, d)
    res = extract_nuclear(o, rank=r, seed=0)
    m = default_measurements(d, r)
    assert res.details["measurements"] == m and res.details["solver"] == "SCS"
    assert rel(res.model.W, h.W) <= 1e-6 and rel(res.model.u, h.u) <= 1e-8
    # exact count: v, c, u (2d + 1) + calibration + m measurements, + saturated measurements asked again (adaptive,
    # chaotic in the answers' last bit: accounted for in their own phase, never pinned)
    ph = res.queries_by_phase
    assert ph["values"] + ph.get("query_bias", 0) == 2 * d + 1 and ph["measurements"] == m
    assert ph["calibration"] == res.details["calibration_queries"] and sum(ph.values()) == res.queries
    assert res.queries == 2 * d + 1 + res.details["calibration_queries"] + m + ph.get("retries", 0)
    assert set(ph) <= {"values", "calibration", "query_bias", "measurements", "retries"}
    assert o.queries == res.queries + check_queries()
    assert res.details["solution_rank"] == r


def test_convex_solution_alone_is_exact_to_solver_tolerance():
    d, r = 10, 1
    h = random_head(d, rank=r, seed=4, bias=False)
    o = Oracle(h, d)
    res = extract_nuclear(o, rank=r, bias=False, refine=False, seed=1)
    assert rel(res.model.W, h.W) <= 1e-6
    assert "polish_residual" not in res.details


def test_clarabel_solver_small_case():
    d, r = 6, 1
    h = random_head(d, rank=r, seed=5, bias=False)
    rng = np.random.default_rng(2)
    m = default_measurements(d, r)
    A, B = rng.standard_normal((m, d)) / np.sqrt(d), rng.standard_normal((m, d)) / np.sqrt(d)
    t = np.sum((A @ h.W) * B, axis=1)
    W, name, info = nuclear_solve(A, B, t, "clarabel")
    assert name == "CLARABEL" and rel(W, h.W) <= 1e-5
    W2, _ = polish(W, A, B, t, r)
    assert rel(W2, h.W) <= 1e-10


def test_polish_converges_from_a_perturbed_start():
    d, r = 16, 2
    h = random_head(d, rank=r, seed=6, bias=False)
    rng = np.random.default_rng(3)
    m = 4 * (2 * d * r)
    A, B = rng.standard_normal((m, d)) / np.sqrt(d), rng.standard_normal((m, d)) / np.sqrt(d)
    t = np.sum((A @ h.W) * B, axis=1)
    W, res = polish(h.W + 1e-3 * rng.standard_normal((d, d)), A, B, t, r)
    assert rel(W, h.W) <= 1e-10


def test_too_few_measurements_give_a_clear_error():
    d, r = 12, 2
    h = random_head(d, rank=r, seed=7)
    with pytest.raises(RecoveryError, match="raise the 'measurements' parameter"):
        extract_nuclear(Oracle(h, d), rank=r, measurements=20)


def test_configuration_errors():
    h = random_head(8, rank=1, seed=1)
    with pytest.raises(ConfigError, match="'rank' parameter"):
        extract_nuclear(Oracle(h, 8))
    with pytest.raises(ConfigError):
        extract_nuclear(Oracle(h, 8), rank=9)
    big = random_head(400, rank=2, seed=1)
    o = Oracle(big, 400)
    with pytest.raises(ConfigError, match="lowrank"):
        extract_nuclear(o, rank=2)
    assert o.queries == 0  # refused before asking


def test_cli_nuclear(tmp_path):
    h = random_head(10, rank=1, seed=9)
    target = tmp_path / "t.npz"
    save_model(h, target)
    out = tmp_path / "r.npz"
    assert main(["extract", "--target", str(target), "--method", "nuclear", "--rank", "1", "--out", str(out),
                 "--quiet"]) == 0
    s = json.loads(out.with_suffix(".json").read_text())
    assert s["method"] == "nuclear" and s["details"]["measurements"] == default_measurements(10, 1)
    assert rel(np.load(out)["W"], h.W) <= 1e-6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_between_dof_and_transition_never_silent_garbage(seed):
    """m above the degrees of freedom but below the phase transition: a clear error or the right W."""
    d, r = 12, 2
    h = random_head(d, rank=r, seed=20 + seed)
    try:
        res = extract_nuclear(Oracle(h, d), rank=r, measurements=2 * d * r - r * r + 6, seed=seed)
    except RecoveryError as exc:
        assert "'measurements' parameter" in str(exc)
    else:
        assert rel(res.model.W, h.W) <= 1e-6
