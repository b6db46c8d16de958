"""Float32 every-position separation: a fit in another minimum is judged by its misfit against the answers' own
rounding (their distance from rank H), not the loose 1e4·eps bound, and dropped, replaced or restarted; a fit that
stays wrong is refused in one line. Wrong fits are real points of the fitting problem (a start off the minimum,
evaluated there) put in place of the learner's fit."""

import numpy as np
import pytest

import attnprobe.learners.multihead.vector as vector
from attnprobe.errors import SeparationError
from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.multihead import vector_heads
from attnprobe.learners.multihead.vector_heads import fit_delta, rank_distance
from attnprobe.models.every_position import EveryPositionLayer
from attnprobe.models.multihead import match_heads
from attnprobe.oracles import Oracle
from vector_layers import progression_problem, true_layer

EPS32 = float(np.finfo(np.float32).eps) / 2


def run(seed=1, **kw):
    truth = true_layer()
    res = extract_every_position(truth, seed, **kw)
    return res, match_heads(truth, res.model)


def extract_every_position(truth, seed):
    return vector.extract_vector(Oracle(EveryPositionLayer(truth.with_dtype("float32")), truth.d,
                                        precision="auto"), seed=seed)


def wrong_point(R, T, m, theta, length, off=3e-4, seed=0):
    """A real point of the fitting problem off its minimum: θ moved by ``off`` (relative), the value vectors by
    least squares there, no iteration."""
    rng = np.random.default_rng(seed)
    bad = theta + off * np.linalg.norm(theta) * rng.standard_normal(theta.shape) / np.sqrt(theta.size)
    return fit_delta(R, T, m, bad, max_nfev=0, length=length)


def test_a_correct_fit_sits_at_the_rank_h_distance_and_a_wrong_point_far_above_it():
    """Rows of progressions ``Σ_h μ(θ_hᵀ[t; k; 1]) w_h`` with float32-sized rounding: the fit's misfit is within
    a few times the block's distance from rank H; a point 3e-4 off is above MISFIT_SPREAD times it, although far
    below the rounding bound 1e4·eps the learner used to accept."""
    rng = np.random.default_rng(3)
    H, N = 4, 6
    T, theta, w, clean = progression_problem(rng, K=48, H=H, q=3, N=N, n=7)
    R = clean + EPS32 * np.abs(clean).max() * rng.standard_normal(clean.shape)
    floor = float(rank_distance(R[None], H)[0])
    assert 0 < floor < 10 * EPS32
    assert rank_distance(clean[None], H)[0] < 1e-12  # exact rows: rank H
    fit = fit_delta(R, T, w.sum(axis=1), theta, length=N)
    assert floor <= fit.residual <= 2 * floor
    wrong = wrong_point(R, T, w.sum(axis=1), theta, N)
    assert vector.MISFIT_SPREAD * floor < wrong.residual < 1e4 * EPS32


def _corrupt(monkeypatch, pick):
    """Replace the fits ``pick(batch, design rows)`` returns (indices) of the learner's batches by wrong points;
    returns the list of misfits put in."""
    put = []
    real = vector.fit_deltas
    calls = []

    def patched(Rs, T, m, theta0, **kw):
        out = real(Rs, T, m, theta0, **kw)
        calls.append(len(T))
        for f in pick(len(calls) - 1, len(T)):
            out[f] = wrong_point(Rs[f], T, m[f], out[f].theta, kw.get("length", 2))
            put.append(out[f].residual)
        return out

    monkeypatch.setattr(vector, "fit_deltas", patched)
    return put


