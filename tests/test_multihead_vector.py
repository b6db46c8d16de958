"""Whole output rows of multi-head layers: the vector layout of the models and the vector-answer learner."""

from __future__ import annotations

import numpy as np
import pytest

from attnprobe.errors import ConfigError, UnidentifiableError
from attnprobe.learners.core.check import functional_check
from attnprobe.learners.multihead import extract_multihead
from attnprobe.learners.multihead.vector import extract_vector
from attnprobe.models.io import load_model, save_model
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.oracles.base import Oracle


def whole_row_layer(d=16, H=2, seed=0, K=None, dtype="float64") -> MultiHeadAttention:
    """A random concatenate-then-project layer read as its whole output row (K = d unless given)."""
    rng = np.random.default_rng(seed)
    dh = d // H
    K = d if K is None else K
    Q, Kk, V = (rng.standard_normal((H, dh, d)) / np.sqrt(d) for _ in range(3))
    WO = rng.standard_normal((K, H * dh)) / np.sqrt(H * dh)
    return MultiHeadAttention.from_projections(Q, Kk, V, WO, rng.standard_normal(K), b_Q=rng.standard_normal((H, dh)),
                                               b_V=rng.standard_normal((H, dh)), dtype=dtype)


# ------------------------------------------------------------------------------------------------------ models
def test_whole_row_is_every_scalar_row():
    rng = np.random.default_rng(1)
    H, dh, d, K = 3, 4, 12, 7
    Q, Kk, V = (rng.standard_normal((H, dh, d)) for _ in range(3))
    WO, bO = rng.standard_normal((K, H * dh)), rng.standard_normal(K)
    bQ, bV = rng.standard_normal((H, dh)), rng.standard_normal((H, dh))
    whole = MultiHeadAttention.from_projections(Q, Kk, V, WO, bO, b_Q=bQ, b_V=bV)
    assert whole.vector and whole.outputs == K and whole.v.shape == (H, K, d) and whole.c.shape == (K,)
    X = rng.standard_normal((5, 4, d))
    y = whole(X)
    assert y.shape == (5, K)
    for k in (0, K - 1):
        row = MultiHeadAttention.from_projections(Q, Kk, V, WO[k], bO[k], b_Q=bQ, b_V=bV)
        np.testing.assert_allclose(row(X), y[:, k], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sum(whole.head(h)(X) for h in range(H)), y, rtol=1e-12, atol=1e-12)
    assert whole.head_outputs(X).shape == (5, H, K)


def test_vector_layout_round_trips_and_matches_up_to_permutation(tmp_path):
    m = whole_row_layer(12, 3, seed=2)
    path = save_model(m, tmp_path / "layer.npz")
    back = load_model(path)
    X = np.random.default_rng(0).standard_normal((4, 3, 12))
    np.testing.assert_allclose(back(X), m(X), rtol=1e-13, atol=1e-13)
    mm = match_heads(m, back.permuted([2, 0, 1]))
    assert mm.worst == 0 and mm.c == 0 and sorted(mm.perm.tolist()) == [0, 1, 2]
    worse = MultiHeadAttention(m.W, m.v * np.array([1, 1, 1.01])[:, None, None], m.u, m.c)
    assert abs(match_heads(m, worse).v[2] - 0.01) < 1e-12


def test_vector_layout_refuses_mismatched_shapes():
    m = whole_row_layer(8, 2)
    with pytest.raises(ConfigError, match=r"c must have shape \(8,\)"):
        MultiHeadAttention(m.W, m.v, m.u, np.zeros(5))
    with pytest.raises(ConfigError, match="value layouts"):
        match_heads(m, MultiHeadAttention(m.W, m.v[:, 0, :], m.u, 0.0))


