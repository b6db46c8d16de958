"""The gated drive start (:mod:`attnprobe.learners.smooth_ffn.gated_drive`) against the truth: far from the origin a
gated unit is ``R² w2 relu(g·x̂)(u·x̂)``, and the bends of the answers on circles give each unit's block
``w2 ⊗ span{U g, U u}`` without Jennrich's pencil."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.core.estimate import estimate_queries
from attnprobe.learners.smooth_ffn import gated_learner
from attnprobe.learners.smooth_ffn.derivatives import Asker
from attnprobe.learners.smooth_ffn.drive_start import plane_circle
from attnprobe.learners.smooth_ffn.gated_drive import gated_bends, gated_drive_blocks
from attnprobe.learners.smooth_ffn.gated_learner import extract_gated_ffn
from attnprobe.models.gated_ffn import gated_match
from attnprobe.oracles import Oracle
from attnprobe.targets import random_gated_ffn


def _true_blocks(truth, U, C):
    w = truth.W2 / np.linalg.norm(truth.W2, axis=0)
    return np.array([np.kron(w[:, i][:, None], np.linalg.qr(np.stack([U[:C] @ truth.Wg[i], U[:C] @ truth.Wu[i]],
                                                                     axis=1))[0]) for i in range(truth.m)])


def _block_errors(blocks, true):
    """Each found block's largest principal-angle sine to its nearest true block, and the true blocks matched."""
    errs, used = [], []
    for B in blocks:
        sv = np.linalg.svd(np.einsum("kb,mka->mba", B, true), compute_uv=False)
        j = int(np.argmax(sv[:, 1]))
        used.append(j)
        errs.append(math.sqrt(max(0.0, 1 - sv[j, 1] ** 2)))
    return np.array(errs), used


def test_bends_where_each_gate_crosses_zero():
    """Four SwiGLU units on a circle of radius R: at each of the eight zero crossings of a gate a bend (to 1e-5
    rad) along that unit's ``w2``, with the sign of ``ν(θ0) = u·x̂`` (its slope jump is ``R² w2 |γ'| ν``)."""
    truth = random_gated_ffn(6, 4, 8, seed=3, dtype="float32")
    rng = np.random.default_rng(0)
    p, q = np.linalg.qr(rng.standard_normal((6, 2)))[0].T
    _, X = plane_circle(p, q, 1e6, 4096)
    found = gated_bends(Asker(Oracle(truth, 6, precision="float32"), reserve=0)(X))
    angles = np.array([th for th, _, _ in found])
    for i in range(4):
        g, u, w2 = truth.Wg[i], truth.Wu[i], truth.W2[:, i]
        phi = np.arctan2(g @ q, g @ p)
        for th0 in ((phi + np.pi / 2) % (2 * np.pi), (phi - np.pi / 2) % (2 * np.pi)):  # g·x̂(θ0) = 0
            k = int(np.argmin(np.abs(np.angle(np.exp(1j * (angles - th0))))))
            th, v, _ = found[k]
            assert abs(np.angle(np.exp(1j * (th - th0)))) < 1e-5
            assert abs(v @ w2) / (np.linalg.norm(v) * np.linalg.norm(w2)) > 1 - 1e-6
            assert np.sign(v @ w2) == np.sign(u @ (np.cos(th) * p + np.sin(th) * q))


@pytest.mark.parametrize("seed", [0, 1])
def test_drive_blocks_match_the_truth_on_float32_answers(seed):
    """12-24-12 SwiGLU on float32 answers: every unit found once, its block ``w2 ⊗ span{U g, U u}`` within 3e-2
    (measured: median 3e-4 … 1e-3, worst 1e-2 … 3e-2 over seeds 0–2)."""
    d, m, K, C = 12, 24, 12, 6
    truth = random_gated_ffn(d, m, K, seed=seed, dtype="float32")
    ask = Asker(Oracle(truth, d, precision="float32"), reserve=0)
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((8, d))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    blocks, support, details = gated_drive_blocks(ask, U, C, 1e6 * math.sqrt(d), 4096, m, first=16, more=4, most=32)
    assert len(blocks) >= m and details["units_found"] == len(blocks)
    errs, used = _block_errors(blocks[:m], _true_blocks(truth, U, C))
    assert len(set(used)) == m
    assert np.median(errs) < 5e-3 and errs.max() < 5e-2


