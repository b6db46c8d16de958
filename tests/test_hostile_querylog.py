"""Hostile query logs: another oracle behind the same name, replays that contradict the recording, foreign,
damaged and unwritable logs. Each case: exit code 2, one stderr line, no file harmed."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnprobe.errors import ConfigError
from attnprobe.learners import extract_exact
from attnprobe.models.io import save_model
from attnprobe.oracles import Oracle
from attnprobe.oracles.querylog import QueryLog
from attnprobe.targets.random_heads import random_head
from hostile import refused, run

D = 4


@pytest.fixture
def logged(tmp_path, capsys):
    """A head saved to head.npz and one extraction of it through q.sqlite (the log a rerun resumes)."""
    save_model(random_head(D, seed=1), tmp_path / "head.npz")
    rc, _, err = run(capsys, "extract", "--target", tmp_path / "head.npz", "--log", tmp_path / "q.sqlite",
                     "--out", tmp_path / "a.npz", "--quiet")
    assert rc == 0, err
    return tmp_path


def _extract(folder, *extra):
    return ("extract", "--log", folder / "q.sqlite", "--out", folder / "b.npz", "--quiet", *extra)


def test_a_log_recorded_from_another_callable_of_the_same_name_is_refused(tmp_path):
    """Same identity string, other answers: the recorded probes asked again expose it before any answer is
    reused; the log is untouched."""
    A, B = random_head(D, seed=1), random_head(D, seed=2)
    path = tmp_path / "q.sqlite"
    extract_exact(Oracle(A, D, log=QueryLog(path, identity="callable victims:head", d=D)), seed=0)
    stored = len(QueryLog(path, identity="callable victims:head"))
    o = Oracle(B, D, log=QueryLog(path, identity="callable victims:head"))
    with pytest.raises(ConfigError, match="recorded from another oracle"):
        extract_exact(o, seed=0)
    assert o.from_log == 0 and o.queries == o.queries_by_phase["log check"] > 0
    assert len(QueryLog(path, identity="callable victims:head")) == stored
    # the same oracle resumes: nothing refused, the answers reused
    o = Oracle(A, D, log=QueryLog(path, identity="callable victims:head"))
    extract_exact(o, seed=0)
    assert o.from_log > 0


def test_another_model_served_on_the_same_url_is_refused(tmp_path, capsys, monkeypatch):
    pytest.importorskip("fastapi")
    from attnprobe.service import KeyStore, ServiceOptions, build_app
    from attnprobe.service.server import BackgroundServer

    monkeypatch.setenv("ATTNPROBE_API_KEY", "k")
    A, B = random_head(D, seed=1), random_head(D, seed=2)
    with BackgroundServer(build_app(A, ServiceOptions(d=D, name="head"), KeyStore(["k"]))) as srv:
        url, port = srv.url, srv.port
        rc, _, err = run(capsys, "extract", "--url", url, "--log", tmp_path / "q.sqlite", "--out",
                         tmp_path / "a.npz", "--quiet")
        assert rc == 0, err
    with BackgroundServer(build_app(B, ServiceOptions(d=D, name="head"), KeyStore(["k"])), port=port) as srv:
        assert srv.url == url
        line = refused(capsys, tmp_path, "extract", "--url", url, "--log", tmp_path / "q.sqlite", "--out",
                       tmp_path / "b.npz", "--quiet", says="recorded from another oracle")
        assert "nothing logged" in line and "resume" not in line


def test_the_functional_check_is_asked_afresh_even_when_the_log_holds_its_answers(logged, capsys):
    """Tampered answers in the log cannot make a check pass: the check's queries always go to the oracle."""
    db = sqlite3.connect(logged / "q.sqlite")
    n = db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
    # the check's longer sequences (the learner's are 1-2); the log's probes stay true (they would be caught)
    db.execute("UPDATE answers SET y = y + 1.0 WHERE n > 2 AND key NOT IN (SELECT key FROM probes)")
    db.commit()
    db.close()
    rc, _, err = run(capsys, *_extract(logged, "--target", logged / "head.npz"))
    assert rc == 0, err
    import json

    oracle = json.loads((logged / "b.json").read_text())["details"]["oracle"]
    assert oracle["check_answered_by"].startswith("the oracle")
    assert oracle["queries_asked"] >= json.loads((logged / "b.json").read_text())["check"]["queries"]
    assert oracle["query_log"]["stored"] == n


