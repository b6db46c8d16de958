"""The logit start from row spaces (docs/positional.md, "The logit start at LLaMA-3-8B's head shape: row spaces,
then linear"): anchor sequences give logits of the form ``z_pᵀ T c_p,col`` exactly, the column-wise sensing
recovers ``T``'s span, and the reduced matrices at a few offsets give the layer back through the gauge."""

import numpy as np

from attnprobe.learners.positional import anchor_row_spaces as ars
from attnprobe.learners.positional import subspace_logits as sl
from attnprobe.learners.positional.coarse import split_value_maps
from attnprobe.learners.positional.row_logits import BlockTokens
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import rotation_matrix
from attnprobe.oracles.base import Oracle
from attnprobe.targets import random_rope_attention


def _layer(d=64, heads=2, kv=1, base=1e4, seed=0):
    truth = random_rope_attention(d, heads, kv, base=base, seed=seed)
    V = truth.value_maps()
    Cb, G = split_value_maps(V, V.sum(0))
    oracle = Oracle(truth.every_position, d, precision="float64")
    oracle.declare_positions("causal")
    return truth, Cb, G, oracle


def _score(truth, h, z, a, delta):
    per = truth.Wq.shape[0] // truth.Wk.shape[0]
    dh = truth.Wq.shape[1]
    R = rotation_matrix(float(delta), np.asarray(truth.inv_freq), dh)
    return truth.scale * (z @ truth.Wq[h].T) @ R @ (truth.Wk[h // per] @ a)


def test_anchor_logits_are_the_layers_relative_logits():
    truth, Cb, G, oracle = _layer()
    rng = np.random.default_rng(1)
    m, n, S = 6, 4, 3
    anchors = rng.standard_normal((m, 64))
    probes = BlockTokens.random(S, n, 64, rng)
    Z = probes.dense().reshape(S, n, 64)
    q = ars.anchor_logits(oracle, Cb, G, truth.output_bias(), anchors, probes, S, side="query")
    k = ars.anchor_logits(oracle, Cb, G, truth.output_bias(), anchors, probes, S, side="key")
    for s, p, h, j in [(0, 0, 0, 0), (2, 3, 1, 4), (1, 2, 0, 2)]:
        want = _score(truth, h, Z[s, p], anchors[j + 1], j + 1 - (m + p)) - _score(truth, h, Z[s, p], anchors[0],
                                                                                   -(m + p))
        assert abs(q[s, p, h, j] - want) < 1e-9 * max(1.0, abs(want))
        r = 1 + n + j  # anchor j + 1's position in [a_0, z_1 … z_n, a_1 …]
        want = _score(truth, h, anchors[j + 1], Z[s, p], 1 + p - r) - _score(truth, h, anchors[j + 1], anchors[0], -r)
        assert abs(k[s, p, h, j] - want) < 1e-9 * max(1.0, abs(want))


def test_column_subspace_recovers_the_span_over_families_and_intercepts():
    rng = np.random.default_rng(2)
    d, k, n = 32, 4, 5
    T = rng.standard_normal((d, k))
    parts, Ys = [], []
    for S, cols in ((30, 6), (25, 3)):
        probes = BlockTokens.random(S, n, d, rng, support=8)
        C = rng.standard_normal((n, k, cols))
        P = probes.project(T.T).reshape(S, n, k)
        Ys.append(np.einsum("spk,pkc->spc", P, C) + rng.standard_normal((n, cols))[None])
        parts.append(probes)
    B = ars.column_subspace(ars.joined(parts), Ys, k, rng, intercept=True, rounds=40, cg_steps=40)
    Qt = np.linalg.qr(T)[0]
    assert np.linalg.norm(Qt - B.T @ (B @ Qt), 2) < 1e-6  # the largest principal angle's sine


def test_the_reduced_matrices_and_the_gauge_give_the_layer_back():
    truth, Cb, G, _ = _layer(d=64, heads=2, kv=1, base=1e4, seed=3)
    theta = np.asarray(truth.inv_freq)
    Wq, Wk = truth.Wq * truth.scale, truth.Wk
    rng = np.random.default_rng(4)
    U = np.stack([np.linalg.qr(w.T @ rng.standard_normal((32, 32)))[0].T for w in Wq])
    V = np.stack([np.linalg.qr(w.T)[0].T for w in Wk])
    M = np.stack([[U[h] @ Wq[h].T @ rotation_matrix(float(o), theta, 32) @ Wk[0] @ V[0].T for o in sl.OFFSETS]
                  for h in range(2)])
    from attnprobe.learners.positional.bfloat16_rows import grouped_start

    for refine in (0, 3):  # the alternating rounds on the matrices keep an exact answer exact
        Wq2, Wk2 = sl.maps_from_subspaces(M, U, V, theta, refine=refine)
        model = grouped_start(Wq2, Wk2, Cb, G, truth.output_bias(), theta)
        assert function_error_over_lengths(model, truth, np.random.default_rng(5), (2, 17, 64), per_length=2) < 1e-8


def test_the_spectral_start_is_near_the_span():
    rng = np.random.default_rng(6)
    d, k, n, S, cols = 32, 4, 5, 200, 6
    T = rng.standard_normal((d, k))
    probes = BlockTokens.random(S, n, d, rng, support=8)
    C = rng.standard_normal((n, k, cols))
    Y = np.einsum("spk,pkc->spc", probes.project(T.T).reshape(S, n, k), C)
    Qt = np.linalg.qr(T)[0]
    for spectral, bound in ((True, 0.3), (False, None)):
        B = ars.column_subspace(probes, [Y], k, np.random.default_rng(7), spectral=spectral, rounds=0)
        angle = np.linalg.norm(Qt - B.T @ (B @ Qt), 2)
        if bound:
            assert angle < bound
        else:
            assert angle > 0.5  # a random start is not (the bound above is a real property)

