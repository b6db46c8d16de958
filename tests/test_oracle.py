import sys
import textwrap

import numpy as np
import pytest

from attnprobe.errors import BudgetExceededError, ConfigError, OracleAnswerError, OracleError
from attnprobe.models import save_model
from attnprobe.oracles import Oracle, load_callable, oracle_from_file, oracle_from_spec
from attnprobe.targets import random_head


def test_counts_every_sequence():
    m = random_head(4, seed=0)
    o = Oracle(m, 4)
    o(np.zeros((3, 2, 4)))
    o(np.zeros((5, 1, 4)))
    assert o.queries == 8


def test_splits_large_batches_and_counts_exactly():
    calls = []

    def fn(X):
        calls.append(len(X))
        return X[:, -1, 0]

    o = Oracle(fn, 2, max_batch=4)
    y = o(np.arange(20.0).reshape(10, 1, 2))
    assert calls == [4, 4, 2] and o.queries == 10
    assert np.array_equal(y, np.arange(0.0, 20.0, 2.0))


def test_budget_refuses_before_asking():
    calls = []
    o = Oracle(lambda X: calls.append(1) or np.zeros(len(X)), 3, budget=5)
    o(np.zeros((5, 1, 3)))
    with pytest.raises(BudgetExceededError, match="budget"):
        o(np.zeros((1, 1, 3)))
    assert len(calls) == 1 and o.queries == 5
    with pytest.raises(BudgetExceededError, match="at least 12"):
        o.require(7, "the next step")


@pytest.mark.parametrize("answer, match", [
    # (B, K) and (B, N, K) answers are fine; (B, M, 1) with M ≠ N is not
    (lambda X: np.zeros((len(X), X.shape[1] + 1, 1)), "shape"),
    (lambda X: np.zeros(len(X) + 1), "shape"),
    (lambda X: np.full(len(X), np.nan), "non-finite"),
    (lambda X: np.full(len(X), np.inf), "non-finite"),
    (lambda X: ["a"] * len(X), "not numbers"),
])
def test_rejects_bad_answers(answer, match):
    o = Oracle(answer, 2)
    with pytest.raises(OracleAnswerError, match=match):
        o(np.zeros((3, 2, 2)))
    assert o.queries == 3  # the queries were spent even though the answers were useless


def test_wraps_exceptions_of_the_callable():
    def boom(X):
        raise RuntimeError("model crashed")

    with pytest.raises(OracleError, match="model crashed"):
        Oracle(boom, 2)(np.zeros((1, 1, 2)))


def test_rejects_non_callable_and_bad_queries():
    with pytest.raises(OracleError):
        Oracle(42, 3)
    with pytest.raises(ConfigError):
        Oracle(lambda X: X, 3)(np.zeros((2, 2, 4)))


def test_load_module_attr(tmp_path, monkeypatch):
    (tmp_path / "victim_mod.py").write_text(textwrap.dedent("""
        import numpy as np
        class Victim:
            d = 3
            def __call__(self, X):
                return X[:, -1, :].sum(axis=1)
        victim = Victim()
        not_callable = 5
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    o = oracle_from_spec("victim_mod:victim", None, budget=10)
    assert o.d == 3 and o.budget == 10
    assert np.allclose(o(np.ones((2, 1, 3))), [3.0, 3.0])
    with pytest.raises(OracleError, match="not a callable"):
        load_callable("victim_mod:not_callable")
    with pytest.raises(OracleError, match="no attribute"):
        load_callable("victim_mod:missing")
    with pytest.raises(OracleError, match="cannot import"):
        load_callable("no_such_module_xyz:f")
    with pytest.raises(ConfigError, match="MODULE:ATTR"):
        load_callable("victim_mod")


def test_oracle_from_file_uses_the_saved_model(tmp_path):
    m = random_head(6, seed=3)
    path = save_model(m, tmp_path / "t.npz")
    o = oracle_from_file(path, dtype="float32")
    X = np.random.default_rng(0).standard_normal((4, 3, 6))
    assert o.precision == "float32"
    assert np.allclose(o(X), m(X), rtol=1e-5)
    assert not np.array_equal(o(X), m(X))


def test_vector_answers_count_one_query_per_sequence_and_keep_their_width():
    o = Oracle(lambda X: np.stack([X[:, 0, 0], 2 * X[:, 0, 1], X[:, -1, 0]], axis=1), 2)
    y = o(np.ones((4, 3, 2)))
    assert y.shape == (4, 3) and o.outputs == 3 and o.queries == 4
    assert o(np.zeros((0, 1, 2))).shape == (0, 3)
    # a callable whose width changes between batches is refused
    flip = iter([np.zeros((2, 3)), np.zeros((2, 4))])
    o2 = Oracle(lambda X: next(flip), 2)
    o2(np.ones((2, 1, 2)))
    with pytest.raises(OracleAnswerError, match=r"\(2, 3\)"):
        o2(np.ones((2, 1, 2)))
    # scalar answers stay scalar; outputs=K insists on K
    with pytest.raises(OracleAnswerError, match=r"\(3, 5\)"):
        Oracle(lambda X: np.zeros(len(X)), 2, outputs=5)(np.ones((3, 1, 2)))
    with pytest.raises(OracleAnswerError, match=r"\(3, 2\)"):
        Oracle(lambda X: np.zeros((len(X), 3)), 2, outputs=2)(np.ones((3, 1, 2)))
    s = Oracle(lambda X: np.zeros(len(X)), 2)
    assert s(np.ones((3, 1, 2))).shape == (3,) and s.outputs == 1