# ----------------------------------------------------------------------------------------------------- learner
@pytest.mark.parametrize("d,H,seed", [(16, 2, 0), (16, 4, 1), (24, 3, 2), (64, 8, 3)])
def test_recovers_every_head_from_whole_rows(d, H, seed):
    true = whole_row_layer(d, H, seed)
    oracle = Oracle(true, d)
    res = extract_vector(oracle, seed=seed)
    m = match_heads(true, res.model)
    assert res.model.H == H and m.worst <= 1e-8 and m.c <= 1e-10
    assert res.check.passed
    assert sum(res.queries_by_phase.values()) == res.queries
    assert oracle.queries == res.queries + res.check.queries
    # the plan made up front bounds what was asked, but for 4H queries per restarted difference
    assert res.queries <= res.details["planned"] + 4 * H * res.details["restarts"]
    if d >= 64:  # the low-rank sketch of every W_h (rank d/H) replaced the full measurement
        assert res.details["W_rank"] == [d // H] * H


@pytest.mark.parametrize("seed", [0, 2])
def test_column_spaces_that_miss_a_faint_value_direction_are_not_used(seed):
    """d = 48, H = 4 (d_h = 12: the column-space route is tried after 32 differences): one head's value map has a
    direction 2e-10 of its largest. The heads' column spaces, read from the separated answers, miss that direction
    by ~1e-10 of M, a thousand roundings: they do not split M, and the d + 1 differences give every V_h to the
    answers' precision (~3e-11 measured; 1.6e-9 when the spaces were accepted)."""
    d, H = 48, 4
    rng = np.random.default_rng(seed)
    Q, Kk, V = (rng.standard_normal((H, d // H, d)) / np.sqrt(d) for _ in range(3))
    U, s, Vt = np.linalg.svd(V[0], full_matrices=False)
    s[-1] = 2e-10 * s[0]
    V[0] = (U * s) @ Vt
    WO = rng.standard_normal((d, d)) / np.sqrt(d)
    true = MultiHeadAttention.from_projections(Q, Kk, V, WO, rng.standard_normal(d),
                                               b_Q=rng.standard_normal((H, d // H)),
                                               b_V=rng.standard_normal((H, d // H)))
    res = extract_vector(Oracle(true, d), seed=seed)
    assert res.check.passed and res.details["route"] == "differences"
    assert match_heads(true, res.model).worst <= 3e-10


def test_multihead_dispatches_vector_answers_and_counts_the_probe():
    true = whole_row_layer(16, 2, seed=3)
    oracle = Oracle(true, 16)
    res = extract_multihead(oracle, seed=0)
    assert res.method == "multihead-vector"
    assert match_heads(true, res.model).worst <= 1e-8
    assert oracle.queries == res.queries + res.check.queries
    assert sum(res.queries_by_phase.values()) == res.queries


def test_probes_stay_within_the_input_bound():
    true = whole_row_layer(16, 2, seed=4)
    oracle = Oracle(true, 16, max_input_norm=2.0)
    res = extract_vector(oracle, seed=0)
    assert oracle.max_input_norm_used <= 2.0
    assert match_heads(true, res.model).worst <= 1e-8


def test_clamping_victim_far_above_the_probes():
    true = whole_row_layer(16, 4, seed=5)

    def clamped(X):
        n = np.linalg.norm(X, axis=-1, keepdims=True)
        return true(X * np.minimum(1.0, 1e4 / np.maximum(n, 1e-300)))

    res = extract_vector(Oracle(clamped, 16), seed=0)
    assert match_heads(true, res.model).worst <= 1e-6


def test_tied_heads_merge_into_one_that_computes_the_same_function():
    base = whole_row_layer(16, 4, seed=6)
    W, u = base.W.copy(), base.u.copy()
    W[1], u[1] = W[0], u[0]
    true = MultiHeadAttention(W, base.v, u, base.c)
    res = extract_vector(Oracle(true, 16), seed=0)
    assert res.model.H == 3 and res.check.passed
    X = np.random.default_rng(0).standard_normal((20, 5, 16))
    np.testing.assert_allclose(res.model(X), true(X), rtol=1e-7, atol=1e-7)
    res = extract_vector(Oracle(true, 16), seed=0, heads=4)
    assert res.model.H == 3 and any("Prop. 7.1" in note for note in res.notes)


def test_affine_answers_are_refused():
    m = whole_row_layer(8, 2, seed=7)
    flat = MultiHeadAttention(0 * m.W, m.v, 0 * m.u, m.c)
    with pytest.raises(UnidentifiableError, match="affine"):
        extract_vector(Oracle(flat, 8), seed=0)


def test_float32_answers_recovered_and_a_worse_head_fails_the_check():
    true = whole_row_layer(16, 2, seed=8)
    oracle = Oracle(true.with_dtype("float32"), 16, precision="float32")
    res = extract_vector(oracle, seed=0)
    m = match_heads(true, res.model)
    assert res.check.passed and m.worst <= 1e-3
    W = res.model.W.copy()
    W[0] *= 1.05
    wrong = MultiHeadAttention(W, res.model.v, res.model.u, res.model.c)
    check = functional_check(oracle, wrong, np.random.default_rng(1), scale=res.details["check_scale"])
    assert not check.passed


def test_torch_multihead_whole_out_proj_row():
    torch = pytest.importorskip("torch")
    from attnprobe.oracles.torch_adapter import oracle_from_torch
    from attnprobe.oracles.torch_multihead import TorchMultiheadRow, torch_projections

    torch.manual_seed(0)
    for d, H in ((16, 2), (16, 4)):
        mod = TorchMultiheadRow(d, H, row=None, dtype=torch.float64)
        p = torch_projections(mod)
        true = MultiHeadAttention.from_projections(p["Q"], p["K"], p["V"], p["WO"], p["bO"], b_Q=p["bQ"],
                                                   b_V=p["bV"])
        res = extract_multihead(oracle_from_torch(mod, d), seed=0)
        assert match_heads(true, res.model).worst <= 1e-9


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_coarse_answers_are_refused_naming_the_precision(dtype):
    from attnprobe.errors import RecoveryError

    true = whole_row_layer(16, 2, seed=1)
    with pytest.raises(RecoveryError, match=f"answers in {dtype} .*too coarse.*float32"):
        extract_vector(Oracle(true.with_dtype(dtype), 16, precision=dtype), seed=0)


def test_per_head_attention_check_sees_one_worse_head():
    from attnprobe.learners.multihead.vector import LayerResiduals
    from attnprobe.learners.multihead.vector_logits import head_attention_errors

    true = whole_row_layer(24, 3, seed=1)
    oracle = Oracle(true, 24)
    res = extract_vector(oracle, seed=0)
    assert max(res.details["head_attention_error"]) <= 1e-9
    W = res.model.W.copy()
    W[1] *= 1.001
    worse = MultiHeadAttention(W, res.model.v, res.model.u, res.model.c)
    layer = LayerResiduals(oracle, res.model.v.sum(0), res.model.c)
    errs = head_attention_errors(layer, worse, res.details["token_norm"], 4, np.random.default_rng(0))
    assert errs[1] > 1e-4 and max(errs[0], errs[2]) < 1e-9


def test_declared_noise_is_refused_but_declared_float32_rounding_is_not():
    from attnprobe.errors import RecoveryError
    from attnprobe.oracles.wrappers import FreshNoise, Precision

    true = whole_row_layer(16, 2, seed=2)
    with pytest.raises(RecoveryError, match="declared noise"):
        extract_vector(Oracle(FreshNoise(true, 1e-6), 16), seed=0)
    res = extract_vector(Oracle(Precision(true.with_dtype("float32"), "float32"), 16), seed=0)
    assert res.check.passed and match_heads(true, res.model).worst <= 1e-3


def test_a_served_whole_row_layer_over_http():
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from attnprobe.oracles.http import oracle_from_url
    from attnprobe.service import KeyStore, ServiceOptions, build_app
    from attnprobe.service.server import BackgroundServer

    true = whole_row_layer(16, 2, seed=1)
    app = build_app(true, ServiceOptions(d=16, max_batch=4096, max_length=32), KeyStore(["k"], budget=10**6))
    with BackgroundServer(app) as srv:
        res = extract_multihead(oracle_from_url(srv.url, "k"), seed=0)
    assert res.method == "multihead-vector" and res.check.passed
    assert match_heads(true, res.model).worst <= 1e-8


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_the_separation_costs_exactly_what_its_parts_say(precision):
    """The separate phase asks, exactly: the first design points, one separation from scratch
    (``from_scratch_queries(H)``: the estimate prices each restart by it) per restart and once for δ_0, and the
    design points of every further difference (twice on coarse answers: a short and a long step)."""
    from attnprobe.learners.multihead.vector import from_scratch_queries

    layer = whole_row_layer(d=16, H=2, seed=3, dtype=precision)
    res = extract_multihead(Oracle(layer, 16, precision=precision), seed=0)
    det = res.details
    per_difference = det["design_points"] * (2 if precision == "float32" else 1)
    expected = (det["first_design_points"] + from_scratch_queries(2) * (1 + det["restarts"])
                + (det["differences"] - 1) * per_difference)
    assert res.queries_by_phase["separate"] == expected


def test_a_layer_that_clips_inside_the_probes_norms_is_refused_naming_the_bound():
    """A layer that clips its input rows at 1.5ρ (ρ the calibrated token norm; the probes reach 3ρ) answers the
    longer probes for shorter rows. The learner reads the clipping up to the largest norm it plans and refuses
    in one line naming the bound, before the heads are separated from answers that do not scale."""
    from attnprobe.errors import InputNormError
    from attnprobe.oracles.wrappers import ClipInputs

    layer = whole_row_layer(d=16, H=2, seed=1)
    rho = extract_multihead(Oracle(layer, 16), seed=0).details["token_norm"]
    with pytest.raises(InputNormError, match="clips inputs") as err:
        extract_multihead(Oracle(ClipInputs(layer, 1.5 * rho), 16), seed=0)
    assert "\n" not in str(err.value) and "max_input_norm" in str(err.value)


def _bent(layer, kappa):
    """``layer`` with each head's attention weights bent off the softmax by ``kappa``: ``a + κ a(1 − a) cos 5a``,
    renormalised (length-1 answers unchanged; no sum of softmax heads gives the two-row answers exactly)."""
    def answer(X):
        X = np.asarray(X, dtype=np.float64)
        out = np.zeros((X.shape[0], layer.v.shape[1])) + layer.c
        for h in range(layer.H):
            s = np.einsum("bnd,bd->bn", X, X[:, -1] @ layer.W[h].T) + X @ layer.u[h]
            a = np.exp(s - s.max(1, keepdims=True))
            a /= a.sum(1, keepdims=True)
            a = a + kappa * a * (1 - a) * np.cos(5 * a)
            out += np.einsum("bn,bnd,kd->bk", a / a.sum(1, keepdims=True), X, layer.v[h])
        return out
    return answer


def test_attention_bent_off_the_softmax_by_1e_7_is_refused_at_the_separation():
    """float64 answers: a correct separation misfits by ~1e-13; weights bent by 1e-7 misfit by ~1e-10, far above
    the answers' rounding: refused there, naming the misfit (not separated into heads that then carry it)."""
    from attnprobe.errors import RecoveryError

    layer = whole_row_layer(d=16, H=2, seed=1)
    assert extract_multihead(Oracle(_bent(layer, 1e-10), 16), seed=0).details["separation_misfit"] < 1e-12
    oracle = Oracle(_bent(layer, 1e-7), 16)
    with pytest.raises(RecoveryError, match="separate .*misfit"):
        extract_multihead(oracle, seed=0)
    assert oracle.queries < 400  # refused at the first differences, before the logits
