import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from attnprobe.errors import ConfigError
from attnprobe.oracles import Oracle
from attnprobe.oracles.chain import AnswerChain, parse_noise
from attnprobe.oracles.wrappers import (AdversarialNoise, BoundedNoise, FreshNoise, Membership, Precision, Rounded,
                                        input_hash)
from attnprobe.targets import random_head

HEAD = random_head(6, seed=3)


def batch(seed, B=64, N=3, d=6):
    return np.random.default_rng(seed).standard_normal((B, N, d))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), tau=st.floats(1e-9, 10.0))
def test_bounded_noise_is_within_tau_and_deterministic(seed, tau):
    X = batch(seed)
    o = BoundedNoise(HEAD, tau, seed=seed % 7)
    y = o(X)
    assert np.all(np.abs(y - HEAD(X)) <= tau)
    # same sequence, same answer; the noise does not depend on the batch it comes in
    assert np.array_equal(o(X), y)
    perm = np.random.default_rng(seed).permutation(len(X))
    noise = y - HEAD(X)
    assert np.allclose(o(X[perm]) - HEAD(X[perm]), noise[perm], rtol=0, atol=1e-12)
    assert np.allclose(o(X[5:6]) - HEAD(X[5:6]), noise[5:6], rtol=0, atol=1e-12)


def test_bounded_noise_spreads_over_the_interval():
    y = BoundedNoise(HEAD, 1.0)(batch(0, B=4000)) - HEAD(batch(0, B=4000))
    assert y.min() < -0.95 and y.max() > 0.95 and abs(y.mean()) < 0.05
    assert len(np.unique(input_hash(batch(0, B=4000)))) == 4000


def test_adversarial_noise_uses_all_of_tau_towards_saturation():
    X = batch(1, N=2)
    y, y0 = AdversarialNoise(HEAD, 1e-2)(X), HEAD(X)
    assert np.allclose(np.abs(y - y0), 1e-2)
    rows = np.stack([HEAD(X[:, i:i + 1]) for i in range(2)], axis=1)
    lo, hi = rows.min(1), rows.max(1)
    nearer_hi = (hi - y0) < (y0 - lo)
    assert np.all(np.sign(y - y0)[nearer_hi] == 1) and np.all(np.sign(y - y0)[~nearer_hi] == -1)
    X1 = batch(2, N=1)
    assert np.all(np.abs(AdversarialNoise(HEAD, 1e-3)(X1)) <= np.abs(HEAD(X1)))


def test_fresh_noise_differs_per_call_and_averages_out():
    X = np.repeat(batch(3, B=1), 20000, axis=0)
    f = FreshNoise(HEAD, 0.1, seed=1)
    a, b = f(X), f(X)
    assert not np.array_equal(a, b)
    assert abs(np.mean(a) - HEAD(X[:1])[0]) < 0.005 and abs(np.std(a) - 0.1) < 0.005
    u = FreshNoise(HEAD, 0.1, kind="uniform", seed=2)(X) - HEAD(X)
    assert np.all(np.abs(u) <= 0.1) and FreshNoise(HEAD, 0.1, kind="uniform").noise.tolerance == 0.1


def test_rounding_decimals_and_significant_digits():
    X = batch(4)
    y = HEAD(X)
    r = Rounded(HEAD, decimals=3)(X)
    assert np.all(np.abs(r - y) <= 0.5e-3 + 1e-15) and np.allclose(r * 1000, np.round(r * 1000))
    s = Rounded(HEAD, digits=2)(X)
    assert np.all(np.abs(s - y) <= 0.5 * 10 ** (np.floor(np.log10(np.abs(y))) - 1) + 1e-15)
    assert Rounded(lambda X: np.zeros(len(X)), digits=3)(X).tolist() == [0.0] * len(X)
    with pytest.raises(ConfigError):
        Rounded(HEAD)
    with pytest.raises(ConfigError):
        Rounded(HEAD, decimals=2, digits=2)


