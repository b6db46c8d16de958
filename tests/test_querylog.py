"""The query log: answers stored before use, reruns ask only what is missing, replay, identity; resumption of a
SIGKILLed ``extract --url`` against a real server with no query asked twice."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from attnprobe.errors import BudgetExceededError, ConfigError, OracleError
from attnprobe.learners import extract_exact
from attnprobe.oracles import Oracle
from attnprobe.oracles.querylog import MAX_PROBES, PROBES_PER_LENGTH, QueryLog, ReplayOracle, sequence_keys
from attnprobe.targets.random_heads import random_head


class Counting:
    """A head that records how many sequences it was asked (to prove what the log saves); it breaks down once
    it has answered ``fail_after`` sequences."""

    def __init__(self, head, fail_after=None):
        self.head, self.asked, self.d, self.fail_after = head, 0, head.d, fail_after

    def __call__(self, X):
        if self.fail_after is not None and self.asked + len(X) > self.fail_after:
            raise RuntimeError("the service is down")
        self.asked += len(X)
        return self.head(X)


def test_answers_round_trip_exactly_and_keys_ignore_the_sign_of_zero(tmp_path):
    X = (np.random.default_rng(0).standard_normal((50, 3, 4))
         * 10.0 ** np.random.default_rng(1).integers(-300, 300, (50, 1, 1)))
    y = np.random.default_rng(2).standard_normal(50) * 1e-300
    log = QueryLog(tmp_path / "q.sqlite", identity="x", d=4)
    keys = sequence_keys(X)
    log.store(keys, X, y)
    got = log.lookup(keys)
    assert np.array_equal(np.array([got[k] for k in keys]), y)
    Z = np.zeros((1, 2, 4))
    assert sequence_keys(Z) == sequence_keys(-Z)
    assert sequence_keys(Z) != sequence_keys(np.zeros((1, 4, 2)).reshape(1, 2, 4) + 1e-300)


def test_rerun_asks_only_the_log_check_and_is_bit_identical(tmp_path):
    head = random_head(8, seed=2)
    fn1 = Counting(head)
    o1 = Oracle(fn1, 8, log=QueryLog(tmp_path / "q.sqlite", identity="head", d=8))
    r1 = extract_exact(o1, seed=3)
    assert fn1.asked == o1.queries and o1.from_log == 0
    fn2 = Counting(head)
    o2 = Oracle(fn2, 8, budget=MAX_PROBES + r1.check.queries, log=QueryLog(tmp_path / "q.sqlite", identity="head",
                                                                       d=8))
    r2 = extract_exact(o2, seed=3)  # answers from the log cost nothing; the probes and the check are asked
    verified = r2.queries_by_phase.pop("log check")
    assert 1 <= verified <= MAX_PROBES
    assert fn2.asked == verified + r2.check.queries  # the functional check never comes from the log
    assert o2.from_log == r1.queries
    assert r2.queries == r1.queries + verified and r2.queries_by_phase == r1.queries_by_phase
    for k, a in r1.model.arrays().items():
        assert np.array_equal(a, r2.model.arrays()[k])
    assert o2.log.summary()["from_log"] == r1.queries


def test_a_failure_keeps_what_was_answered_and_the_rerun_completes(tmp_path):
    head = random_head(6, seed=4)
    ref = Oracle(head, 6)
    extract_exact(ref, seed=0)
    path = tmp_path / "q.sqlite"
    fn1 = Counting(head, fail_after=30)
    o1 = Oracle(fn1, 6, max_batch=4, log=QueryLog(path, identity="h", d=6))
    with pytest.raises(OracleError, match="the service is down"):
        extract_exact(o1, seed=0)
    stored = len(QueryLog(path, identity="h", d=6))
    assert stored == fn1.asked > 0
    fn2 = Counting(head)
    o2 = Oracle(fn2, 6, log=QueryLog(path, identity="h", d=6))
    extract_exact(o2, seed=0)
    verified = o2.queries_by_phase["log check"]  # the recorded probes, asked again to recognise the oracle
    assert 1 <= verified <= MAX_PROBES
    assert fn2.asked == ref.queries - stored + verified  # nothing else asked twice
    assert o2.queries == ref.queries + verified


def test_budget_counts_only_what_is_asked(tmp_path):
    head = random_head(5, seed=1)
    path = tmp_path / "q.sqlite"
    o1 = Oracle(head, 5, log=QueryLog(path, identity="h", d=5))
    X = np.random.default_rng(0).standard_normal((10, 2, 5))
    o1(X)
    probes = min(PROBES_PER_LENGTH, MAX_PROBES)  # one sequence length recorded: its probes are re-asked
    o2 = Oracle(head, 5, budget=3 + probes, log=QueryLog(path, identity="h", d=5))
    Y = np.concatenate([X, np.random.default_rng(1).standard_normal((3, 2, 5))])
    assert np.array_equal(o2(Y), head(Y))
    assert (o2.queries, o2.from_log, o2.remaining) == (13 + probes, 10, 0)
    assert o2.queries_by_phase["log check"] == probes
    with pytest.raises(BudgetExceededError, match="missing from the log"):
        o2(np.random.default_rng(2).standard_normal((1, 2, 5)))


def test_the_log_refuses_another_oracle_and_replay_refuses_missing_queries(tmp_path):
    path = tmp_path / "q.sqlite"
    QueryLog(path, identity="model A", d=4).store(sequence_keys(np.ones((1, 1, 4))), np.ones((1, 1, 4)), [1.5])
    with pytest.raises(ConfigError, match="belongs to another oracle"):
        QueryLog(path, identity="model B", d=4)
    with pytest.raises(ConfigError, match="belongs to another oracle"):
        QueryLog(path, identity="model A", d=5)
    log = QueryLog(path, readonly=True)
    o = Oracle(ReplayOracle(log), log.d, log=log)
    assert o(np.ones((1, 1, 4)))[0] == 1.5
    with pytest.raises(OracleError, match="lacks 1 of the queries"):
        o(np.zeros((1, 1, 4)))
    assert o.queries == 1 and o.from_log == 1  # the refused query was not counted
    with pytest.raises(ConfigError, match="does not exist"):
        QueryLog(tmp_path / "none.sqlite", readonly=True)
    (tmp_path / "junk.sqlite").write_bytes(b"not a database" * 100)
    with pytest.raises(ConfigError, match="not a usable query log"):
        QueryLog(tmp_path / "junk.sqlite", identity="x", d=1)


# --- the CLI against a real server, killed with SIGKILL at random points ---------------------------------------

pytest.importorskip("fastapi")


def _args(url, log, out):
    return ["extract", "--url", url, "--log", str(log), "--out", str(out), "--quiet", "--seed", "1",
            "--concurrency", "2"]


def _cli(url, log, out, key):
    env = dict(os.environ, ATTNPROBE_API_KEY=key, PYTHONPATH=str(Path(__file__).parents[1] / "src"))
    cmd = [sys.executable, "-m", "attnprobe", *_args(url, log, out)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _sigkill_and_resume(tmp_path, monkeypatch, n_kills, seed):
    from attnprobe.service import KeyStore, ServiceOptions, build_app
    from attnprobe.service.keys import key_hash
    from attnprobe.service.server import BackgroundServer

    head = random_head(10, seed=5)
    keys = KeyStore(["ref", "victim"])
    app = build_app(head, ServiceOptions(d=10, max_batch=3), keys)
    used = lambda key: keys.usage(key_hash(key)).queries  # noqa: E731
    rng = np.random.default_rng(seed)
    # the server holds every request that arrives once the threshold is reached until the run is killed: the kill
    # then always lands mid-run, however fast the client is or however slowly this thread is scheduled
    threshold_now, release = [np.inf], threading.Event()
    charge = keys.charge

    def held_charge(kh, n):
        if used("victim") >= threshold_now[0]:
            release.wait(60)
        charge(kh, n)

    monkeypatch.setattr(keys, "charge", held_charge)
    with BackgroundServer(app) as srv:
        from attnprobe.cli import main

        monkeypatch.setenv("ATTNPROBE_API_KEY", "ref")  # the reference: the same command, uninterrupted
        assert main(_args(srv.url, tmp_path / "ref.sqlite", tmp_path / "ref.npz")) == 0
        total = used("ref")
        assert total > 150
        log = tmp_path / "run.sqlite"
        kills = []
        for threshold in sorted(rng.integers(1, total, size=n_kills)):
            threshold_now[0] = threshold
            release.clear()
            p = _cli(srv.url, log, tmp_path / "run.npz", "victim")
            while p.poll() is None and used("victim") < threshold:
                time.sleep(0.001)
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                kills.append(used("victim"))
            p.communicate(timeout=60)
            release.set()  # the held requests go on (their client is gone): answered into closed sockets
        threshold_now[0] = np.inf
        assert len(kills) == n_kills, f"only {len(kills)} of {n_kills} runs were killed mid-run"
        final = _cli(srv.url, log, tmp_path / "run.npz", "victim")
        _, err = final.communicate(timeout=120)
        assert final.returncode == 0, err
        # no query of the learner charged twice across the kills: each resume re-asks only the log's probes
        # (the functional check is always asked afresh; an identical batch is answered by the server's
        # idempotency cache at no charge)
        assert total <= used("victim") <= total + len(kills) * MAX_PROBES
    a, b = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "run.npz")
    for name in a.files:
        assert np.array_equal(a[name], b[name]), name
    summary = json.loads((tmp_path / "run.json").read_text())["details"]["oracle"]
    result = json.loads((tmp_path / "run.json").read_text())
    verified = result["queries_by_phase"].get("log check", 0)
    assert summary["queries_from_log"] > 0 and summary["queries_total"] == total + verified
    assert summary["precision"] == "float64" and summary["precision_source"] == "detected from the answers"


def test_sigkill_then_rerun_completes_with_no_repeated_query(tmp_path, monkeypatch):
    _sigkill_and_resume(tmp_path, monkeypatch, n_kills=2, seed=20261123)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_many_sigkills_then_rerun_completes_with_no_repeated_query(tmp_path, monkeypatch, seed):
    _sigkill_and_resume(tmp_path, monkeypatch, n_kills=6, seed=seed)