def _small_drive(monkeypatch):
    """The learner's drive route on a small FFN: the drive from 9 units up, fewer and shorter circles."""
    monkeypatch.setattr(gated_learner, "COARSE_MAX_UNITS", 8)
    monkeypatch.setattr(gated_learner, "DRIVE_SAMPLES", 4096)
    monkeypatch.setattr(gated_learner, "DRIVE_CIRCLES", 16)


def test_learner_drive_route_on_float32_answers(monkeypatch):
    """Through the learner (the drive start past ``COARSE_MAX_UNITS``, lowered here to 8): 12-24-12 SwiGLU on float32
    answers learned to the answers' rounding, the check right, the queries those of the plan's range."""
    _small_drive(monkeypatch)
    truth = random_gated_ffn(12, 24, 12, seed=4, dtype="float32")
    res = extract_gated_ffn(Oracle(truth, 12, precision="float32"), seed=0, activation="swiglu", hidden=24)
    assert res.details["start"] == "drive" and res.passed
    match = gated_match(truth, res.model)
    assert match["matched_one_to_one"] and match["gate_error"] < 1e-4 and match["up_down_error"] < 1e-4
    est = estimate_queries("ffn", 12, hidden=24, outputs=12, activation="swiglu", precision="float32")
    assert est.low <= res.queries + res.check.queries <= est.high


def test_learner_refuses_when_the_drive_misses_units(monkeypatch):
    """Too few circles to see every unit: the learner refuses (nothing claimed) rather than starting from a
    model with units missing."""
    _small_drive(monkeypatch)
    monkeypatch.setattr(gated_learner, "DRIVE_CIRCLES", 1)
    monkeypatch.setattr(gated_learner, "DRIVE_MOST", 1)
    truth = random_gated_ffn(8, 12, 8, seed=4, dtype="float32")
    with pytest.raises(UnidentifiableError, match="drive start found"):
        extract_gated_ffn(Oracle(truth, 8, precision="float32"), seed=0, activation="swiglu", hidden=12)


def test_estimate_counts_the_drive_past_the_jennrich_start():
    """Past ``COARSE_MAX_UNITS`` units on float32 answers the plan's factors are the drive's first circles, the
    range's top all of them and the further starts."""
    m = gated_learner.COARSE_MAX_UNITS + 1
    est = estimate_queries("ffn", 8, hidden=m, outputs=8, activation="swiglu", precision="float32")
    plan = gated_learner.gated_plan(8, 8, m, coarse=True)
    assert plan["factors"] == gated_learner.DRIVE_CIRCLES * gated_learner.DRIVE_SAMPLES
    assert est.low == est.queries == sum(plan.values()) + gated_learner.CHECK_QUERIES
    assert est.high > est.low + (gated_learner.DRIVE_MOST - gated_learner.DRIVE_CIRCLES) * gated_learner.DRIVE_SAMPLES


@pytest.mark.slow
def test_float32_swiglu_32_64_32_through_the_drive_start():
    """32-64-32 SwiGLU on float32 answers (where the Jennrich start failed): learned through the default route
    (measured: fresh 1.7e-7, 252,988 queries, 16 s)."""
    truth = random_gated_ffn(32, 64, 32, seed=96, dtype="float32")
    res = extract_gated_ffn(Oracle(truth, 32, precision="float32"), seed=0, activation="swiglu", hidden=64)
    assert res.details["start"] == "drive" and res.passed
    match = gated_match(truth, res.model)
    assert match["matched_one_to_one"] and match["gate_error"] < 1e-4


def test_a_width_below_the_units_the_drive_finds_is_named_when_the_check_fails(monkeypatch):
    """``hidden`` given below the true width: the drive sees every unit, the learner keeps ``hidden`` of them and the
    check fails (nothing claimed) — its note, and so the command line's one line, now says how many units the drive
    found and what to give."""
    _small_drive(monkeypatch)
    truth = random_gated_ffn(12, 24, 12, seed=4, dtype="float32")
    res = extract_gated_ffn(Oracle(truth, 12, precision="float32"), seed=0, activation="swiglu", hidden=18)
    assert res.passed is False and res.details["units_found"] == 24
    assert any("found 24 units where the width was given as 18: give hidden=24" in n for n in res.notes)