@pytest.mark.parametrize("dtype,eps", [("float32", 2**-24), ("float16", 2**-11), ("bfloat16", 2**-8)])
def test_precision_cast_matches_the_format(dtype, eps):
    pytest.importorskip("ml_dtypes")

    X = batch(5)
    y = Precision(HEAD, dtype, inputs=False)(X)
    ref = HEAD(X)
    assert np.all(np.abs(y - ref) <= eps * np.abs(ref) * 1.0001 + 1e-30)
    assert np.any(y != ref)
    # answers are representable in the format
    from attnprobe.models.precision import resolve_dtype

    assert np.array_equal(y.astype(resolve_dtype(dtype)).astype(np.float64), y)


def test_membership_and_composition():
    X = batch(6)
    g = Membership(HEAD)(X)
    assert set(np.unique(g)) <= {0.0, 1.0} and np.array_equal(g, (HEAD(X) > 0).astype(float))
    chain = AnswerChain(noise="avq:1e-3", decimals=4, membership=True).apply(HEAD)
    n = chain.noise
    assert n.membership and n.tolerance == pytest.approx(1e-3 + 0.5e-4)
    o = Oracle(HEAD, 6, chain=AnswerChain(cast="float16", noise="gaussian:0.01"))
    assert o.precision == "float16" and o.eps == 2**-10 and o.noise.fresh
    assert o(X).shape == (64,) and o.queries == 64


def test_bad_specs_raise_config_errors():
    for spec in ("avq", "nope:1", "avq:x", "avq:-1"):
        with pytest.raises(ConfigError):
            parse_noise(spec)
    with pytest.raises(ConfigError):
        BoundedNoise(HEAD, float("nan"))
    with pytest.raises(ConfigError):
        FreshNoise(HEAD, 0.1, kind="laplace")
    with pytest.raises(ConfigError):
        Precision(HEAD, "float8")
    with pytest.raises(ConfigError):
        BoundedNoise(42, 0.1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cli_robust_recovers_heads_behind_avq_noise(tmp_path, seed):
    """Over several heads, not one picked: every run exits 0 with W within 3e-2 (measured: 3e-4 for heads 0, 3, 4,
    5 and ~1e-2 for heads 1 and 2; the check's tolerance under declared noise τ is 3e3·τ of the answers)."""
    from attnprobe.cli import main
    from attnprobe.models import load_model, save_model

    head = random_head(6, seed=seed, bias=False)
    save_model(head, tmp_path / "t.npz")
    out = tmp_path / "r.npz"
    assert main(["extract", "--target", str(tmp_path / "t.npz"), "--method", "robust", "--no-bias", "--noise",
                 "avq:1e-4", "--out", str(out), "--quiet"]) == 0
    W = load_model(out).W
    assert np.linalg.norm(W - head.W) / np.linalg.norm(head.W) <= 3e-2


def test_cli_wraps_any_target_and_runs_the_new_methods(tmp_path, capsys):
    import json

    from attnprobe.cli import main
    from attnprobe.models import save_model

    target = tmp_path / "t.npz"
    save_model(random_head(6, seed=0, bias=False), target)
    out = tmp_path / "r.npz"
    assert main(["extract", "--target", str(target), "--method", "robust", "--no-bias", "--noise", "avq:1e-4",
                 "--out", str(out), "--quiet"]) == 0
    js = json.loads(out.with_suffix(".json").read_text())
    assert js["method"] == "robust" and js["details"]["tolerance"] == 1e-4 and js["queries"] >= 42
    assert main(["extract", "--target", str(target), "--method", "membership", "--out", str(out), "--quiet"]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["check"]["sign_agreement"] > 0.99
    assert main(["extract", "--target", str(target), "--method", "robust", "--probes", "paper", "--w-bound", "2",
                 "--margin", "0.01", "--noise", "avq:0.1", "--out", str(out), "--quiet"]) == 2
    assert "exceeds μ/2" in capsys.readouterr().err
    assert main(["extract", "--target", str(target), "--noise", "avq", "--out", str(out), "--quiet"]) == 2
