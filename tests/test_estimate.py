"""The query estimate (extract --estimate) against the queries real runs ask, on small targets of each kind.

Every kind: the real bill of several seeds (every query the oracle answered, check included) lies in the stated
``[low, high]``; the attention learners' estimates are within 10 % of every seed, the ReLU-network learner's of
the seeds' mean. The same checks reject an estimate a fifth too high or too low, so a broken formula fails them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attnprobe.errors import ConfigError
from attnprobe.learners.core.estimate import estimate_queries
from attnprobe.learners.head.exact import extract_exact
from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.head.lowrank import extract_lowrank
from attnprobe.learners.multihead import extract_multihead
from attnprobe.models.every_position import EveryPositionLayer
from attnprobe.oracles import Oracle
from attnprobe.targets import random_head, random_relu_net
from attnprobe.targets.multihead import random_multihead
from test_multihead_vector import whole_row_layer


def _exact(seed):
    o = Oracle(random_head(24, seed=seed), 24)
    extract_exact(o, seed=seed)
    return o.queries


def _lowrank(seed):
    o = Oracle(random_head(48, rank=6, seed=seed), 48)
    extract_lowrank(o, rank=6, seed=seed)
    return o.queries


def _generic(seed):
    o = Oracle(random_multihead(32, 4, seed=seed), 32)
    extract_multihead(o, rank=8, seed=seed)  # outputs not declared: one query tells scalars from vectors
    return o.queries


def _vector(seed, precision="float64", d=24, H=3, positions=None):
    layer = whole_row_layer(d, H, seed, dtype=precision)
    fn = layer if positions is None else EveryPositionLayer(layer, causal=positions == "causal")
    o = Oracle(fn, d, outputs=d, precision=precision, positions=positions)
    extract_multihead(o, heads=H, seed=seed)
    return o.queries


def _ffn(seed, d=8, m=8, K=1, bias=False, precision="float64"):
    net = random_relu_net(d, m, seed=1000 * d + m + seed, bias=bias, outputs=None if K == 1 else K)
    o = Oracle(net.with_dtype(precision), d, precision=precision)
    extract_ffn(o, seed=seed)
    return o.queries


#: kind -> (real run of a seed, seeds, estimate arguments, tight: every seed within 10 % (else the mean))
CASES = {
    "exact": (_exact, 3, dict(method="exact", d=24), True),
    "lowrank": (_lowrank, 3, dict(method="lowrank", d=48, rank=6), True),
    "multihead-generic": (_generic, 2, dict(method="multihead", d=32, heads=4, rank=8), True),
    "multihead-vector": (_vector, 3, dict(method="multihead", d=24, heads=3, outputs=24), True),
    "multihead-vector-sketch": (lambda s: _vector(s, d=64, H=8), 1, dict(method="multihead", d=64, heads=8, outputs=64),
                                True),  # the logits of every W_h through Sec. 5's shared low-rank sketch
    "multihead-vector-float32": (lambda s: _vector(s, "float32"), 2,
                                 dict(method="multihead", d=24, heads=3, outputs=24, precision="float32"), True),
    # every position (declared): values d + 1, logits from every row; bidirectional rows separate on progressions
    "multihead-vector-every": (lambda s: _vector(s, d=64, H=8, positions="bidirectional"), 2,
                               dict(method="multihead", d=64, heads=8, outputs=64, positions="bidirectional"), True),
    "multihead-vector-every-causal": (lambda s: _vector(s, d=32, H=4, positions="causal"), 2,
                                      dict(method="multihead", d=32, heads=4, outputs=32, positions="causal"), True),
    "multihead-vector-every-float32": (lambda s: _vector(s, "float32", positions="bidirectional"), 2,
                                       dict(method="multihead", d=24, heads=3, outputs=24, precision="float32",
                                            positions="bidirectional"), True),
    "ffn": (_ffn, 6, dict(method="ffn", d=8, hidden=8), False),
    "ffn-biased-K-outputs": (lambda s: _ffn(s, 16, 16, 10, True), 6, dict(method="ffn", d=16, hidden=16, outputs=10),
                             False),
    "ffn-float32": (lambda s: _ffn(s, precision="float32"), 4, dict(method="ffn", d=8, hidden=8, precision="float32"),
                    False),
}


def holds(est, real, tight: bool) -> None:
    """The stated range holds every real bill; tight: every bill within 10 %, else their mean."""
    real = np.asarray(real)
    assert np.all((est.low <= real) & (real <= est.high)), (est, real)
    if tight:
        assert np.all(np.abs(est.queries - real) <= 0.1 * real), (est.queries, real)
    else:
        assert abs(est.queries - real.mean()) <= 0.1 * real.mean(), (est.queries, real)
    assert est.low <= est.queries <= est.high


def _scaled(est, factor):
    return dataclasses.replace(est, queries=int(est.queries * factor), low=int(est.low * factor),
                               high=int(est.high * factor))


@pytest.mark.parametrize("kind", CASES)
def test_the_estimate_holds_the_real_bill_and_one_off_by_a_fifth_does_not(kind):
    """One test a case: its seeds' real bills (the expensive part) are run once, in one worker, and both the
    estimate and the same estimate a fifth too low or too high are held against them."""
    run, seeds, kw, tight = CASES[kind]
    kw = dict(kw)
    est, real = estimate_queries(kw.pop("method"), kw.pop("d"), **kw), [run(s) for s in range(seeds)]
    holds(est, real, tight)
    for factor in (0.8, 1.2):
        with pytest.raises(AssertionError):
            holds(_scaled(est, factor), real, tight)


def test_vector_answers_are_declared_not_asked():
    """K ≥ 2 declared: the vector learner's plan (no rank needed); undeclared: one output, plus the probe query."""
    vec = estimate_queries("multihead", 384, heads=12, outputs=384)
    assert "vector answers" in vec.basis and vec.queries < 20_000
    scalar = estimate_queries("multihead", 384, heads=12, rank=32)
    declared = estimate_queries("multihead", 384, heads=12, rank=32, outputs=1)
    assert scalar.queries == declared.queries + 1 and scalar.queries > 10 * vec.queries
    with pytest.raises(ConfigError, match="head dimension") as info:
        estimate_queries("multihead", 384, heads=12)
    assert info.value.param == "rank"
    assert estimate_queries("multihead", 384, heads=12, outputs=384, precision="float32").queries > 3 * vec.queries


