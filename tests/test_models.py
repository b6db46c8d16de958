import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from attnprobe.errors import ConfigError
from attnprobe.models import AttentionHead, load_model, save_model
from attnprobe.targets import random_head
from conftest import rel


def naive(model, X):
    """Loop-by-loop reference of f(X) = softmax(X W x_N + X u)ᵀ(X v) + c."""
    out = []
    for seq in X:
        s = seq @ model.W @ seq[-1] + seq @ model.u
        a = np.exp(s - s.max())
        a /= a.sum()
        out.append(a @ (seq @ model.v) + model.c)
    return np.array(out)


@settings(max_examples=30, deadline=None)
@given(d=st.integers(1, 12), n=st.integers(1, 9), seed=st.integers(0, 10**6))
def test_forward_matches_reference(d, n, seed):
    rng = np.random.default_rng(seed)
    m = random_head(d, seed=seed)
    X = rng.standard_normal((5, n, d))
    assert np.allclose(m(X), naive(m, X), rtol=1e-12, atol=1e-12)


def test_length_one_is_linear():
    m = random_head(7, seed=2)
    X = np.random.default_rng(0).standard_normal((4, 1, 7))
    assert np.allclose(m(X), X[:, 0] @ m.v + m.c, rtol=0, atol=1e-14)


def test_softmax_is_stable_for_huge_scores():
    m = random_head(6, seed=1, scale=1e6)
    X = np.random.default_rng(3).standard_normal((8, 5, 6))
    y = m(X)
    assert np.isfinite(y).all()
    # with saturated attention the answer is the value of the arg-max position
    s = np.einsum("bnd,de,be->bn", X, m.W, X[:, -1]) + X @ m.u
    pick = (X @ m.v)[np.arange(8), s.argmax(1)] + m.c
    assert np.allclose(y, pick, rtol=1e-9)


def test_dtype_emulates_precision():
    m = random_head(16, seed=4)
    X = np.random.default_rng(5).standard_normal((64, 4, 16))
    y64 = m(X)
    y32 = m.with_dtype("float32")(X)
    y16 = m.with_dtype("float16")(X)
    e32, e16 = rel(y32, y64), rel(y16, y64)
    assert 1e-9 < e32 < 1e-5  # float32 really rounds, but only at float32 level
    assert e32 * 100 < e16 < 1e-1
    assert y32.dtype == np.float64


def test_save_load_roundtrip(tmp_path):
    m = random_head(5, seed=9)
    path = save_model(m, tmp_path / "head.npz")
    back = load_model(path)
    assert isinstance(back, AttentionHead)
    for k in ("W", "v", "u"):
        assert np.array_equal(getattr(back, k), getattr(m, k))
    assert back.c == m.c


@pytest.mark.parametrize("bad", [
    dict(W=np.zeros((3, 3)), v=np.zeros(4)),
    dict(W=np.zeros((3, 3)), v=np.zeros(3), u=np.zeros(2)),
    dict(W=np.full((2, 2), np.nan), v=np.ones(2)),
    dict(W=np.eye(2), v=np.ones(2), dtype="float8"),
])
def test_invalid_parameters(bad):
    with pytest.raises(ConfigError):
        AttentionHead(**bad)


def test_invalid_queries():
    m = random_head(3, seed=0)
    with pytest.raises(ConfigError, match=r"\(B, N>=1, 3\)"):
        m(np.zeros((2, 3)))
    with pytest.raises(ConfigError):
        m(np.zeros((2, 4, 5)))


def test_load_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_model(tmp_path / "missing.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="cannot read"):
        load_model(junk)
    odd = tmp_path / "odd.npz"
    np.savez(odd, kind=np.asarray("spaceship"), W=np.eye(2))
    with pytest.raises(ConfigError, match="unknown kind"):
        load_model(odd)
