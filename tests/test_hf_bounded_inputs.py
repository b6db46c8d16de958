"""Bounded inputs: the largest probe norm an oracle was sent, a bound it refuses past, and clipping read from
the answers (length-1 answers are affine in the row: DESIGN "The math in one screen")."""

import json
import re

import numpy as np
import pytest

from attnprobe.cli import main
from attnprobe.errors import ConfigError, InputNormError
from attnprobe.models import save_model
from attnprobe.oracles import Oracle
from attnprobe.oracles.input_bound import clipping_norm, ladder, refuse_clipping
from attnprobe.targets import random_head, random_multihead


def clamped(fn, R):
    """``fn`` behind a server that scales every input row down to norm ``R`` (a row-norm clamp)."""
    def answer(X):
        n = np.linalg.norm(X, axis=-1, keepdims=True)
        return fn(X * np.minimum(1.0, R / np.where(n > 0, n, 1.0)))
    return answer


def test_the_largest_row_norm_is_recorded():
    oracle = Oracle(random_head(4, seed=0), 4)
    assert oracle.max_input_norm_used == 0.0
    X = np.zeros((3, 2, 4))
    X[1, 0] = [3.0, 4.0, 0.0, 0.0]
    X[2, 1] = [1.0, 0.0, 0.0, 0.0]
    oracle(X)
    assert oracle.max_input_norm_used == 5.0
    oracle(X / 10)  # a smaller batch leaves the maximum alone
    assert oracle.max_input_norm_used == 5.0


def test_a_row_past_the_bound_is_refused_before_asking():
    calls = []

    def fn(X):
        calls.append(len(X))
        return X.sum(axis=(1, 2))

    oracle = Oracle(fn, 3, max_input_norm=2.0, budget=100)
    X = np.ones((4, 2, 3)) / np.sqrt(3) * 2.0  # every row has norm exactly 2: accepted
    oracle(X)
    X[2, 1, 0] += 0.1
    with pytest.raises(InputNormError, match=r"norm 2\.\d+ \(sequence 2, row 1.*at most 2\b") as info:
        oracle(X)
    assert info.value.limit == 2.0 and info.value.norm > 2.0
    assert calls == [4] and oracle.queries == 4 and oracle.max_input_norm_used == pytest.approx(2.0)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "10"])
def test_a_bad_bound_is_refused(bad):
    with pytest.raises(ConfigError, match="max_input_norm"):
        Oracle(random_head(3), 3, max_input_norm=bad)


def test_ladder_reaches_the_bound():
    assert ladder(1e13)[-1] == 1e13 and len(ladder(1e13)) == 14
    assert list(ladder(0.5)) == [0.05, 0.5]
    assert np.all(np.diff(ladder(37.0)) > 0)


@pytest.mark.parametrize("R", [3.0, 1e4, 1e6, 5e12])
@pytest.mark.parametrize("vector", [False, True])
def test_a_row_clamp_is_found_at_its_norm(R, vector):
    model = random_multihead(8, 2, seed=int(R) % 7)
    fn = model if not vector else (lambda X: np.stack([model(X), 2 * model(X) + 1], axis=1))
    oracle = Oracle(clamped(fn, R), 8)
    got = clipping_norm(oracle, 1e13, seed=1)
    assert got == pytest.approx(R, rel=1e-6)
    assert oracle.queries == len(ladder(1e13)) + 1 == oracle.queries_by_phase["input bound"]
    with pytest.raises(InputNormError, match=re.escape(f"clips inputs at norm ≈ {R:.3g}")):
        refuse_clipping(oracle, 1e13)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_no_clamp_no_refusal(dtype):
    """Over several seeds, exact and float32 answers are never taken for a clamp (up to norm 1e13)."""
    for seed in range(5):
        model = random_multihead(8, 3, seed=seed, dtype=dtype)
        oracle = Oracle(model, 8, precision=dtype)
        assert clipping_norm(oracle, 1e13, seed=seed) is None
        refuse_clipping(oracle, 1e6, seed=seed)
    assert clipping_norm(Oracle(clamped(model, 1e20), 8), 1e13) is None  # a clamp past the probes is invisible


