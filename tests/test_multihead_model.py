import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from attnprobe.errors import ConfigError
from attnprobe.models import MultiHeadAttention, load_model, match_heads, save_model
from attnprobe.targets import (minilm_head, minilm_layer, random_multihead, random_orthogonal_multihead,
                               shared_attention_multihead)
from attnprobe.targets.minilm import layer_projections
from conftest import rel


def naive(m, X):
    """Loop-by-loop reference of Σ_h softmax(X W_h x_N + X u_h)ᵀ(X v_h) + c."""
    out = []
    for seq in X:
        total = m.c
        for h in range(m.H):
            s = seq @ m.W[h] @ seq[-1] + seq @ m.u[h]
            a = np.exp(s - s.max())
            total += (a / a.sum()) @ (seq @ m.v[h])
        out.append(total)
    return np.array(out)


def concat_project(Q, K, V, bQ, bK, bV, w_o, b_o, X):
    """The App. C layer literally: per-head attention with projections, concatenate, then one output row."""
    H, dh, d = Q.shape
    out = []
    for seq in X:
        heads = []
        for h in range(H):
            q = Q[h] @ seq[-1] + bQ[h]
            k = seq @ K[h].T + bK[h]
            val = seq @ V[h].T + bV[h]
            s = k @ q / np.sqrt(dh)
            a = np.exp(s - s.max())
            heads.append((a / a.sum()) @ val)
        out.append(np.concatenate(heads) @ w_o + b_o)
    return np.array(out)


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 9), H=st.integers(1, 4), n=st.integers(1, 6), seed=st.integers(0, 10**6))
def test_forward_matches_reference(d, H, n, seed):
    m = random_multihead(d, H, max(1, d // H), seed=seed)
    X = np.random.default_rng(seed).standard_normal((4, n, d))
    assert np.allclose(m(X), naive(m, X), rtol=1e-12, atol=1e-12)
    assert np.allclose(sum(h(X) for h in m.heads()), m(X), rtol=1e-12, atol=1e-12)
    assert np.allclose(m.head_outputs(X).sum(1) + m.c, m(X), rtol=1e-12, atol=1e-12)


def test_concatenate_then_project_equals_sum_form():
    rng = np.random.default_rng(7)
    H, dh, d = 3, 4, 10
    Q, K, V = (rng.standard_normal((H, dh, d)) for _ in range(3))
    bQ, bK, bV = (rng.standard_normal((H, dh)) for _ in range(3))
    w_o, b_o = rng.standard_normal(H * dh), 0.37
    m = MultiHeadAttention.from_projections(Q, K, V, w_o, b_o, b_Q=bQ, b_K=bK, b_V=bV)
    X = rng.standard_normal((20, 5, d))
    ref = concat_project(Q, K, V, bQ, bK, bV, w_o, b_o, X)
    assert np.max(np.abs(m(X) - ref)) <= 1e-12 * np.max(np.abs(ref))


def test_minilm_layer_is_the_sum_of_its_heads():
    layer = minilm_layer(2, output_row=5)
    assert (layer.H, layer.d) == (12, 384)
    X = np.random.default_rng(0).standard_normal((6, 4, 384))
    heads = [minilm_head(2, h, 5) for h in range(12)]
    b = float(layer_projections(2, 5)["b"])  # each head carries the output bias once: layer = Σ heads − 11·b
    total = sum(h(X) for h in heads) - 11 * b
    assert abs(b) > 1e-3
    assert np.max(np.abs(layer(X) - total)) <= 1e-12 * np.max(np.abs(total))
    for h in range(12):
        assert rel(layer.W[h], heads[h].W) < 1e-14 and rel(layer.v[h], heads[h].v) < 1e-14


def test_dtype_emulates_precision():
    m = random_multihead(12, 3, seed=4)
    X = np.random.default_rng(5).standard_normal((64, 4, 12))
    e32 = rel(m.with_dtype("float32")(X), m(X))
    assert 1e-9 < e32 < 1e-5


def test_save_load_roundtrip(tmp_path):
    m = random_multihead(6, 2, seed=3)
    path = save_model(m, tmp_path / "mh.npz")
    back = load_model(path)
    assert isinstance(back, MultiHeadAttention) and back.kind == "multi_head"
    for name in ("W", "v", "u"):
        assert np.array_equal(getattr(back, name), getattr(m, name))
    assert back.c == m.c


def test_bad_shapes_are_refused():
    with pytest.raises(ConfigError, match="W must have shape"):
        MultiHeadAttention(np.zeros((2, 3, 3)), np.ones((3, 3)))
    with pytest.raises(ConfigError, match="u must have shape"):
        MultiHeadAttention(np.zeros((2, 3, 3)), np.ones((2, 3)), np.zeros(3))
    with pytest.raises(ConfigError, match="finite"):
        MultiHeadAttention(np.full((1, 2, 2), np.nan), np.ones((1, 2)))
    m = random_multihead(4, 2, seed=0)
    with pytest.raises(ConfigError, match="queries must have shape"):
        m(np.zeros((2, 3, 5)))


def test_match_heads_undoes_a_permutation():
    m = random_multihead(8, 4, seed=1)
    perm = [2, 0, 3, 1]
    got = m.permuted(perm)
    match = match_heads(m, got)
    assert match.worst == 0.0
    assert [perm[j] for j in match.perm] == [0, 1, 2, 3]  # got head match.perm[h] is true head h
    noisy = MultiHeadAttention(got.W * (1 + 1e-4), got.v, got.u, got.c)
    assert 0.5e-4 < match_heads(m, noisy).worst < 2e-4


def test_orthogonal_target_lives_in_its_subspaces():
    m, E = random_orthogonal_multihead(12, 3, 4, seed=2)
    P = np.einsum("hdk,hek->hde", E, E)
    for h in range(3):
        assert np.allclose(P[h] @ m.W[h] @ P[h], m.W[h], atol=1e-12)
        assert np.allclose(P[h] @ m.v[h], m.v[h], atol=1e-12) and np.allclose(P[h] @ m.u[h], m.u[h], atol=1e-12)
        for g in range(3):
            if g != h:
                assert np.abs(P[g] @ m.W[h]).max() < 1e-12
    assert np.allclose(np.einsum("hdk,gdl->hgkl", E, E)[0, 1], 0, atol=1e-12)


def test_shared_attention_target_has_tied_heads():
    m = shared_attention_multihead(5, 3, tied=2, seed=0)
    assert np.array_equal(m.W[0], m.W[1]) and not np.allclose(m.W[0], m.W[2])
    assert abs(np.linalg.det(np.stack([m.v[0], m.v[1]])[:, :2])) < 1e-12  # v_0 ∥ v_1


def test_prop71_witness_has_the_same_function_and_other_parameters():
    from attnprobe.models.identifiability import equivalent, tied_groups, witness

    rng = np.random.default_rng(0)
    m = shared_attention_multihead(4, 3, tied=2, seed=1)
    assert tied_groups(m) == [[0, 1]]
    w = witness(m, rng)
    assert w.H == m.H and rel(w.v, m.v) > 0.1  # a real difference, not a permutation
    assert match_heads(m, w).worst > 0.1
    rep = equivalent(m, w, rng, per=16, climbs=2, climb_iters=200)
    assert rep.max_gap <= 1e-9 and rep.evaluations > 16 * 15


def test_witness_splits_a_head_when_none_are_tied():
    from attnprobe.models.identifiability import equivalent, witness

    rng = np.random.default_rng(1)
    m = random_multihead(3, 2, seed=2)
    w = witness(m, rng)
    assert w.H == 3
    assert equivalent(m, w, rng, per=16, climbs=1, climb_iters=100).max_gap <= 1e-9


def test_equivalent_finds_a_gap_between_different_layers():
    from attnprobe.models.identifiability import equivalent

    rng = np.random.default_rng(2)
    m = random_multihead(4, 2, seed=3)
    other = MultiHeadAttention(m.W + 1e-3 * rng.standard_normal(m.W.shape), m.v, m.u, m.c)
    rep = equivalent(m, other, rng, per=16, climbs=2, climb_iters=200)
    assert rep.max_gap > 1e-5 and rep.max_gap >= rep.random_gap


def test_complex_or_string_parameters_are_refused_not_truncated():
    """The same validation as a single head (``real_array``): no imaginary part silently dropped."""
    with pytest.raises(ConfigError, match="real numbers"):
        MultiHeadAttention(np.zeros((1, 2, 2)) + 0.5j, np.ones((1, 2)))
    with pytest.raises(ConfigError, match="real numbers"):
        MultiHeadAttention(np.zeros((1, 2, 2)), np.array([["a", "b"]]))
