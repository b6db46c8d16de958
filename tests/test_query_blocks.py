"""Two-row query blocks of Thm 4.1 (eq. 1) as the learners build them: the whole-grid build's queries equal the
pairwise ones bit for bit and its position values agree within their rounding, the sizes asked lazily bound the
terms' sizes, reused memory never changes a query an oracle kept, and the oracle's row-norm check gives the largest
row norm exactly."""

import sys
import threading
import time

import numpy as np
from hypothesis import given, settings, strategies as st

from attnprobe.learners.head.exact import extract_exact
from attnprobe.learners.head.sigmoid import QueryMemory, RoundingError, grid_queries, invert_two_row, two_row_queries
from attnprobe.oracles import Oracle
from attnprobe.oracles.base import max_row_norm
from attnprobe.targets import random_head


def _same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a, b) and np.array_equal(np.signbit(a), np.signbit(b))


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 300), d=st.integers(1, 24), scale=st.floats(1e-3, 1e3),
       seed=st.integers(0, 2**31))
def test_the_whole_grid_is_the_pairwise_build(m, k, d, scale, seed):
    rng = np.random.default_rng(seed)
    A, Bs, v, c = rng.standard_normal((m, d)), rng.standard_normal((k, d)), rng.standard_normal(d), 0.3
    Bs[rng.random((k, d)) < 0.2] = -0.0  # signed zeros must survive the build
    A[rng.random((m, d)) < 0.2] = 0.0
    ell, j = np.divmod(np.arange(m * k), k)
    X, (y0, y1, sizes) = grid_queries(A, scale, Bs, None, None, v, c)
    Xp, (y0p, y1p, sizes_p) = grid_queries(A, np.full(m * k, scale), Bs, ell, j, v, c)
    assert _same_bits(X, two_row_queries(A[ell] * scale, Bs[j]))
    assert _same_bits(X, Xp)
    # the whole grid's values come from the k rows of Bs and the m probes (y1 = (s·a)ᵀv + bᵀv), the pairwise ones
    # from each summed row: equal within the rounding of sums of d terms of these sizes
    eps, per_entry = np.finfo(float).eps, np.abs(v) + abs(c)
    size0 = abs(c) + np.abs(X[:, 1, :]) @ per_entry
    size1 = abs(c) + (np.abs(A[ell] * scale) + np.abs(Bs[j])) @ per_entry
    assert np.all(np.abs(y0 - y0p) <= 2 * (d + 2) * eps * size0)
    assert np.all(np.abs(y1 - y1p) <= 2 * (d + 2) * eps * size1)
    assert np.all(np.abs(y1 - (c + (A[ell] * scale) @ v + Bs[j] @ v)) <= 2 * (d + 2) * eps * size1)
    at = rng.choice(m * k, size=min(m * k, 7), replace=False)
    (s0, s1), (s0p, s1p) = sizes(at), sizes_p(at)
    for s0_ in (s0, s0p):
        np.testing.assert_allclose(s0_, abs(c) + np.abs(X[at, 1, :]) @ per_entry, rtol=1e-12)
    np.testing.assert_allclose(s1p, abs(c) + np.abs(X[at, 0, :]) @ per_entry, rtol=1e-12)
    np.testing.assert_allclose(s1, size1[at], rtol=1e-12)  # a sum of two values: the sizes of both terms
    assert np.all(s1 >= s1p * (1 - 1e-12))


def test_pairs_at_their_own_scales_are_the_pairwise_build():
    rng = np.random.default_rng(3)
    A, Bs, v = rng.standard_normal((9, 5)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    ell, j = rng.integers(0, 9, 300), rng.integers(0, 4, 300)
    s = rng.uniform(0.1, 10.0, 300)
    X, (y0, y1, sizes) = grid_queries(A, s, Bs, ell, j, v, -1.5)
    assert _same_bits(X, two_row_queries(A[ell] * s[:, None], Bs[j]))
    np.testing.assert_allclose(y1 - y0, (A[ell] * s[:, None]) @ v, rtol=1e-10, atol=1e-12)
    s0, s1 = sizes(np.array([5, 17]))
    np.testing.assert_allclose(s1, 1.5 + np.abs(X[[5, 17], 0, :]) @ (np.abs(v) + 1.5), rtol=1e-12)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 200), spread=st.floats(1e-16, 1e-2))
def test_sizes_asked_lazily_flag_the_same_answers_as_sizes_given(seed, n, spread):
    rng = np.random.default_rng(seed)
    y0, y1 = rng.normal(0, 1, n), rng.normal(0, 1, n)
    alpha = rng.uniform(-spread, 1 + spread, n)  # some answers a little beyond y0 or y1
    alpha[rng.random(n) < 0.1] = rng.choice([-1.0, 2.0])  # some far beyond
    y = alpha * y1 + (1 - alpha) * y0
    size0, size1 = np.abs(y0) * rng.uniform(1, 1e6, n), np.abs(y1) * rng.uniform(1, 1e6, n)
    error = RoundingError(1e-10)
    asked = []

    def sizes(at):
        asked.append(at)
        return size0[at], size1[at]

    given_ = invert_two_row(y, y0, y1, error, size0, size1)
    lazy = invert_two_row(y, y0, y1, error, sizes=sizes)
    assert np.array_equal(given_.outside, lazy.outside)
    assert np.array_equal(given_.values, lazy.values, equal_nan=True)
    if asked:  # only answers beyond y0 or y1 were asked for their sizes
        assert np.all((y[asked[0]] - y0[asked[0]]) * (y1[asked[0]] - y[asked[0]]) < 0)


