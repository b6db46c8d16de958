"""The query estimate (extract --estimate) against the queries real runs ask, on small targets of each kind."""

from __future__ import annotations

import pytest

from attnprobe.errors import ConfigError
from attnprobe.learners.estimate import estimate_queries
from attnprobe.learners.exact import extract_exact
from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.lowrank import extract_lowrank
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.oracles import Oracle
from attnprobe.targets import random_head, random_relu_net
from attnprobe.targets.multihead import random_multihead


def _within(est, oracle):
    """The real bill (every query the oracle answered, check included) in the stated range, and within 10 %."""
    assert est.low <= oracle.queries <= est.high, (est, oracle.queries)
    assert abs(est.queries - oracle.queries) <= 0.1 * oracle.queries


@pytest.mark.parametrize("d,seed", [(16, 0), (32, 1), (48, 2)])
def test_exact_estimate(d, seed):
    o = Oracle(random_head(d, seed=seed), d)
    extract_exact(o, seed=seed)
    _within(estimate_queries("exact", d), o)


@pytest.mark.parametrize("d,r", [(32, 4), (64, 8)])
def test_lowrank_estimate(d, r):
    o = Oracle(random_head(d, rank=r, seed=1), d)
    extract_lowrank(o, rank=r)
    _within(estimate_queries("lowrank", d, rank=r), o)


def test_multihead_estimate():
    o = Oracle(random_multihead(32, 4, seed=0), 32)
    extract_generic(o, rank=8, seed=0)
    _within(estimate_queries("multihead", 32, heads=4, rank=8), o)


def test_ffn_estimate_range():
    o = Oracle(random_relu_net(8, 8, seed=0), 8)
    extract_ffn(o, seed=0)
    est = estimate_queries("ffn", 8, hidden=8)
    assert est.low <= o.queries <= est.high, (est, o.queries)


def test_estimate_asks_what_it_needs_and_prices():
    with pytest.raises(ConfigError, match="rank"):
        estimate_queries("lowrank", 64)
    with pytest.raises(ConfigError, match="heads"):
        estimate_queries("multihead", 64, rank=8)
    with pytest.raises(ConfigError, match="no query estimate"):
        estimate_queries("nuclear", 64)
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