def test_wrong_short_and_long_fits_are_dropped_and_replaced(monkeypatch):
    """One short difference and one long one land in wrong points (misfits the old 1e4·eps bound accepted): the
    short one is dropped, the long one asked again along -q_k (one difference's progressions more), and every head
    comes back as without them."""
    base, base_match = run()
    assert base.passed and base.details["dropped"] == 0
    far = vector.far_progressions(vector.ROWS_Q) * vector.PROGRESSION  # rows of a long difference's design
    seen = {"short": False, "long": False}

    def pick(call, rows):
        kind = "long" if rows == far else "short"
        if seen[kind]:
            return []
        seen[kind] = True
        return [0]

    put = _corrupt(monkeypatch, pick)
    res, match = run()
    assert len(put) == 2 and all(p < vector._fit_tolerance(EPS32) for p in put)  # the old bound took them
    assert res.details["dropped"] == 2 and res.details["restarts"] == 0
    assert res.passed and match.worst < 1e-3
    # the long one: its progressions again; the short one: at most one more batch of 8 short differences (the
    # column spaces may need it to show)
    extra = res.queries_by_phase["separate"] - base.queries_by_phase["separate"] - far // vector.PROGRESSION
    short = vector.progression_points(vector.ROWS_DESIGN_COARSE, vector.PROGRESSION, vector.ROWS_Q)
    assert extra in (0, 8 * short)


def test_a_long_fit_wrong_in_every_round_is_refused_in_one_line(monkeypatch):
    far = vector.far_progressions(vector.ROWS_Q) * vector.PROGRESSION
    _corrupt(monkeypatch, lambda call, rows: [0] if rows == far else [])
    with pytest.raises(SeparationError) as exc:
        run()
    msg = str(exc.value)
    assert "\n" not in msg and "long probe difference" in msg and "retry with another seed" in msg
    assert f"{vector.FAR_ROUNDS - 1} rounds of fresh directions" in msg


def test_a_wrong_first_fit_is_started_again_from_new_jacobians(monkeypatch):
    """The first difference's fit (from scratch, two-row queries) lands in a wrong point: it is started again from
    other Jacobians (4H queries) and the run passes; without the retry it is refused."""
    real = vector.fit_delta
    put = []

    def patched(R, T, m, theta0, **kw):
        fit = real(R, T, m, theta0, **kw)
        if not put:
            fit = wrong_point(R, T, m, fit.theta, kw.get("length", 2))
            put.append(fit.residual)
        return fit

    base, _ = run()
    monkeypatch.setattr(vector, "fit_delta", patched)
    res, match = run()
    assert put[0] < vector._fit_tolerance(EPS32)
    assert res.details["restarts"] == base.details["restarts"] + 1 and res.passed and match.worst < 1e-3
    assert res.queries_by_phase["separate"] == base.queries_by_phase["separate"] + vector.from_scratch_queries(4)
    put.clear()
    monkeypatch.setattr(vector, "FIRST_RETRIES", 0)
    with pytest.raises(SeparationError, match="first probe difference"):
        run()


def test_replacement_directions_keep_the_differences_well_conditioned():
    """-q_k, then q_k turned 45° within Q's span: the replaced basis stays within a factor √2-ish of orthonormal
    (a random direction of the span would leave 1/√d of q_k)."""
    rng = np.random.default_rng(0)
    d, r = 24, 16
    Q = random_orthogonal(d, rng)[:r]  # a span of r directions in R^d
    sep = object.__new__(vector._Separation)
    sep.rng = rng
    for rnd in (0, 1):
        new = sep.replacements(Q[[2, 5]], rnd, Q)
        np.testing.assert_allclose(np.linalg.norm(new, axis=1), 1.0)
        np.testing.assert_allclose(new @ Q.T @ Q, new, atol=1e-12)  # in Q's span
        assert np.all(np.abs(np.sum(new * Q[[2, 5]], axis=1)) >= 0.7)
        D = Q.copy()
        D[[2, 5]] = new
        assert np.linalg.cond(D) < 3


def test_rank_distance_is_batched_and_relative():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((3, 10, 2)) @ rng.standard_normal((3, 2, 12))
    A[1] += 1e-6 * rng.standard_normal((10, 12))
    dist = rank_distance(A, 2)
    assert dist[0] < 1e-14 and dist[2] < 1e-14 and 1e-8 < dist[1] < 1e-5
    np.testing.assert_allclose(rank_distance(7.0 * A, 2), dist, rtol=1e-6, atol=1e-15)
    assert vector_heads.rank_distance is rank_distance
