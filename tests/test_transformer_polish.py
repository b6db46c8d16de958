"""The transformer learner's last step: Gauss–Newton / Levenberg–Marquardt on W_h, u_h (and every parameter) with
the model's exact Jacobian, judged on held-out sequences; and the refusal of rank-1 value maps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.transformer.regions import extract_transformer_multihead
from attnprobe.learners.transformer.polish import (LEVELS, Stacked, polish_attention, polish_sequences,
                                                   refine)
from attnprobe.models.transformer import MultiHeadTransformer, transformer_errors
from attnprobe.oracles.base import Oracle
from attnprobe.targets import random_multihead_transformer


@pytest.mark.parametrize("residual", [False, True])
def test_jacobian_operator_is_the_models_derivative(residual):
    """Adjoint identity ⟨Jθ, r⟩ = ⟨θ, Jᵀr⟩ and central differences of the model along θ, every parameter group."""
    t = random_multihead_transformer(6, 2, 7, outputs=3, bias=True, residual=residual, seed=3)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 4, 6))
    lin = Stacked(t, [(X, t(X)), (X[:, :2], t(X[:, :2]))], LEVELS["all"])
    theta = rng.standard_normal(lin.size)
    r = rng.standard_normal(2 * 40 * 3)
    assert abs(lin.matvec(theta) @ r - theta @ lin.rmatvec(r)) <= 1e-10 * np.linalg.norm(r)
    step = 1e-3 * rng.standard_normal(lin.size)
    h = 1e-4
    fd = np.concatenate([(lin.step(h * step)(Xb) - lin.step(-h * step)(Xb)).reshape(-1) / (2 * h)
                         for Xb in (X, X[:, :2])])
    keep = np.concatenate([p.keep for p in lin.parts])
    assert np.max(np.abs(fd * keep - lin.matvec(step))) <= 1e-7 * np.max(np.abs(fd))


@pytest.mark.parametrize("level,size,gain", [("scores", 1e-6, 1e5), ("all", 1e-8, 30)])
def test_polish_undoes_a_perturbation(level, size, gain):
    """From a target perturbed in the polished groups, the polish gains a factor ``gain`` on every seed (the
    scores converge to rounding; every parameter at once converges slower: LSQR stops at 400 iterations a step)."""
    for seed in range(3):
        t = random_multihead_transformer(6, 2, 8, outputs=2, bias=True, seed=20 + seed)
        rng = np.random.default_rng(seed)
        noisy = replace(t, **{g: getattr(t, g) + size * rng.standard_normal(np.shape(getattr(t, g)))
                              for g in LEVELS[level]})
        before = transformer_errors(t, noisy, seed=1)["function"]
        oracle = Oracle(t, 6)
        got, report, held = polish_attention(oracle, noisy, rng, level=level)
        assert oracle.queries == sum(len(X) for X, _ in held.values()) == polish_sequences(noisy, level)
        assert report.kept and report.after < report.before / gain
        assert transformer_errors(t, got, seed=1)["function"] <= before / gain


def test_polish_never_keeps_a_step_the_held_out_sequences_reject():
    """A true model cannot be improved: nothing is kept and the model comes back unchanged."""
    t = random_multihead_transformer(6, 2, 8, outputs=1, bias=True, seed=5)
    got, report, _ = polish_attention(Oracle(t, 6), t, np.random.default_rng(0), level="scores")
    assert got is t and not report.kept and report.steps == 0


# the four seeds (~6 s) in `-m slow`; the default run keeps seed 8687, where the region stages alone leave 2.4e-7
# (measured; 1.1e-8 on 8688, below 1e-8 on the other two)
@pytest.mark.parametrize("seeds", [pytest.param((8686, 8687, 8688, 8689), marks=pytest.mark.slow, id="seeds-8686-8689"),
                                   pytest.param((8687,), id="seed-8687")])
def test_learner_reaches_1e8_on_every_seed_only_with_the_polish(seeds):
    """d = 8, H = 6, m = 16, K = 10: the region stages alone leave function errors above 1e-8 on some of these seeds;
    with the polish every seed is within 1e-8 (the rate, not one run's number)."""
    polished, raw = [], []
    for seed in seeds:
        t = random_multihead_transformer(8, 6, 16, outputs=10, bias=True, seed=seed)
        for how, out in (("auto", polished), ("none", raw)):
            res = extract_transformer_multihead(Oracle(t, 8), seed=seed, polish=how)
            out.append(bool(res.passed) and transformer_errors(t, res.model, seed=seed)["function"] <= 1e-8)
            if how == "auto":
                assert res.queries_by_phase["polish"] > 0
            else:
                assert "polish" not in res.queries_by_phase or res.queries_by_phase["polish"] == 0
    assert all(polished)
    assert not all(raw)


def test_polish_option_is_checked_before_any_query():
    t = random_multihead_transformer(6, 2, 8, seed=0)
    oracle = Oracle(t, 6)
    with pytest.raises(ConfigError, match="polish must be one of"):
        extract_transformer_multihead(oracle, polish="newton")
    assert oracle.queries == 0
    with pytest.raises(ConfigError, match="polish"):
        refine(oracle, t, np.random.default_rng(0), "newton")


def test_polish_is_skipped_when_the_budget_cannot_pay_for_it():
    t = random_multihead_transformer(6, 2, 8, seed=0)
    oracle = Oracle(t, 6, budget=polish_sequences(t, "scores") - 1)
    got, reports = refine(oracle, t, np.random.default_rng(0), "auto")
    assert got is t and reports == [] and oracle.queries == 0


@pytest.mark.parametrize("d,H,m,K,seed", [(8, 2, 8, 1, 0), (8, 3, 16, 3, 0), (12, 4, 16, 1, 1)])
def test_rank_one_value_maps_are_refused_naming_the_cause(d, H, m, K, seed):
    t = random_multihead_transformer(d, H, m, outputs=K, head_dim=1, seed=seed)
    with pytest.raises(UnidentifiableError, match="rank ≥ 2"):
        extract_transformer_multihead(Oracle(t, d), seed=seed)


@pytest.mark.parametrize("d,H,m,K,residual,seed", [(3, 2, 2, 2, False, 0), (4, 1, 3, 1, False, 0),
                                                   (3, 2, 5, 2, True, 0), (4, 3, 6, 3, True, 1)])
def test_unknowns_is_the_rank_of_the_models_jacobian(d, H, m, K, residual, seed):
    """``MultiHeadTransformer.unknowns`` counts what queries determine: the rank of the Jacobian of TF in every
    parameter, over sequences of several lengths on which every neuron is both on and off somewhere."""
    t = random_multihead_transformer(d, H, m, outputs=K, bias=True, residual=residual, head_dim=d, seed=seed)
    rng = np.random.default_rng(0)
    blocks = [(X, t(X)) for X in (rng.standard_normal((300, N, d)) for N in (1, 2, 3, 5))]
    lin = Stacked(t, blocks, LEVELS["all"])
    on = np.concatenate([p.relu for p in lin.parts]) > 0
    assert np.all(on.any(axis=0)) and np.all((~on).any(axis=0))  # generic: no dead and no always-on neuron
    J = np.array([lin.matvec(e) for e in np.eye(lin.size)]).T
    s = np.linalg.svd(J, compute_uv=False)
    assert int(np.sum(s > 1e-9 * s[0])) == MultiHeadTransformer.unknowns(d, H, m, K, residual)



def test_a_budget_too_small_for_the_polish_skips_it_and_says_so():
    t = random_multihead_transformer(8, 2, 12, outputs=3, bias=True, residual=True, seed=1)
    full = extract_transformer_multihead(Oracle(t, 8), seed=0)
    before = full.queries - full.queries_by_phase["polish"]
    res = extract_transformer_multihead(Oracle(t, 8, budget=before + full.check.queries + 1), seed=0)
    assert res.queries == before and res.details["polish"] == []
    assert any("polish was skipped" in note for note in res.notes)
    assert not any("polish was skipped" in note for note in full.notes)


def test_a_step_the_held_out_sequences_reject_is_not_kept_even_below_the_floor():
    """The true model answering with fresh noise of 1e-6, no floor: a Gauss–Newton step fits the fit sequences'
    noise (their residual drops) and makes the held-out ones worse, so it is not kept: the model comes back as
    it was and the held-out residual never rises."""
    from attnprobe.oracles.wrappers import FreshNoise

    t = random_multihead_transformer(6, 2, 8, outputs=2, bias=True, seed=5)
    for level in ("scores", "all"):
        oracle = Oracle(FreshNoise(t, 1e-6, seed=3), 6)
        got, report, _ = polish_attention(oracle, t, np.random.default_rng(1), level=level, floor=0.0)
        assert got is t and not report.kept and report.after <= report.before


def test_auto_escalates_to_every_parameter_when_the_scores_leave_a_residual():
    """A model off in its FFN (A, w_o) by 1e-7: polishing W_h, u_h cannot mend it (residual above ESCALATE), so
    "auto" goes on to every parameter, which does; "scores" stops there."""
    from attnprobe.learners.transformer.polish import ESCALATE

    t = random_multihead_transformer(6, 2, 8, outputs=2, bias=True, seed=21)
    rng = np.random.default_rng(2)
    noisy = replace(t, A=t.A + 1e-7 * rng.standard_normal(t.A.shape),
                    w_o=t.w_o + 1e-7 * rng.standard_normal(t.w_o.shape))
    _, scores_only = refine(Oracle(t, 6), noisy, np.random.default_rng(0), "scores")
    assert [r["level"] for r in scores_only] == ["scores"] and scores_only[0]["after"] > ESCALATE
    got, reports = refine(Oracle(t, 6), noisy, np.random.default_rng(0), "auto")
    assert [r["level"] for r in reports] == ["scores", "all"] and reports[-1]["after"] < scores_only[0]["after"]


def test_the_polish_leaves_the_checks_reserve_untouched():
    """A budget that pays the scores' polish but not also the check's reserve: the polish is skipped, asking
    nothing (the check would otherwise be refused for want of queries)."""
    t = random_multihead_transformer(6, 2, 8, seed=0)
    reserve = 40
    oracle = Oracle(t, 6, budget=polish_sequences(t, "scores") + reserve - 1)
    got, reports = refine(oracle, t, np.random.default_rng(0), "auto", reserve=reserve)
    assert got is t and reports == [] and oracle.queries == 0
    oracle = Oracle(t, 6, budget=polish_sequences(t, "scores") + reserve)
    refine(oracle, t, np.random.default_rng(0), "scores", reserve=reserve)
    assert oracle.queries == polish_sequences(t, "scores") and oracle.remaining == reserve