@pytest.mark.parametrize("extra, says", [
    (["--target", "head.npz"], "drop --target"),
    (["--oracle", "victims:head"], "drop --oracle"),
    (["--round-digits", "3"], "(round-digits:3) contradict those the log"),
    (["--method", "membership"], "(membership) contradict those the log"),
    (["--noise", "avq:1e-3"], "(avq:0.001) contradict those the log"),
    (["--defense", "float16"], "(float16) contradict those the log"),
])
def test_replay_refuses_flags_that_contradict_the_recorded_oracle(logged, capsys, extra, says):
    extra = [str(logged / e) if e.endswith(".npz") else e for e in extra]
    refused(capsys, logged, *_extract(logged, "--replay", *extra), says=says)


def test_replay_takes_the_recorded_defences(tmp_path, capsys):
    save_model(random_head(D, seed=1), tmp_path / "head.npz")
    args = ("--target", tmp_path / "head.npz", "--noise", "avq:1e-4", "--method", "robust", "--log",
            tmp_path / "q.sqlite", "--quiet")
    rc, _, err = run(capsys, "extract", *args, "--out", tmp_path / "a.npz")
    assert rc == 0, err
    for same in ([], ["--noise", "avq:1e-4"]):  # the recorded noise is declared again, or given identically
        rc, _, err = run(capsys, "extract", "--log", tmp_path / "q.sqlite", "--replay", "--method", "robust",
                         "--quiet", "--out", tmp_path / "b.npz", *same)
        assert rc == 0, err
        a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
        assert all(np.array_equal(a[k], b[k]) for k in a.files)


def test_a_log_of_yes_no_answers_replays_only_for_the_membership_learner(tmp_path, capsys):
    save_model(random_head(D, seed=1, bias=False), tmp_path / "head.npz")  # App. B's model: no output bias
    rc, _, err = run(capsys, "extract", "--target", tmp_path / "head.npz", "--method", "membership", "--log",
                     tmp_path / "q.sqlite", "--out", tmp_path / "a.npz", "--quiet")
    assert rc == 0, err
    refused(capsys, tmp_path, *_extract(tmp_path, "--replay"), says="replay them with --method membership")
    rc, _, err = run(capsys, *_extract(tmp_path, "--replay", "--method", "membership"))
    assert rc == 0, err


def _damage(path, sql):
    db = sqlite3.connect(path)
    db.executescript(sql)
    db.commit()
    db.close()


@pytest.mark.parametrize("damage, says", [
    ("UPDATE meta SET value = 'abc' WHERE key = 'd'", "damaged query log"),
    ("UPDATE answers SET y = 'abc' WHERE n <= 2", "damaged query log"),
    ("UPDATE answers SET y = x'00ff' WHERE n <= 2", "damaged query log"),
    ("UPDATE answers SET y = 9e999 WHERE n <= 2", "damaged query log"),
    ("UPDATE meta SET value = '99' WHERE key = 'schema'", "another format"),
    ("DROP TABLE answers; CREATE TABLE answers (id INTEGER, text TEXT)", "not a query log of attnprobe"),
    ("UPDATE meta SET value = '3.5' WHERE key = 'd'", "damaged query log"),
])
@pytest.mark.parametrize("replay", [False, True])
def test_damaged_or_foreign_logs_are_refused_in_one_line(logged, capsys, damage, says, replay):
    _damage(logged / "q.sqlite", damage)
    extra = ["--replay"] if replay else ["--target", logged / "head.npz"]
    refused(capsys, logged, *_extract(logged, *extra), says=says)