def test_estimate_asks_what_it_needs_and_prices():
    with pytest.raises(ConfigError, match="rank"):
        estimate_queries("lowrank", 64)
    with pytest.raises(ConfigError, match="heads"):
        estimate_queries("multihead", 64, rank=8)
    with pytest.raises(ConfigError, match="hidden"):
        estimate_queries("ffn", 64)
    with pytest.raises(ConfigError, match="no query estimate"):
        estimate_queries("nuclear", 64)
    for kw in (dict(method="ffn", hidden=8), dict(method="multihead", heads=2, outputs=8)):
        with pytest.raises(ConfigError, match="float32 or finer"):  # the learners refuse such answers
            estimate_queries(d=8, precision="float16", **kw)
    est = estimate_queries("exact", 64, price_per_1k=2.0)
    assert est.cost == pytest.approx(est.queries * 2.0 / 1000)
    assert estimate_queries("exact", 64).cost is None
    assert est.low <= est.queries <= est.high


def test_cli_estimate_prints_queries_and_cost_asking_none(tmp_path, capsys):
    from attnprobe.cli import main
    from attnprobe.models import save_model

    save_model(random_head(32, seed=0), tmp_path / "h.npz")
    rc = main(["extract", "--target", str(tmp_path / "h.npz"), "--estimate", "--price-per-1k", "2"])
    out = capsys.readouterr().out
    est = estimate_queries("exact", 32, price_per_1k=2.0)
    assert rc == 0 and f"about {est.queries} queries" in out and "0 asked" in out and f"{est.cost:.4g}" in out
    assert not list(tmp_path.glob("*.json"))
    assert main(["extract", "--target", str(tmp_path / "h.npz"), "--estimate", "--method", "lowrank"]) == 2
    assert main(["extract", "--target", str(tmp_path / "h.npz"), "--price-per-1k", "2",
                 "--out", str(tmp_path / "o.npz")]) == 2
    assert main(["extract", "--target", str(tmp_path / "h.npz")]) == 2


def test_cli_estimate_of_whole_output_rows_from_declared_outputs(tmp_path, capsys):
    """``--outputs K`` declares vector answers: the vector learner's estimate, asking nothing; without it the
    scalar learner's, which needs the head dimension."""
    from attnprobe.cli import main
    from attnprobe.models import save_model

    save_model(whole_row_layer(24, 3, 0), tmp_path / "layer.npz")
    base = ["extract", "--target", str(tmp_path / "layer.npz"), "--method", "multihead", "--heads", "3", "--estimate"]
    assert main(base + ["--outputs", "24"]) == 0
    out = capsys.readouterr().out
    est = estimate_queries("multihead", 24, heads=3, outputs=24)
    assert f"about {est.queries} queries" in out and "vector answers (K = 24)" in out and "0 asked" in out
    assert main(base) == 2
    assert "--rank" in capsys.readouterr().err
