"""Every-position rows: what a layer's rows are, the query each row answers, and a recovered last-position model
answering at every position the way its victim does.

A layer without position terms answers row i from the rows it sees: a causal layer's row i is its last-position
answer on ``X[:i+1]``, a bidirectional layer's its last-position answer on ``X`` with ``x_i`` moved last (the
softmax is a sum over keys, so their order does not matter): :func:`row_query`. :class:`AnswerRows` reads a
multi-head layer's rows in one pass (:func:`~attnprobe.models.every_position.every_position_rows`) and any other
model once per row.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.every_position import every_position_rows
from attnprobe.models.multihead import MultiHeadAttention

#: what an every-position layer's rows are (``"last"``: a layer answering the last position only)
POSITIONS = ("causal", "bidirectional", "positional")
#: the rows of these kinds answer other last-position queries (:func:`row_query`)
REUSABLE = ("causal", "bidirectional")
#: what a result's rows are, as stored in its ``.npz`` (``positions``): 0 the last only, 1 causal, 2 bidirectional
POSITION_CODES = {"last": 0, "causal": 1, "bidirectional": 2}


def check_positions(value, param: str = "positions", kinds: tuple[str, ...] = POSITIONS,
                    auto: bool = True) -> str | None:
    """``value`` as one of ``kinds``; with ``auto``, ``None``/``"auto"`` mean "read from the answers" (None).
    Anything else is refused naming ``param``."""
    if auto and (value is None or value == "auto"):
        return None
    if value not in kinds:
        why = f" (rows of a {value!r} layer answer no other query)" if value in POSITIONS else ""
        raise ConfigError(f"The '{param}' parameter must be one of {', '.join(kinds)}{' or auto' if auto else ''}; "
                          f"got {value!r}{why}", param=param)
    return str(value)


def row_query(X: np.ndarray, i: int, positions: str) -> np.ndarray:
    """The last-position query ``(B, N', d)`` that row ``i`` of ``X (B, N, d)`` answers: the prefix ``X[:, :i+1]``
    (``"causal"``) or ``X`` with ``x_i`` moved last (``"bidirectional"``)."""
    positions = check_positions(positions, kinds=REUSABLE, auto=False)
    if positions == "causal":
        return X[:, :i + 1]
    return np.concatenate([np.delete(X, i, axis=1), X[:, i:i + 1]], axis=1)


class AnswerRows:
    """``X (B, N, d) ↦ (B, N, K)`` (``(B, N)`` for scalar answers): ``model`` read at every position."""

    def __init__(self, model, positions: str):
        self.model, self.positions = model, check_positions(positions, kinds=REUSABLE, auto=False)
        self.d = model.d
        self.dtype = getattr(model, "dtype", "float64")
        self.__name__ = f"{positions} rows of {type(model).__name__}"

    def __getattr__(self, name):  # the model's parameters (W, v, H, ...) stay readable
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 3 or X.shape[-1] != self.d:
            raise ConfigError(f"X must have shape (B, N, {self.d}); got {X.shape}", param="X")
        if isinstance(self.model, MultiHeadAttention):  # every row in one pass (the same sums, read per query)
            rows = every_position_rows(self.model, X, causal=self.positions == "causal")
            return rows[..., 0] if np.ndim(self.model.v) == 2 else rows
        if getattr(self.model, "kind", "") == "positional_attention":  # its own every-position pass (its mask)
            return self.model.every_position(X)
        return np.stack([np.asarray(self.model(row_query(X, i, self.positions)), dtype=np.float64)
                         for i in range(X.shape[1])], axis=1)
