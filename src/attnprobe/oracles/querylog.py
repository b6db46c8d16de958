"""The query log: every query and answer in SQLite (WAL) before the learner sees it.

A sequence is keyed by the SHA-256 of its float64 bytes (``-0.0`` folded into ``0.0``) and shape, so the
seeded learners, which repeat their queries exactly, find every answer already paid for: a rerun with the same
log asks the oracle only for what is missing, and ``replay`` runs a learner offline from the log alone.
Answers are one number per sequence, or K numbers (a vector-answer oracle) stored as float64 bytes, or N × K
numbers (an every-position oracle: the output row at each of the sequence's N positions; the log records
``answers = every position`` and refuses to mix them with last-position answers).

A log belongs to one oracle. It records the oracle's identity (where it comes from and the defences on its
answers), its width ``d``, its outputs K and the declared answer precision, and refuses to be opened for a
different one. Because a name can lie (another model served on the same URL, a file replaced under the same
name), the log also keeps a few recorded sequences whole (``probes``): a run that resumes a log first asks the
oracle those again and refuses the log when the answers differ (:meth:`QueryLog.verify`).

Durability: each batch is committed (WAL, ``synchronous=NORMAL``) before its answers are returned, so a
SIGKILL loses at most the batch in flight (which the served API does not charge twice: see
:mod:`attnprobe.oracles.http`). A log that cannot be written (full disk, file-size limit) ends the run with
:class:`QueryLogWriteError`.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import time
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError, OracleError
from attnprobe.oracles.precision_detect import PrecisionDetector

SCHEMA_VERSION = "2"
#: schema versions this code reads (1: scalar answers only, no probes table; its answers read the same)
READABLE_SCHEMAS = ("1", "2")
#: keys per SELECT ... IN (...) (SQLite allows 32766 host parameters; smaller chunks keep statements cheap)
LOOKUP_CHUNK = 900
#: recorded sequences kept whole per sequence length, and in all, to re-ask when a run resumes; length-1 answers
#: (``xᵀv + c``) do not depend on the attention (W, u) at all, so that length gets one probe and the others two
PROBES_PER_LENGTH = 2
MAX_PROBES = 8
#: resumed answers must agree with the recorded ones to this many roundings of the answers (their precision,
#: declared or read from the probes' answers, times the answers' scale), on top of declared noise: the same model
#: answers identically up to a few roundings (another batch shape may sum in another order); a float32 layer
#: whose W, u are 1.001 times another's differs by 1e-5..1e-3 of the scale on sequences of length ≥ 2
VERIFY_ROUNDINGS = 64

#: ``meta.answers`` of a log of every-position answers
EVERY_POSITION = "every position"

_TABLES = {"meta": ("key", "value"), "answers": ("key", "n", "y", "t"), "probes": ("key", "n", "x")}


class MissingFromLog(OracleError):
    """``replay`` needed an answer the log does not hold."""


class QueryLogWriteError(OracleError):
    """The log could not store answers (disk full, file-size limit, read-only file)."""


def sequence_keys(X: np.ndarray) -> list[bytes]:
    """One 32-byte key per sequence of the batch ``X`` (B, N, d): SHA-256 of its shape and float64 bytes."""
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float64) + 0.0)  # + 0.0 folds -0.0 into 0.0
    B, N, d = X.shape
    head = f"{N}x{d}:".encode()
    flat = X.reshape(B, -1)
    return [hashlib.sha256(head + row.tobytes()).digest() for row in flat]


class QueryLog:
    """An SQLite file of (sequence key → answer) for one oracle.

    ``identity`` (a string naming the oracle: file hash, URL and server name, MODULE:ATTR, and the answer
    defences), ``d`` and ``precision`` are stored on first use and checked on every later open: a mismatch raises
    :class:`ConfigError`. ``defences`` (the answer chain's spec) records the defences on the answers so that a
    replay can refuse flags that contradict them. ``d`` may be left to :meth:`attach`, which the Oracle calls when it is
    built with
    the log. A log that does not exist yet is created at its first answer (a run refused before any query leaves
    no file). ``asked`` counts answers stored by this process, ``hits`` answers served from the log.
    """

    def __init__(self, path: str | Path, *, identity: str | None = None, d: int | None = None,
                 precision: str | None = None, defences: str | None = None, readonly: bool = False):
        self.path = Path(path)
        self.readonly = bool(readonly)
        self.asked = 0
        self.hits = 0
        self.verified = False
        self.refused = False  # set when verify found the answers of another oracle
        self._want = {"schema": SCHEMA_VERSION, "identity": identity, "precision": precision,
                      "defences": None if defences is None else str(defences)}
        self._d = None
        self._outputs = None
        self._every: bool | None = None  # every-position answers (N × K per sequence); None while empty
        self.db = None
        self._closed_len = 0
        exists = self.path.exists()
        if readonly and not exists:
            raise ConfigError(f"--replay needs an existing query log; {self.path} does not exist", param="log")
        if exists and not self.path.is_file():
            raise ConfigError(f"the query log {self.path} is not a regular file; give a file path for the log",
                              param="log")
        if not exists and identity is None:
            raise ConfigError("a new query log needs the oracle's identity", param="identity")
        try:
            if exists:
                self._connect()
                self._check_meta(readonly)
            if d is not None:
                self.attach(d)
        except BaseException:
            self.close()
            raise

    # --- the file -------------------------------------------------------------------------------------------
    def _fail(self, exc: Exception, doing: str) -> ConfigError:
        return ConfigError(f"{self.path} is not a usable query log ({doing}: SQLite said: {exc}); give another log "
                           "file", param="log")

    def _connect(self) -> None:
        """Open the file; an existing SQLite file must be a query log (checked before anything is written)."""
        try:
            self.db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False)
            names = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            tables = {t: tuple(r[1] for r in self.db.execute(f"PRAGMA table_info({t})")) for t in _TABLES}
        except sqlite3.Error as exc:
            raise self._fail(exc, "opening it") from exc
        if names and not {"meta", "answers"} <= names:
            raise ConfigError(f"{self.path} is an SQLite file but not a query log of attnprobe (it has tables "
                              f"{', '.join(sorted(names)[:5])}); give another log file", param="log")
        for table, columns in _TABLES.items():
            if tables[table] and tables[table] != columns:
                raise ConfigError(f"{self.path} is an SQLite file but not a query log of attnprobe (its table "
                                  f"{table!r} has columns {', '.join(tables[table])}); give another log file",
                                  param="log")
        if self.readonly:
            return
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self.db.execute("CREATE TABLE IF NOT EXISTS answers (key BLOB PRIMARY KEY, n INTEGER NOT NULL, "
                            "y NOT NULL, t REAL NOT NULL)")
            self.db.execute("CREATE TABLE IF NOT EXISTS probes (key BLOB PRIMARY KEY, n INTEGER NOT NULL, "
                            "x BLOB NOT NULL)")
        except sqlite3.Error as exc:
            raise QueryLogWriteError(f"cannot prepare the query log {self.path} (SQLite said: {exc}); give a "
                                     "writable log file") from exc

    def _execute(self, sql: str, params=(), doing: str = "reading it"):
        try:
            return self.db.execute(sql, params)
        except sqlite3.Error as exc:
            raise self._fail(exc, doing) from exc

    # --- identity -------------------------------------------------------------------------------------------
    def meta(self) -> dict:
        if self.db is None:
            return {}
        rows = self._execute("SELECT key, value FROM meta").fetchall()
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in rows):
            raise ConfigError(f"{self.path} is a damaged query log (its metadata is not text); give another log file",
                              param="log")
        return dict(rows)

    def _check_meta(self, readonly) -> None:
        meta = self.meta()
        if not meta:
            if readonly:
                raise ConfigError(f"{self.path} holds no queries yet; run without --replay first", param="replay")
            return
        if meta.get("schema") not in READABLE_SCHEMAS:
            raise ConfigError(f"{self.path} is a query log of another format (schema {meta.get('schema')!r}; this "
                              f"version reads {', '.join(READABLE_SCHEMAS)}); give a new log file", param="log")
        self._d = _int_meta(meta, "d", self.path)
        self._outputs = _int_meta(meta, "outputs", self.path)
        if self._outputs is not None:
            self._every = meta.get("answers") == EVERY_POSITION
        for k, v in self._want.items():
            if k in ("schema", "precision") or v is None or meta.get(k) is None or meta[k] == v:
                continue
            raise ConfigError(f"the query log {self.path} belongs to another oracle: its {k} is {meta[k]!r} but "
                              f"this run's is {v!r}; answers of two oracles must not mix, so give a new log file",
                              param="log")

    def attach(self, d: int, outputs: int | None = None, precision: str | None = None) -> None:
        """Bind the log to an oracle of width ``d`` (and ``outputs`` K when known): refuse a log of another.
        ``precision``: what the oracle declares about its answers (or ``"auto"``), recorded for a replay."""
        if precision is not None and self._want["precision"] is None:
            self._want["precision"] = str(precision)
        d = int(d)
        if self._d is not None and self._d != d:
            raise ConfigError(f"the query log {self.path} belongs to another oracle: it holds queries of width "
                              f"d = {self._d} but this oracle's is d = {d}; give a new log file", param="log")
        self._d = d
        if outputs is not None:
            self._check_outputs(int(outputs))

    def _check_outputs(self, k: int) -> None:
        if self._outputs is not None and self._outputs != k:
            raise ConfigError(f"the query log {self.path} belongs to another oracle: it holds {self._outputs} "
                              f"answer(s) per sequence but this oracle answers {k}; give a new log file", param="log")

    @property
    def d(self) -> int:
        if self._d is None:
            raise ConfigError(f"the query log {self.path} does not record the width d; give another log file",
                              param="log")
        return self._d

    @property
    def precision(self) -> str | None:
        """The answer precision the recording oracle declared (``"auto"``: read from its answers)."""
        return self.meta().get("precision")

    @property
    def outputs(self) -> int | None:
        """Answers per sequence the log holds (None while it holds none)."""
        return self._outputs

    def defences(self) -> str | None:
        """The defences on the answers the log recorded (an answer-chain spec; None for a log that did not
        record them)."""
        return self.meta().get("defences")

    def _create(self, outputs: int, every: bool) -> None:
        """Write the metadata of a new log (at its first answer)."""
        if self.db is None:
            self._connect()
        meta = {k: v for k, v in self._want.items() if v is not None}
        meta["d"] = str(self.d)
        meta["outputs"] = str(outputs)
        if every:
            meta["answers"] = EVERY_POSITION
        meta["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._write([("INSERT OR IGNORE INTO meta VALUES (?, ?)", list(meta.items()))])
        self._outputs, self._every = outputs, bool(every)

    @property
    def every_position(self) -> bool | None:
        """Whether the log holds every-position answers (None while it holds none)."""
        return self._every

    # --- answers --------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self.db is None:
            return self._closed_len
        return int(self._execute("SELECT COUNT(*) FROM answers").fetchone()[0])

    def lookup(self, keys: list[bytes]) -> dict[bytes, float | np.ndarray]:
        """The recorded answers of the sequences with these keys (a float, or a (K,) array for vector answers)."""
        found: dict[bytes, float | np.ndarray] = {}
        if self.db is None:
            return found
        for i in range(0, len(keys), LOOKUP_CHUNK):
            chunk = keys[i:i + LOOKUP_CHUNK]
            q = "SELECT key, n, y FROM answers WHERE key IN (" + ",".join("?" * len(chunk)) + ")"
            for k, n, y in self._execute(q, chunk).fetchall():
                found[k] = self._decode(y, n)
        return found

    def _decode(self, y, n=None):
        if self._every:
            ok = isinstance(y, bytes) and isinstance(n, int) and n > 0 and len(y) == 8 * n * self._outputs
            value = np.frombuffer(y, dtype="<f8").reshape(n, self._outputs).copy() if ok else None
            ok = ok and bool(np.all(np.isfinite(value)))
        elif isinstance(y, bytes) and self._outputs not in (None, 1) and len(y) == 8 * self._outputs:
            value = np.frombuffer(y, dtype="<f8").copy()
            ok = bool(np.all(np.isfinite(value)))
        elif isinstance(y, (int, float)) and not isinstance(y, bool) and self._outputs in (None, 1):
            value = float(y)
            ok = math.isfinite(value)
        else:
            ok = False
        if not ok:
            raise ConfigError(f"{self.path} is a damaged query log: it holds an answer that is not "
                              f"{self._outputs or 1} finite number(s) ({type(y).__name__}); give a new log file",
                              param="log")
        return value

    def _write(self, statements) -> None:
        """Run ``(sql, rows)`` pairs in one transaction, durable before returning."""
        try:
            with self.db:
                self.db.execute("BEGIN")
                for sql, rows in statements:
                    self.db.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise QueryLogWriteError(f"cannot store answers in the query log {self.path} (SQLite said: {exc}); "
                                     "the answers of the last batch were paid but not logged: free disk space or "
                                     "raise the file-size limit and rerun") from exc

    def store(self, keys: list[bytes], X: np.ndarray, y: np.ndarray) -> None:
        """Commit the answers ``y`` ((B,) or (B, K)) of the sequences ``X`` in one transaction; a few sequences
        of each new length are kept whole as probes for :meth:`verify`."""
        y = np.asarray(y, dtype=np.float64)
        every = y.ndim == 3
        k = 1 if y.ndim == 1 else int(y.shape[-1])
        if self._outputs is None:
            self._create(k, every)
        self._check_outputs(k)
        if every != self._every:
            held = "every position" if self._every else "the last position"
            raise ConfigError(f"the query log {self.path} holds answers at {held} but this oracle answers "
                              f"{'every position' if every else 'the last position'}; give a new log file", param="log")
        now = time.time()
        N = int(X.shape[1])
        rows = [(key, N, float(v), now) for key, v in zip(keys, y)] if k == 1 and not every else \
            [(key, N, np.ascontiguousarray(v, dtype="<f8").tobytes(), now) for key, v in zip(keys, y)]
        statements = [("INSERT OR IGNORE INTO answers VALUES (?, ?, ?, ?)", rows)]
        probes = self._new_probes(keys, X)
        if probes:
            statements.append(("INSERT OR IGNORE INTO probes VALUES (?, ?, ?)", probes))
        self._write(statements)

    def answer(self, X: np.ndarray, ask) -> np.ndarray:
        """Answers of the batch ``X``: those in the log from it, the rest from ``ask(X_missing)``, stored first.

        Repeated sequences inside one batch are asked once. ``ask`` is the counting, validating path of the
        :class:`~attnprobe.oracles.base.Oracle`, so only the missing sequences are charged to the oracle.
        """
        X = np.asarray(X, dtype=np.float64)
        keys = sequence_keys(X)
        found = self.lookup(keys)
        missing: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k not in found and k not in missing:
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
            found.update(zip(missing, ym))
        return np.array([found[k] for k in keys], dtype=np.float64)

    def _new_probes(self, keys, X) -> list:
        N = int(X.shape[1])
        have = self._execute("SELECT n, COUNT(*) FROM probes GROUP BY n").fetchall()
        total = sum(c for _, c in have)
        room = min((1 if N == 1 else PROBES_PER_LENGTH) - dict(have).get(N, 0), MAX_PROBES - total)
        if room <= 0:
            return []
        X = np.asarray(X, dtype=np.float64) + 0.0
        picked, seen = [], set()
        for i, key in enumerate(keys):
            if key not in seen and len(picked) < room:
                seen.add(key)
                picked.append((key, N, np.ascontiguousarray(X[i], dtype="<f8").tobytes()))
        return picked

    def probes(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The recorded probes as ``(X (B, N, d), recorded answers)`` per sequence length."""
        if self.db is None:
            return []
        rows = self._execute("SELECT key, n, x FROM probes ORDER BY n, key").fetchall()
        by_n: dict[int, list] = {}
        for key, n, x in rows:
            if not (isinstance(n, int) and isinstance(x, bytes) and len(x) == 8 * n * self.d and n > 0):
                raise ConfigError(f"{self.path} is a damaged query log (a recorded probe is not {self.d} x N "
                                  "numbers); give a new log file", param="log")
            by_n.setdefault(n, []).append((key, np.frombuffer(x, dtype="<f8").reshape(n, self.d)))
        out = []
        for n, items in by_n.items():
            found = self.lookup([k for k, _ in items])
            items = [(k, x) for k, x in items if k in found]
            if items:
                out.append((np.stack([x for _, x in items]), np.array([found[k] for k, _ in items])))
        return out

    def verify(self, ask, noise=None, eps: float = 0.0) -> None:
        """Ask the oracle the recorded probes again (``ask(X) -> y``) and refuse the log when the answers differ
        by more than ``VERIFY_ROUNDINGS`` roundings and the declared ``noise`` (an
        :class:`~attnprobe.oracles.noise.AnswerNoise`) explain: the log would mix the answers of two oracles.
        The rounding is the coarser of ``eps`` (the declared precision's machine epsilon) and the precision the
        probes' answers show (float32 answers round-trip through float32). Done once per log; a replay asks
        nothing."""
        if self.verified or self.readonly:
            return
        self.verified = True
        groups = self.probes()
        if not groups:
            return
        worst, count = 0.0, 0
        asked = []
        for X, recorded in groups:
            fresh = np.asarray(ask(X), dtype=np.float64)
            if fresh.size != recorded.size:
                self.refused = True
                held = "every position" if self._every else "the last position"
                raise ConfigError(f"the query log {self.path} holds answers at {held} but this oracle answers "
                                  f"shape {fresh.shape} for {len(X)} recorded sequences of {X.shape[1]} rows; "
                                  "answers of two oracles must not mix, so give a new log file", param="log")
            asked.append((recorded, fresh.reshape(recorded.shape)))
        seen = PrecisionDetector()
        for recorded, fresh in asked:
            seen.observe(recorded)
            seen.observe(fresh)
        relative = VERIFY_ROUNDINGS * max(float(eps), seen.eps, 2.0 * (0.0 if noise is None else noise.rel_eps))
        for recorded, fresh in asked:
            count += len(recorded)
            if noise is not None and noise.membership:  # 0/1 answers: the same oracle gives the same labels
                if not noise.fresh and np.any(fresh != recorded):
                    worst = max(worst, float(np.mean(fresh != recorded)))
                continue
            absolute = 0.0 if noise is None else 2 * (noise.tolerance + 4 * noise.sigma)  # two answers' noise
            scale = float(np.max(np.abs(recorded))) + 1e-300  # (a mean of squares could overflow)
            with np.errstate(over="ignore", invalid="ignore"):  # answers near the float64 limit
                allowed = absolute + relative * np.abs(recorded) + relative * scale
                gap = np.abs(fresh - recorded)
            if np.any(gap > allowed):
                worst = max(worst, float(np.max(gap) / scale))
        if worst > 0:
            self.refused = True
            raise ConfigError(f"the query log {self.path} was recorded from another oracle: asked again, {count} "
                              f"recorded queries were answered differently (by up to {worst:.2g} of the answers' "
                              f"scale, where their rounding allows {2 * relative:.1e}); answers of two oracles must "
                              "not mix, so give a new log file", param="log")

    def summary(self) -> dict:
        """What the summary JSON reports under ``query_log``."""
        return {"path": str(self.path), "from_log": self.hits, "asked": self.asked, "stored": len(self)}

    def close(self) -> None:
        """Close the file (its WAL folded back in); ``len`` still says how many answers it held."""
        if self.db is not None:
            try:
                self._closed_len = len(self)
            except ConfigError:
                pass
            self.db.close()
            self.db = None


def _int_meta(meta: dict, key: str, path: Path) -> int | None:
    text = meta.get(key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(value) != text.strip():
        raise ConfigError(f"{path} is a damaged query log (its {key} is {text!r}, not a positive integer); give a "
                          "new log file", param="log")
    return value


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


def file_sha256(path: str | Path) -> str:
    """The first 16 hex digits of the SHA-256 of a file's bytes, read in chunks (a checkpoint need not fit in
    memory twice); one :class:`ConfigError` when it cannot be read."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()[:16]
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}", param="path") from exc


def file_identity(path: str | Path) -> str:
    """``file sha256:HASH`` of a saved model (the same file under another name is the same oracle)."""
    return f"file sha256:{file_sha256(path)}"
