"""The float32 RoPE route at wide heads (docs/positional.md, "d = 128: the polish's cost and Qwen2"): the polish's
work cap (:func:`~attnprobe.learners.positional.polish.capped_steps`, wired through the hook), the biased logit maps'
block normal equations, and the wide logit settings on the q/k-bias route — each against the truth."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from attnprobe.learners.core.check import functional_check
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.positional import coarse
from attnprobe.learners.positional.coarse import logit_settings
from attnprobe.learners.positional.coarse_bias import difference_solve, biased_logit_map_queries, biased_logit_maps
from attnprobe.learners.positional.polish import LEAST_STEPS, capped_steps
from attnprobe.learners.positional.polish_hook import polish_extraction
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention
from attnprobe.oracles.base import Oracle
from attnprobe.targets import random_rope_attention


def test_capped_steps_stay_within_the_work_and_never_below_the_least():
    for n, u, rounds, cg, work in itertools.product((10, 500, 2000), (4_000, 60_000), (2, 8), (30, 300),
                                                     (1e8, 3e10, 1e13)):
        r, c = capped_steps(n, u, rounds, cg, work)
        assert 1 <= r <= rounds and 1 <= c <= cg  # never raised
        assert r >= min(rounds, LEAST_STEPS[0]) and c >= min(cg, LEAST_STEPS[1])
        if n * u * rounds * cg <= work:
            assert (r, c) == (rounds, cg)  # within the cap: the plan as asked
        elif (r, c) != (min(rounds, LEAST_STEPS[0]), min(cg, LEAST_STEPS[1])):
            assert n * u * r * c <= work  # cut to the cap unless at the floor
            assert c == min(cg, LEAST_STEPS[1]) or r == rounds  # the steps are cut before the rounds


def test_the_hook_cuts_the_polish_to_its_work_cap_and_still_polishes():
    truth = random_rope_attention(16, 2, 1, seed=3)
    rng = np.random.default_rng(0)
    start = replace(truth, Wq=truth.Wq * (1 + 1e-4 * rng.standard_normal(truth.Wq.shape)))
    oracle = Oracle(truth, 16)
    lengths = (1, 2, 3)
    infos = []
    for work in (None, 20 * truth.unknowns(16, 2, 1, 8, 16) * 2 * 100):
        res = Extraction("positional", start, 100, truth.unknowns(16, 2, 1, 8, 16), 0.0,
                         check=functional_check(oracle, start, rng, lengths, 2))
        polish_extraction(oracle, res, mode="always", sequences=20, lengths=lengths, rounds=2, cg_steps=300,
                          work=work)
        infos.append(res.details["polish"])
    assert [(i["planned_rounds"], i["cg_steps"]) for i in infos] == [(2, 300), (2, 100)]
    assert all(i["ran"] and i["rounds"] <= 2 and i["misfit_after"] < i["misfit_before"] for i in infos)


def test_block_normal_equations_fit_the_log_weight_differences():
    """The differences ``zqᵀ M'_j kx_j − zqᵀ M'_0 kx_0`` of a known ``M'``: the solve reproduces them on fresh
    samples (``M'`` itself only up to the vector common to every offset's last column, which the differences
    cancel)."""
    rng = np.random.default_rng(1)
    B, m, a = 700, 4, 5
    truth = rng.standard_normal((m, a, a))

    def sample(count):
        zq = np.concatenate([rng.standard_normal((count, a - 1)), np.ones((count, 1))], axis=1)
        kx = np.concatenate([rng.standard_normal((count, m, a - 1)), np.ones((count, m, 1))], axis=2)
        s = np.einsum("np,jpq,njq->nj", zq, truth, kx)
        return zq, kx, s - 0.3  # a common shift per sequence cancels in the differences

    zq, kx, ell = sample(B)
    fit = difference_solve(zq, kx, ell).reshape(m, a, a)
    zq, kx, ell = sample(200)
    got = np.einsum("np,jpq,njq->nj", zq, fit, kx)
    want = ell + 0.3
    assert np.abs((got[:, 1:] - got[:, :1]) - (want[:, 1:] - want[:, :1])).max() < 1e-6  # the ridge: ~1e-8
    assert np.abs(fit[:, :, :-1] - truth[:, :, :-1]).max() < 1e-6  # the bilinear blocks and the last rows


def _wide_biased_logit_maps(d: int, H: int):
    """A Qwen2-like layer (q/k/v/o biases), its logit maps by :func:`biased_logit_maps` with the wide settings from
    exact head coordinates and float64 answers: the function error over lengths up to 256, the sequences asked and
    the settings."""
    t = random_rope_attention(d, H, 1, seed=3)
    r = np.random.default_rng(103)
    truth = replace(t, bq=r.standard_normal((H, d // H)) * 0.5, bk=r.standard_normal((1, d // H)) * 0.5,
                    bv=r.standard_normal((1, d // H)) * 0.5, bo=r.standard_normal(d) * 0.1)
    settings = logit_settings(d, d // H)
    oracle = Oracle(truth, d)
    G = np.repeat(truth.Wv, H, axis=0)
    c = truth.output_bias()
    Wq, Wk, bq, bk, count = biased_logit_maps(oracle, np.random.default_rng(1), truth.Wo, G, c, truth.inv_freq, 1.0,
                                              **settings)
    assert count == oracle.queries
    model = PositionalAttention(Wq, Wk, G, truth.Wo, bq=bq, bk=bk, bo=c, inv_freq=truth.inv_freq, scale=1.0)
    return function_error_over_lengths(model, truth, np.random.default_rng(5), (1, 2, 5, 17, 64, 256)), count, settings


def test_wide_settings_on_the_biased_logit_maps_recover_the_function(monkeypatch):
    """The wide settings (``extra = 2d``, no alternating least squares) at d = 16 (2 heads of 8), the dense ALS's
    limit lowered below ``d_h·d`` = 128 so that they apply: the biases and the function from the closed-form steps
    alone; the sequences as counted."""
    monkeypatch.setattr(coarse, "DENSE_ALS", 100)
    err, count, settings = _wide_biased_logit_maps(16, 2)
    assert settings == {"extra": 32, "rounds": 0}
    assert count == biased_logit_map_queries(16, 8, extra=32)
    assert err < 1e-6


@pytest.mark.slow
def test_wide_heads_biased_logit_maps_with_the_wide_settings_recover_the_function():
    """Heads of ``d_h·d`` above the dense ALS (d = 48, 2 heads of 24: 1,152) with q/k biases (~1 min)."""
    err, count, settings = _wide_biased_logit_maps(48, 2)
    assert settings == {"extra": 96, "rounds": 0} and count == biased_logit_map_queries(48, 24, extra=96)
    assert err < 1e-6
