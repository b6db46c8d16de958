"""The query log (docs/architecture.md, "Query log"): every query and answer in SQLite (WAL) before the learner sees it.

A sequence is keyed by the SHA-256 of its float64 bytes (``-0.0`` folded into ``0.0``) and shape, so the
seeded learners, which repeat their queries exactly, find every answer already paid for: a rerun with the same
log asks the oracle only for what is missing, and ``replay`` runs a learner offline from the log alone.
The log records the oracle's identity, its width ``d`` and the declared answer precision, and refuses to be
used with a different oracle (answers of two models must never mix).

Durability: each batch is committed (WAL, ``synchronous=NORMAL``) before its answers are returned, so a
SIGKILL loses at most the batch in flight (which the served API does not charge twice: see
:mod:`attnprobe.oracles.http`).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError, OracleError

SCHEMA_VERSION = "1"
#: keys per SELECT ... IN (...) (SQLite allows 32766 host parameters; smaller chunks keep statements cheap)
LOOKUP_CHUNK = 900


class MissingFromLog(OracleError):
    """``replay`` needed an answer the log does not hold."""


def sequence_keys(X: np.ndarray) -> list[bytes]:
    """One 32-byte key per sequence of the batch ``X`` (B, N, d): SHA-256 of its shape and float64 bytes."""
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float64) + 0.0)  # + 0.0 folds -0.0 into 0.0
    B, N, d = X.shape
    head = f"{N}x{d}:".encode()
    flat = X.reshape(B, -1)
    return [hashlib.sha256(head + row.tobytes()).digest() for row in flat]


class QueryLog:
    """An SQLite file of (sequence key → answer) for one oracle.

    ``identity`` (a string naming the oracle: file hash, URL, MODULE:ATTR and the answer wrappers), ``d`` and
    ``precision`` are stored on first use and checked on every later open: a mismatch raises
    :class:`ConfigError`. ``asked`` counts answers stored by this process, ``hits`` answers served from the log.
    """

    def __init__(self, path: str | Path, *, identity: str | None = None, d: int | None = None,
                 precision: str | None = None, readonly: bool = False):
        self.path = Path(path)
        if readonly and not self.path.exists():
            raise ConfigError(f"--replay needs an existing query log; {self.path} does not exist")
        try:
            self.db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None,
                                      check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self.db.execute("CREATE TABLE IF NOT EXISTS answers (key BLOB PRIMARY KEY, n INTEGER NOT NULL, "
                            "y REAL NOT NULL, t REAL NOT NULL)")
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"{self.path} is not a usable query log (SQLite said: {exc}); give another --log "
                              "path") from exc
        self.asked = 0
        self.hits = 0
        self.readonly = bool(readonly)
        self._check_meta(identity, d, precision, readonly)

    # --- identity -------------------------------------------------------------------------------------------
    def meta(self) -> dict:
        return dict(self.db.execute("SELECT key, value FROM meta").fetchall())

    def _check_meta(self, identity, d, precision, readonly) -> None:
        meta = self.meta()
        want = {"schema": SCHEMA_VERSION, "identity": identity, "d": None if d is None else str(int(d)),
                "precision": precision}
        if not meta:
            if readonly:
                raise ConfigError(f"{self.path} holds no queries yet; run without --replay first")
            if identity is None or d is None:
                raise ConfigError("a new query log needs the oracle's identity and width d")
            with self.db:
                self.db.execute("BEGIN")
                for k, v in want.items():
                    if v is not None:
                        self.db.execute("INSERT INTO meta VALUES (?, ?)", (k, v))
                self.db.execute("INSERT INTO meta VALUES ('created', ?)", (time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                          time.gmtime()),))
            return
        for k, v in want.items():
            if v is not None and meta.get(k) not in (None, v):
                raise ConfigError(f"the query log {self.path} belongs to another oracle: its {k} is "
                                  f"{meta.get(k)!r} but this run's is {v!r}; answers of two oracles must not mix, "
                                  "so give a new --log file")

    @property
    def d(self) -> int:
        return int(self.meta()["d"])

    @property
    def identity(self) -> str:
        return self.meta().get("identity", "")

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))

    # --- answers --------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM answers").fetchone()[0])

    def lookup(self, keys: list[bytes]) -> dict[bytes, float]:
        found: dict[bytes, float] = {}
        for i in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[i:i + LOOKUP_CHUNK]
            q = "SELECT key, y FROM answers WHERE key IN (" + ",".join("?" * len(chunk)) + ")"
            found.update(self.db.execute(q, chunk).fetchall())
        return found

    def store(self, keys: list[bytes], X: np.ndarray, y: np.ndarray) -> None:
        """Commit the answers ``y`` of the sequences ``X`` (one transaction, durable before returning)."""
        if np.ndim(y) != 1:
            raise ConfigError(f"the query log stores one number per sequence, but the oracle answers {np.shape(y)[1:]} "
                              "numbers per sequence (K outputs); run without a query log", param="log")
        now = time.time()
        N = int(X.shape[1])
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("INSERT OR IGNORE INTO answers VALUES (?, ?, ?, ?)",
                                [(k, N, float(v), now) for k, v in zip(keys, y)])

    def answer(self, X: np.ndarray, ask) -> np.ndarray:
        """Answers of the batch ``X``: those in the log from it, the rest from ``ask(X_missing)``, stored first.

        Repeated sequences inside one batch are asked once. ``ask`` is the counting, validating path of the
        :class:`~attnprobe.oracles.base.Oracle`, so only the missing sequences are charged to the oracle.
        """
        X = np.asarray(X, dtype=np.float64)
        keys = sequence_keys(X)
        found = self.lookup(keys)
        y = np.empty(len(keys))
        missing: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k in found:
                y[i] = found[k]
            elif k not in missing:
                missing[k] = i
        if missing and self.readonly:
            raise MissingFromLog(f"the query log {self.path} lacks {len(missing)} of the queries this run needs "
                                 f"(it holds {len(self)}); --replay reruns only what the log recorded, so run the "
                                 "same command without --replay (the log will be completed)")
        self.hits += len(keys) - len(missing)
        if missing:
            idx = np.fromiter(missing.values(), dtype=np.int64, count=len(missing))
            ym = np.asarray(ask(X[idx]), dtype=np.float64)
            self.store(list(missing), X[idx], ym)
            self.asked += len(idx)
            got = dict(zip(missing, ym))
            for i, k in enumerate(keys):
                if k in got:
                    y[i] = got[k]
        return y

    def summary(self) -> dict:
        """What the summary JSON reports under ``query_log``."""
        return {"path": str(self.path), "from_log": self.hits, "asked": self.asked, "stored": len(self)}

    def close(self) -> None:
        self.db.close()


class ReplayOracle:
    """The callable behind a replay (``--replay``): the log (opened ``readonly``) answers everything, and a query
    it lacks raises :class:`MissingFromLog` before anything is counted."""

    def __init__(self, log: QueryLog):
        self.log = log
        self.d = log.d
        self.__name__ = f"replay of {log.path.name}"

    def __call__(self, X: np.ndarray) -> np.ndarray:  # reached only when the log is not opened read-only
        raise MissingFromLog(f"{self.__name__} has no answer for {len(X)} queries the log lacks")


def identity_of(source: str, **options) -> str:
    """A stable identity string: the oracle ``source`` plus every option that changes its answers."""
    opts = {k: v for k, v in sorted(options.items()) if v is not None and v is not False}
    return source + ("" if not opts else " " + json.dumps(opts, sort_keys=True))


def file_identity(path: str | Path) -> str:
    """``file:NAME sha256:HASH`` of a saved model (the same file under another name is the same oracle)."""
    p = Path(path)
    try:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from exc
    return f"file sha256:{digest}"


def answer_through_log(oracle, X: np.ndarray) -> np.ndarray:
    """The :class:`~attnprobe.oracles.base.Oracle`'s path when it has a ``log``: answers in the log are counted
    in ``oracle.queries`` and ``oracle.from_log`` (not against the budget); only the missing sequences are
    asked (budget checked for them alone), validated, and stored before anything is returned."""
    log = oracle.log

    def ask_missing(Xm: np.ndarray) -> np.ndarray:
        oracle.require(len(Xm), f"a batch of {len(Xm)} queries missing from the log", paid=True)
        return oracle._ask(Xm)

    before = log.hits
    y = log.answer(X, ask_missing)
    hits = log.hits - before
    oracle._charge(hits)  # counted (and charged to the current phase) like any answer, but not paid for
    oracle.from_log += hits
    return y