def test_query_memory_is_reused_only_when_nothing_holds_it():
    memory = QueryMemory()
    first = memory.empty((6, 2, 3))
    address = first.__array_interface__["data"][0]
    del first
    second = memory.empty((5, 2, 3))  # free again and large enough: the same memory
    assert second.__array_interface__["data"][0] == address
    kept_view = second[1:3]
    del second
    third = memory.empty((6, 2, 3))  # a view of the last block is alive: fresh memory
    assert not np.shares_memory(third, kept_view)
    del third
    bigger = memory.empty((12, 2, 3))
    assert bigger.shape == (12, 2, 3) and not np.shares_memory(bigger, kept_view)


def test_an_oracle_that_keeps_its_queries_finds_them_unchanged():
    head = random_head(24, seed=5)
    kept = []

    def keeping(X):
        kept.append((X, X.copy()))
        return head(X)

    res = extract_exact(Oracle(keeping, 24), seed=5, block_floats=2**12)  # many small blocks
    assert res.check.passed and len(kept) > 10
    assert all(np.array_equal(x, copy) for x, copy in kept)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31), B=st.integers(1, 600), N=st.integers(1, 3), d=st.integers(1, 64),
       spread=st.floats(0.0, 30.0))
def test_the_row_norm_check_finds_the_largest_row_norm_exactly(seed, B, N, d, spread):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((B, N, d)) * np.exp(spread * rng.standard_normal((B, N, 1)))
    X[rng.integers(B)] = X[0] * (1 + 2**-52)  # a near tie
    assert max_row_norm(X) == float(np.max(np.linalg.norm(X, axis=-1)))


def test_the_row_norm_check_is_exact_among_rows_of_equal_norm():
    rng = np.random.default_rng(0)  # permutations of one row: equal norms, rounded differently by each sum
    row = rng.standard_normal(384) * np.exp(2 * rng.standard_normal(384))
    X = np.stack([rng.permutation(row) for _ in range(400)])[:, None, :]
    assert len(set(np.linalg.norm(X, axis=-1).ravel())) > 1
    assert max_row_norm(X) == float(np.max(np.linalg.norm(X, axis=-1)))


def test_the_row_norm_check_passes_inf_and_nan_through():
    X = np.ones((300, 2, 4))
    X[7, 1, 2] = np.inf
    assert max_row_norm(X) == np.inf
    X[7, 1, 2] = np.nan
    assert np.isnan(max_row_norm(X[:200]))


def test_an_oracle_that_scribbles_on_its_queries_changes_nothing():
    head = random_head(16, seed=2)

    def scribbling(X):
        y = head(X)
        X[...] = np.nan  # after answering: the learner must not read its queries back
        return y

    clean = extract_exact(Oracle(head, 16), seed=2, check=False)  # (the check compares on its own queries)
    dirty = extract_exact(Oracle(scribbling, 16), seed=2, check=False)
    assert dirty.queries == clean.queries
    assert np.array_equal(dirty.model.W, clean.model.W) and np.array_equal(dirty.model.u, clean.model.u)


class _SwitchingSys:
    """``sys`` for the query memory with a thread switch inside its free-memory test, where a busy process may
    switch threads: the test and the hand-out must be one step."""

    @staticmethod
    def getrefcount(obj):
        count = sys.getrefcount(obj) - 1  # less this frame's own reference
        time.sleep(0)
        return count


def test_query_memory_shared_between_threads_hands_each_block_to_one_holder(monkeypatch):
    import attnprobe.learners.head.sigmoid as sigmoid

    monkeypatch.setattr(sigmoid, "sys", _SwitchingSys())
    memory = QueryMemory()
    first = memory.empty((50, 2, 4))
    address = first.__array_interface__["data"][0]
    del first
    assert memory.empty((50, 2, 4)).__array_interface__["data"][0] == address  # the shim counts right
    clashes = []

    def work(tag):
        for _ in range(200):
            block = memory.empty((50, 2, 4))
            block[...] = tag
            time.sleep(0)  # let the other threads ask while this block is held
            if not np.all(block == tag):
                clashes.append(tag)
            del block

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not clashes


def test_query_memory_keeps_no_block_above_its_limit():
    memory = QueryMemory(keep=100)
    small = memory.empty((10, 2, 5))
    address = small.__array_interface__["data"][0]
    del small
    big = memory.empty((11, 2, 5))  # 110 floats: fresh, and not kept
    assert big.shape == (11, 2, 5)
    del big
    again = memory.empty((10, 2, 5))
    assert again.__array_interface__["data"][0] == address


def test_an_empty_grid_is_an_empty_block():
    for m, k in ((0, 3), (3, 0), (0, 0)):
        X, (y0, y1, _) = grid_queries(np.ones((m, 4)), 2.0, np.ones((k, 4)), None, None, np.ones(4), 0.5)
        assert X.shape == (0, 2, 4) and y0.shape == y1.shape == (0,)
