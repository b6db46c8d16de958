import re

import numpy as np
import pytest

from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.head.robust import extract_robust, extract_robust_paper, theorem_guarantee
from attnprobe.oracles import Oracle
from attnprobe.oracles.wrappers import AdversarialNoise, BoundedNoise, FreshNoise, Membership
from attnprobe.targets import random_head

from attnprobe.targets.theorem_heads import margin, theorem_head

W_BOUND = 2.0


@pytest.mark.parametrize("d", [4, 8, 16])
@pytest.mark.parametrize("tau_rel", [1e-5, 1e-2, 0.49])
@pytest.mark.parametrize("adversarial", [False, True])
@pytest.mark.parametrize("zero_v", [0, 1])
def test_paper_within_theorem_guarantee_with_d_plus_d2_queries(d, tau_rel, adversarial, zero_v):
    for seed in range(2):
        h = theorem_head(d, seed, W_BOUND, zero_v=zero_v)
        mu = margin(h)
        tau = tau_rel * mu
        wrapped = AdversarialNoise(h, tau) if adversarial else BoundedNoise(h, tau, seed=seed)
        o = Oracle(wrapped, d)
        r = extract_robust_paper(o, w_bound=W_BOUND, margin=mu, tolerance=tau, check=False)
        g = r.details["guarantee"]
        assert r.queries == o.queries == d + d * d
        assert np.linalg.norm(r.model.W - h.W) <= g["eps_W"]
        assert np.linalg.norm(r.model.W - h.W) <= g["eps_W_proof"]
        assert np.linalg.norm(r.model.v - h.v) <= g["eps_v"] * (1 + 1e-9)
        assert g["eps_W"] == pytest.approx((2 if zero_v else 1) * 80 * W_BOUND**2 * d * tau / mu)


def test_guarantee_refuses_tau_above_half_margin():
    assert not theorem_guarantee(8, 0.3, 2.0, 0.5)["valid"]
    h = theorem_head(8, 0)
    mu = margin(h)
    o = Oracle(BoundedNoise(h, mu), 8)
    with pytest.raises(UnidentifiableError, match="exceeds μ/2"):
        extract_robust_paper(o, w_bound=2, margin=mu, tolerance=mu)
    assert o.queries == 0


def test_paper_raises_when_no_value_answer_clears_the_margin():
    h = random_head(6, seed=0, bias=False)
    zero = type(h)(h.W, np.zeros(6))
    o = Oracle(BoundedNoise(zero, 1e-4), 6)
    with pytest.raises(UnidentifiableError, match="no usable signal"):
        extract_robust_paper(o, w_bound=2, margin=0.1, tolerance=1e-4)


@pytest.mark.parametrize("bad", [dict(w_bound=1.0), dict(margin=0.0), dict(margin=2.0), dict(tolerance=-1.0)])
def test_paper_config_errors(bad):
    kw = dict(w_bound=2.0, margin=0.1, tolerance=1e-4) | bad
    with pytest.raises(ConfigError):
        extract_robust_paper(Oracle(theorem_head(4, 0), 4), **kw)


@pytest.mark.parametrize("d", [16, 32])
@pytest.mark.parametrize("adversarial", [False, True])
def test_default_beats_paper_tenfold_at_same_tau_without_w_bound(d, adversarial):
    for tau in (1e-6, 1e-4):
        h = theorem_head(d, 1, W_BOUND)
        mu = margin(h)
        mk = (lambda: AdversarialNoise(h, tau)) if adversarial else (lambda: BoundedNoise(h, tau))
        rp = extract_robust_paper(Oracle(mk(), d), w_bound=W_BOUND, margin=mu, tolerance=tau, check=False)
        o = Oracle(mk(), d)
        ro = extract_robust(o, bias=False, tolerance=tau, check=False)
        ep, eo = np.linalg.norm(rp.model.W - h.W), np.linalg.norm(ro.model.W - h.W)
        assert eo * 10 <= ep
        assert ro.queries == o.queries <= d + d * d + d  # planned d + d², re-measured probes on top
        assert ro.queries - ro.details["retry_queries"] == d + d * d