def test_other_files_given_as_logs_are_refused(tmp_path, capsys):
    save_model(random_head(D, seed=1), tmp_path / "head.npz")
    (tmp_path / "junk.sqlite").write_bytes(b"not a database" * 100)
    (tmp_path / "dir.sqlite").mkdir()
    other = sqlite3.connect(tmp_path / "other.sqlite")
    other.execute("CREATE TABLE meta (a INTEGER)")
    other.commit()
    other.close()
    for name, says in [("junk.sqlite", "not a usable query log"), ("dir.sqlite", "not a regular file"),
                       ("other.sqlite", "not a query log of attnprobe")]:
        refused(capsys, tmp_path, "extract", "--target", tmp_path / "head.npz", "--log", tmp_path / name, "--out",
                tmp_path / "b.npz", "--quiet", says=says)


def test_huge_answers_in_a_log_end_in_one_line(tmp_path, capsys, monkeypatch):
    """A log of answers all 1e308 (finite, but their squares and sums overflow): every run, the resumed one and
    the replay included, ends in one line without numpy's warnings."""
    (tmp_path / "huge.py").write_text("import numpy as np\n\ndef fn(X):\n    return np.full(len(X), 1e308)\n")
    monkeypatch.chdir(tmp_path)
    base = ("extract", "--log", "q.sqlite", "--out", "b.npz", "--quiet")
    for extra in (["--oracle", "huge:fn", "--d", "4"], ["--oracle", "huge:fn", "--d", "4"], ["--replay"]):
        rc, _, err = run(capsys, *base, *extra)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("attnprobe: error:"), err
        assert " 0 answers in all" not in lines[0]  # the count is read before the log is closed


def test_vector_answers_are_logged_and_replayed(tmp_path):
    W = np.random.default_rng(0).standard_normal((3, D))

    def fn(X):
        return X[:, -1, :] @ W.T

    path = tmp_path / "q.sqlite"
    o = Oracle(fn, D, log=QueryLog(path, identity="vector", d=D))
    X = np.random.default_rng(1).standard_normal((5, 2, D))
    y = o(X)
    assert y.shape == (5, 3)
    log = QueryLog(path, readonly=True)
    assert log.outputs == 3
    from attnprobe.oracles.querylog import ReplayOracle

    again = Oracle(ReplayOracle(log), D, log=log)
    assert np.array_equal(again(X), y) and again.outputs == 3 and again.from_log == 5
    with pytest.raises(ConfigError, match="answers 1"):  # a scalar oracle may not use a vector log
        Oracle(lambda X: X[:, -1, 0], D, outputs=1, log=QueryLog(path, identity="vector"))


SCRIPT = r"""
import resource, sys
from attnprobe.cli import main
soft = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, resource.RLIM_INFINITY))
sys.exit(main(sys.argv[2:]))
"""


def test_a_log_write_that_fails_mid_run_ends_in_one_line(tmp_path):
    """File-size limit (RLIMIT_FSIZE) reached while the log grows: exit 2, one line, no traceback."""
    target = tmp_path / "head.npz"
    save_model(random_head(12, seed=3), target)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1] / "src"))
    cmd = [sys.executable, "-c", SCRIPT, str(40_000), "extract", "--target", str(target), "--log",
           str(tmp_path / "q.sqlite"), "--out", str(tmp_path / "r.npz"), "--quiet"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1 and "cannot store answers in the query log" in lines[0], p.stderr
    assert "queries spent" in lines[0]
    assert not (tmp_path / "r.npz").exists()


def test_log_paths_that_cannot_hold_a_log_are_refused_before_any_query(logged, capsys):
    for log, says in ((logged / "nodir" / "q.sqlite", "does not exist"), (logged / "head.npz", "not a usable query"),
                      (Path("/dev/null"), "not a regular file")):
        line = refused(capsys, logged, "extract", "--target", logged / "head.npz", "--log", log, "--out",
                       logged / "b.npz", "--quiet", says=says)
        assert "no queries spent" in line


def test_replay_refuses_an_outputs_count_the_log_contradicts(logged, capsys):
    refused(capsys, logged, *_extract(logged, "--replay", "--outputs", "2"), says="--outputs 2 does not match")


def test_a_budget_too_small_for_the_log_check_says_so(logged, capsys):
    line = refused(capsys, logged, *_extract(logged, "--target", logged / "head.npz", "--budget", "1"),
                   says="re-asked to check that the log is this oracle's")
    assert "queries spent" in line
