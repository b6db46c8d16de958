"""The Oracle protocol (DESIGN.md): batched black-box access with exact counting, a budget and validation."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from attnprobe._validation import check_int
from attnprobe.errors import BudgetExceededError, NonFiniteAnswerError, OracleAnswerError, OracleError
from attnprobe._validation import as_batch
from attnprobe.models.precision import unit_roundoff
from attnprobe.oracles.noise import AnswerNoise, noise_of

QueryFn = Callable[[np.ndarray], np.ndarray]


class Oracle:
    """Wraps a callable ``fn(X) -> y`` with ``X`` of shape (B, N, d) and ``y`` of shape (B,) or (B, K).

    A callable may answer a vector of K outputs per sequence (a classifier's logits): each sequence is still one
    query. K is taken from the first answer (``outputs``), or fixed up front by ``outputs=K``; every later answer
    must have the same K.

    ``queries`` counts every sequence sent to ``fn``. A call that would pass ``budget`` raises
    :class:`BudgetExceededError` before ``fn`` is asked. Answers that are mis-shaped or non-finite raise
    :class:`OracleAnswerError`. ``precision`` names the precision the answers are computed in (it sets the
    noise floor learners use to tell signal from rounding); ``max_batch`` splits large batches.

    Every query is charged to the innermost active :meth:`phase` (``queries_by_phase``; queries asked outside
    any phase go to ``"unphased"``), so a learner's per-phase counts always sum to its total. ``noise`` is what
    the callable declares about its answers (:class:`~attnprobe.oracles.noise.AnswerNoise`).
    """

    UNPHASED = "unphased"

    def __init__(self, fn: QueryFn, d: int, *, budget: int | None = None, precision: str = "float64",
                 max_batch: int = 65536, name: str | None = None, outputs: int | None = None) -> None:
        if not callable(fn):
            raise OracleError(f"the oracle must be callable; got {type(fn).__name__}")
        self.fn = fn
        self.d = check_int(d, "d", min_value=1)
        self.budget = check_int(budget, "budget", min_value=0, allow_none=True)
        self.precision = precision
        self.eps = unit_roundoff(precision)
        self.max_batch = int(max_batch)
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        #: outputs per sequence: None until the first answer (scalar answers set 1 and keep the (B,) shape)
        self.outputs = check_int(outputs, "outputs", min_value=1, allow_none=True)
        self._vector = None if outputs is None else True
        self.queries = 0
        self.queries_by_phase: dict[str, int] = {}
        self._phases: list[str] = []

    @property
    def noise(self) -> AnswerNoise:
        """The answers' declared noise, from the callable (wrappers compose theirs with what they wrap)."""
        return noise_of(self.fn)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge every query asked inside the ``with`` block to phase ``name`` (the innermost phase wins)."""
        self._phases.append(str(name))
        try:
            yield
        finally:
            self._phases.pop()

    def _charge(self, n: int) -> None:
        self.queries += n
        key = self._phases[-1] if self._phases else self.UNPHASED
        self.queries_by_phase[key] = self.queries_by_phase.get(key, 0) + n

    @property
    def remaining(self) -> float:
        return float("inf") if self.budget is None else self.budget - self.queries

    def require(self, n: int, what: str = "this step") -> None:
        """Refuse up front when ``n`` more queries do not fit in the budget."""
        if n > self.remaining:
            raise BudgetExceededError(
                f"{what} needs {n} more queries but the budget has {int(self.remaining)} left "
                f"(budget {self.budget}, used {self.queries}); raise --budget to at least {self.queries + n}")

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = as_batch(X, self.d)
        B = X.shape[0]
        self.require(B, f"a batch of {B} queries")
        if B == 0:
            return np.zeros((0, self.outputs)) if self._vector else np.zeros(0)
        parts = [self._ask(X[i:i + self.max_batch]) for i in range(0, B, self.max_batch)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _ask(self, X: np.ndarray) -> np.ndarray:
        B = X.shape[0]
        try:
            raw = self.fn(X)
        except Exception as exc:
            raise OracleError(f"the oracle {self.name!r} failed on a batch of shape {X.shape}: "
                              f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._charge(B)
        try:
            y = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise OracleAnswerError(f"the oracle {self.name!r} answered with something that is not numbers "
                                    f"({type(raw).__name__}); it must return a float array of shape ({B},)") from exc
        self._check_shape(y, B)
        bad = ~np.isfinite(y)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise NonFiniteAnswerError(f"the oracle {self.name!r} answered {y[i]} (non-finite) for sequence {i} of "
                                    f"a batch of shape {X.shape}; {int(bad.sum())} answers in the batch are "
                                    "not finite. Check the target for overflow or lower the probe scale.")
        return y

    def _check_shape(self, y: np.ndarray, B: int) -> None:
        """Answers are (B,) or (B, K); K is fixed by the first answer (or by ``outputs``) and may not change."""
        vector = y.ndim == 2 and y.shape[0] == B and y.shape[1] >= 1
        if y.shape == (B,) and self._vector is not True:
            self._vector, self.outputs = False, 1
            return
        if vector and self._vector is not False and (self.outputs is None or y.shape[1] == self.outputs):
            self._vector, self.outputs = True, y.shape[1]
            return
        want = (f"({B},)" if self._vector is False else f"({B}, {self.outputs})" if self.outputs
                else f"({B},) or ({B}, K)")
        raise OracleAnswerError(f"the oracle {self.name!r} answered with shape {y.shape} for a batch of {B} "
                                f"sequences; it must return shape {want} (one number, or the same K outputs, per "
                                "sequence)")

    def __repr__(self) -> str:
        return f"Oracle({self.name!r}, d={self.d}, queries={self.queries}, budget={self.budget})"
