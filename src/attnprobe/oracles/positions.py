"""Every-position answers: one sequence, an output row at every position (docs/every-position.md).

An oracle callable that answers ``(B, N, K)`` for ``X (B, N, d)`` gives the output row at every position. Two
kinds of layer make those rows answers to *other* last-position queries:

- **causal** (a decoder): row i depends on ``X[:i+1]`` only, so row i is the last-position answer on the prefix
  ``X[:i+1]``;
- **bidirectional without position terms** (an encoder whose attention does not see positions): the rows are
  permutation-equivariant, so row i is the last-position answer on ``X`` with ``x_i`` moved last.

A bidirectional layer with position terms (``"positional"``) answers every position too, but its rows answer no
other query. :func:`read_positions` tells the three apart with one probe of three sequences (does row i change
when a later token changes? do the rows follow a permutation of the tokens?). :class:`RowAnswers` keeps the rows
seen as last-position answers (a causal prefix, a moved-last permutation), so that a learner asking
last-position queries gets those already answered without asking again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.rows import POSITIONS, REUSABLE, check_positions
from attnprobe.oracles.wrappers import declared_attribute

__all__ = ["POSITIONS", "REUSABLE", "check_positions", "declared_positions", "probe_sequences",
           "positions_from_rows", "RowAnswers"]

#: the probe's sequence length
PROBE_LENGTH = 4
#: numbers of answer rows kept by :class:`RowAnswers` (64 MB of float64)
CACHE_NUMBERS = 1 << 23


def declared_positions(fn) -> str | None:
    """What the callable ``fn`` (or the callable it wraps) declares about its rows (attribute ``positions``)."""
    value = declared_attribute(fn, "positions", lambda v: v in POSITIONS)
    return None if value is None else str(value)


def probe_sequences(d: int, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """The three sequences of the probe: ``X``, ``X`` with its last token changed, and ``X`` reversed."""
    X = rng.standard_normal((PROBE_LENGTH, d)) * scale / np.sqrt(d)
    changed = X.copy()
    changed[-1] = rng.standard_normal(d) * scale / np.sqrt(d)
    return np.stack([X, changed, X[::-1]])


def positions_from_rows(Y: np.ndarray, tolerance: float) -> str:
    """The kind of rows (:data:`POSITIONS`) from the answers ``Y (3, N, K)`` to :func:`probe_sequences`.

    Causal: the rows before the changed last token are unchanged. Otherwise bidirectional when the reversed
    sequence's rows are the rows reversed (permutation-equivariant: no position terms), else positional.
    ``tolerance``: the largest difference that is rounding, relative to the answers' scale."""
    Y = np.asarray(Y, dtype=np.float64)
    scale = max(float(np.max(np.abs(Y))), 1e-300)
    earlier = float(np.max(np.abs(Y[0, :-1] - Y[1, :-1]))) / scale
    last = float(np.max(np.abs(Y[0, -1] - Y[1, -1]))) / scale
    if last <= tolerance:
        raise ConfigError("the every-position probe's last row did not change when the last token did: the rows do "
                          "not depend on the tokens at this scale; declare the positions (causal or bidirectional)",
                          param="positions")
    if earlier <= tolerance:
        return "causal"
    moved = float(np.max(np.abs(Y[2] - Y[0, ::-1]))) / scale
    return "bidirectional" if moved <= tolerance else "positional"


def _digest(parts) -> bytes:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.digest()


def _token_bytes(X: np.ndarray) -> np.ndarray:
    """Each token of ``X (..., d)`` as float64 bytes (``-0.0`` folded into ``0.0``): an array of byte strings."""
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float64) + 0.0)
    return X.view(np.dtype((np.void, X.shape[-1] * 8)))[..., 0]


def _multiset(tokens: np.ndarray) -> bytes:
    """A key of the multiset of a sequence's tokens (byte strings), independent of their order."""
    return _digest([b"set%d:" % len(tokens), *sorted(t.tobytes() for t in tokens)])


class RowAnswers:
    """Answer rows kept as last-position answers: under the key of the query each row answers.

    ``positions`` is ``"causal"`` (row i answers ``X[:i+1]``) or ``"bidirectional"`` (row i answers ``X`` with
    ``x_i`` moved last: a query is keyed by its multiset of tokens and its last token). At most ``numbers``
    answer numbers are kept (the oldest dropped first)."""

    def __init__(self, positions: str, numbers: int = CACHE_NUMBERS):
        self.positions = check_positions(positions, kinds=REUSABLE, auto=False)
        self.numbers = int(numbers)
        self._rows: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._held = 0

    def __len__(self) -> int:
        return len(self._rows)

    def query_keys(self, X: np.ndarray) -> list[bytes]:
        """The key of each last-position query of the batch ``X (B, N, d)``."""
        T = _token_bytes(X)
        if self.positions == "causal":
            return [_digest([b"prefix:", *(t.tobytes() for t in seq)]) for seq in T]
        return [_digest([_multiset(seq), seq[-1].tobytes()]) for seq in T]

    def group_keys(self, X: np.ndarray) -> list[bytes]:
        """Queries with the same group key are answered by one sequence (bidirectional: the same multiset of
        tokens; causal: the same query)."""
        if self.positions == "causal":
            return self.query_keys(X)
        return [_multiset(seq) for seq in _token_bytes(X)]

    def row_keys(self, X: np.ndarray) -> list[list[bytes]]:
        """For each sequence of ``X``, the key of the query each of its rows answers."""
        out = []
        for seq in _token_bytes(X):
            if self.positions == "causal":
                h = hashlib.sha256(b"prefix:")
                keys = []
                for t in seq:
                    h.update(t.tobytes())
                    keys.append(h.copy().digest())
            else:
                base = _multiset(seq)
                keys = [_digest([base, t.tobytes()]) for t in seq]
            out.append(keys)
        return out

    def store(self, X: np.ndarray, Y: np.ndarray) -> None:
        """Keep every row of the answers ``Y (B, N, K)`` to ``X (B, N, d)``."""
        for keys, rows in zip(self.row_keys(X), Y):
            for key, row in zip(keys, rows):
                if key not in self._rows:
                    self._rows[key] = np.array(row, dtype=np.float64)
                    self._held += row.size
        while self._held > self.numbers and self._rows:
            self._held -= self._rows.popitem(last=False)[1].size

    def get(self, key: bytes):
        """The row answering the query with this key, or None."""
        return self._rows.get(key)