def test_default_reads_tau_from_the_wrapper_and_spends_extra_queries():
    d, tau = 8, 1e-4
    h = theorem_head(d, 2)
    base = extract_robust(Oracle(BoundedNoise(h, tau), d), bias=False, check=False)
    assert base.details["tolerance"] == tau
    more = extract_robust(Oracle(BoundedNoise(h, tau), d), bias=False, queries=4 * (d * d + d), check=False)
    extra = 3 * (d * d + d)
    assert more.details["w_passes"] == 1 + (extra - d) // (d * d) == 4
    assert more.details["value_passes"] == 1 + min(4, (extra - 3 * d * d) // d)
    assert more.queries - more.details["retry_queries"] <= 4 * (d * d + d)
    assert np.linalg.norm(more.model.W - h.W) * 100 < np.linalg.norm(base.model.W - h.W)
    capped = extract_robust(Oracle(BoundedNoise(h, tau), d), bias=False, queries=4 * (d * d + d), max_scale=1.0,
                            check=False)
    assert capped.details["scale_a"] <= 1.0 and np.linalg.norm(capped.model.W - h.W) < 0.05


def test_default_fresh_noise_repetitions_shrink_the_error():
    d, sigma = 8, 1e-4
    h = theorem_head(d, 3)
    errs = []
    for mult in (1, 8):
        r = extract_robust(Oracle(FreshNoise(h, sigma, seed=mult), d), bias=False, queries=mult * (d * d + d),
                           max_scale=1.0, check=False)
        errs.append(np.linalg.norm(r.model.W - h.W))
    assert errs[1] < errs[0] / 1.5


def test_default_with_biases_and_no_noise_is_exact():
    h = random_head(12, seed=4)
    r = extract_robust(Oracle(h, 12), seed=1)
    assert np.linalg.norm(r.model.W - h.W) / np.linalg.norm(h.W) < 1e-9
    assert np.linalg.norm(r.model.u - h.u) / np.linalg.norm(h.u) < 1e-9 and abs(r.model.c - h.c) < 1e-12
    assert r.check.error < 1e-9


def test_default_raises_when_the_answers_carry_no_signal():
    h = theorem_head(8, 0)
    tiny = type(h)(h.W, h.v * 1e-6)
    with pytest.raises(UnidentifiableError, match="no usable signal"):
        extract_robust(Oracle(BoundedNoise(tiny, 1e-3), 8), bias=False)
    with pytest.raises(ConfigError, match="membership"):
        extract_robust(Oracle(Membership(h), 8))
    with pytest.raises(ConfigError):
        extract_robust(Oracle(h, 8), queries=10)


def test_default_without_retries_spends_exactly_d_plus_d2_and_still_wins():
    d, tau = 16, 1e-3
    h = theorem_head(d, 0)
    mu = margin(h)
    o = Oracle(AdversarialNoise(h, tau), d, budget=d + d * d)
    r = extract_robust(o, bias=False, tolerance=tau, retries=0, check=False)
    rp = extract_robust_paper(Oracle(AdversarialNoise(h, tau), d), w_bound=2.0, margin=mu, tolerance=tau,
                              check=False)
    assert r.queries == o.queries == d + d * d
    assert np.linalg.norm(r.model.W - h.W) * 10 <= np.linalg.norm(rp.model.W - h.W)


def test_a_declared_tolerance_reaches_the_check(tmp_path, capsys, monkeypatch):
    """A black box whose answers are off by up to 1e-7 (and which does not say so): with --tolerance 1e-7 a
    correct robust extraction passes its check; without it, the check knows no noise and holds it to 1e-6."""
    import json

    from attnprobe.learners.core.check import CHECK_FLOOR
    from hostile import run

    (tmp_path / "victim.py").write_text(
        "from attnprobe.oracles.wrappers import BoundedNoise\nfrom attnprobe.targets import random_head\n"
        "_noisy = BoundedNoise(random_head(8, seed=0), 1e-7)\n"
        "def answer(X):\n    return _noisy(X)\n")
    monkeypatch.chdir(tmp_path)
    argv = ["extract", "--oracle", "victim:answer", "--d", "8", "--method", "robust", "--out", "r.npz", "--quiet"]
    rc, _, err = run(capsys, *argv, "--tolerance", "1e-7")
    assert rc == 0, err
    chk = json.loads((tmp_path / "r.json").read_text())["check"]
    assert chk["passed"] and chk["tolerance"] > 100 * CHECK_FLOOR  # τ = 1e-7 widened it
    W = np.load(tmp_path / "r.npz")["W"]
    truth = random_head(8, seed=0)
    assert np.linalg.norm(W - truth.W) / np.linalg.norm(truth.W) < 1e-4  # and the model is right
    # the same extraction without the declaration: the check's tolerance stays at the float64 floor
    rc, _, err = run(capsys, *argv, "--keep-failed")
    assert json.loads((tmp_path / "r.json").read_text())["check"]["tolerance"] == CHECK_FLOOR


@pytest.mark.parametrize("flags, says", [
    (["--method", "robust", "--probes", "paper", "--w-bound", "1e308", "--margin", "1e-308"], "--w-bound"),
    (["--method", "robust", "--probes", "paper", "--w-bound", "1e200", "--margin", "1e-3"], "beyond float64"),
    (["--method", "membership", "--probes", "paper", "--w-bound", "2", "--margin", "0.1", "--eps-w", "1e-300"],
     "--eps-w"),
    (["--method", "membership", "--probes", "paper", "--w-bound", "1e308", "--margin", "1e-308", "--samples", "9"],
     "finer than float64"),
])
def test_paper_bounds_beyond_float64_are_refused_up_front(tmp_path, capsys, flags, says):
    from attnprobe.models import save_model
    from hostile import refused

    save_model(random_head(4, seed=0, bias=False), tmp_path / "t.npz")
    line = refused(capsys, tmp_path, "extract", "--target", tmp_path / "t.npz", *flags, "--out", tmp_path / "o.npz",
                   says=says)
    assert re.search(r"(?<!\d)0 queries spent|no queries spent", line), line  # refused before the first query