def test_an_entrywise_clamp_is_found_too():
    model = random_multihead(8, 2, seed=3)
    got = clipping_norm(Oracle(lambda X: model(np.clip(X, -100.0, 100.0)), 8), 1e13)
    assert got is not None and 100.0 <= got <= 100.0 * np.sqrt(8)


def test_the_declared_bound_caps_the_ladder():
    model = random_multihead(8, 2, seed=4)
    oracle = Oracle(model, 8, max_input_norm=50.0)
    assert clipping_norm(oracle, 1e13) is None
    assert oracle.max_input_norm_used == pytest.approx(50.0)


def test_cli_reports_the_norm_used_and_refuses_past_the_bound(tmp_path, capsys):
    target = save_model(random_head(6, seed=2), tmp_path / "t.npz")
    out = tmp_path / "r.npz"
    assert main(["extract", "--target", str(target), "--out", str(out), "--quiet"]) == 0
    oracle = json.loads(out.with_suffix(".json").read_text())["details"]["oracle"]
    assert oracle["max_input_norm_used"] > 0 and oracle["max_input_norm"] is None
    used = oracle["max_input_norm_used"]
    capsys.readouterr()
    code = main(["extract", "--target", str(target), "--out", str(tmp_path / "s.npz"), "--quiet",
                 "--max-input-norm", str(used / 2)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "--max-input-norm" in err and "queries spent" in err
    assert main(["extract", "--target", str(target), "--out", str(tmp_path / "u.npz"), "--quiet",
                 "--max-input-norm", str(used * 1.001)]) == 0


VICTIM = """
import numpy as np
from attnprobe.targets import random_head, random_multihead
head, layer = random_head(16, seed=1), random_multihead(16, 2, seed=1)
def clamp(fn, R):
    def answer(X):
        n = np.linalg.norm(X, axis=-1, keepdims=True)
        return fn(X * np.minimum(1.0, R / np.where(n > 0, n, 1.0)))
    return answer
head_3, layer_1e4 = clamp(head, 3.0), clamp(layer, 1e4)
"""


@pytest.mark.parametrize("victim, method", [("head_3", "exact"), ("head_3", "lowrank"), ("head_3", "robust"),
                                            ("layer_1e4", "multihead")])
def test_a_run_stopped_by_clipping_is_refused_naming_the_clipping(tmp_path, monkeypatch, capsys, victim, method):
    """Behind a row clamp at 3 the head learners' probes (norms up to ~10) get answers of another function: the
    CLI reads the clamp from a few length-1 answers and names it (exit 2, one line, nothing written), where the
    learner alone would blame the model or fail its check; the generic multi-head learner's own refusal (clipping
    at a norm below its saturated probes) gets the bound read from the answers."""
    import sys

    (tmp_path / "clamped_victim.py").write_text(VICTIM)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = main(["extract", "--oracle", f"clamped_victim:{victim}", "--d", "16", "--method", method,
                 "--out", "r.npz", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "clips" in err and not (tmp_path / "r.npz").exists()
    R = "3" if victim == "head_3" else "1e+04"
    assert re.search(f"clips inputs at norm ≈ {re.escape(R)} "
                     ".*(sent rows of norm up to|probes up to norm) \\d", err), err
    assert "--max-input-norm" in err


def test_a_successful_run_asks_nothing_about_clipping(tmp_path):
    target = save_model(random_multihead(8, 2, seed=2), tmp_path / "t.npz")
    out = tmp_path / "r.npz"
    assert main(["extract", "--target", str(target), "--method", "multihead", "--out", str(out), "--quiet"]) == 0
    summary = json.loads(out.with_suffix(".json").read_text())
    assert "input bound" not in summary["queries_by_phase"]
