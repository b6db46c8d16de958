"""The Oracle protocol (docs/architecture.md, "Oracle"): batched black-box access with exact counting, a budget and \
validation."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from attnprobe._validation import check_float, check_int
from attnprobe.errors import (BudgetExceededError, ConfigError, InputNormError, NonFiniteAnswerError, OracleAnswerError,
                               OracleError)
from attnprobe._validation import as_batch
from attnprobe.models.precision import coarser, machine_epsilon
from attnprobe.oracles.noise import AnswerNoise, noise_of
from attnprobe.oracles.positions import (REUSABLE, RowAnswers, check_positions, declared_positions,
                                         positions_from_rows, probe_sequences)
from attnprobe.oracles.wrappers import Wrapper, declared_precision
from attnprobe.oracles.precision_detect import PrecisionDetector, smoothness_batch


def _keys(X):
    from attnprobe.oracles.querylog import sequence_keys

    return sequence_keys(X)


QueryFn = Callable[[np.ndarray], np.ndarray]


def max_row_norm(X: np.ndarray) -> float:
    """The largest Euclidean norm of a row of the batch ``X``, the same number as the largest
    ``np.linalg.norm`` of a row: squared norms by one pass of dot products, then the norms of the rows within
    their rounding of the largest."""
    squares = np.vecdot(X, X) if hasattr(np, "vecdot") else np.einsum("...i,...i->...", X, X)  # (B, N)
    top = squares.max()
    rows = X[squares >= top * (1.0 - 4.0 * X.shape[-1] * np.finfo(np.float64).eps)] if np.isfinite(top) else X
    # (a sum of d squares is within d roundings of its exact value)
    return float(max(np.linalg.norm(rows[i:i + 256], axis=-1).max() for i in range(0, len(rows), 256)))


def answer_precision(fn, declared: str | None = None, cast: str | None = None) -> str:
    """The one place the answers' precision is decided, for every way an oracle is built (``"auto"``: read it
    from the answers, :mod:`~attnprobe.oracles.precision_detect`).

    ``fn`` is the callable as asked (answer chain applied), ``declared`` what the caller says, ``cast`` the
    answer chain's cast. A declared precision is taken as given, made coarser by a cast; else a cast is the
    answers' precision (coarser where the model's own dtype is, :func:`~attnprobe.oracles.wrappers.
    declared_precision`); else ``"auto"`` detects; else (``declared=None``, the Python default) the callable's
    own dtype (a model computed in float32, a torch module) or float64. A callable whose ``answer_precision`` is
    ``"auto"`` (a remote API, which can say nothing trustworthy about its model) is read like ``declared="auto"``.
    """
    known = declared_precision(fn)
    if declared not in (None, "auto"):
        return coarser(declared, known if cast else None)
    if cast:
        return coarser(cast, known)
    if declared == "auto" or (known is None and getattr(_innermost(fn), "answer_precision", None) == "auto"):
        return "auto"
    return known or "float64"


def _innermost(fn):
    """The callable under every answer wrapper of ``fn``."""
    while isinstance(fn, Wrapper):
        fn = fn.inner
    return fn


#: a row norm within this relative rounding of ``max_input_norm`` is within it (a probe scaled to the bound has a
#: norm a few ulps above it once computed)
NORM_ROUNDING = 1e-12

class Oracle:
    """Wraps a callable ``fn(X) -> y`` with ``X`` of shape (B, N, d) and ``y`` of shape (B,), (B, K) or (B, N, K).

    A callable may answer a vector of K outputs per sequence (a classifier's logits): each sequence is still one
    query. K is taken from the first answer (``outputs``), or fixed up front by ``outputs=K``; every later answer
    must have the same K.

    Every-position answers: a callable answering ``(B, N, K)`` gives the output row at every position (the shape
    itself says so; a one-output layer answers ``(B, N, 1)``). A sequence is still one query; ``rows`` counts the
    output rows answered (``B·N`` per batch; ``B`` for last-position answers). Calling the oracle returns the last
    row of each sequence; :meth:`answer_rows` returns them all. ``positions`` says what the rows are
    (:mod:`~attnprobe.oracles.positions`): declared (``positions=``, or a ``positions`` attribute of the
    callable) or read from the answers with one probe of three sequences (phase ``"positions"``). For a causal or
    bidirectional (position-free) layer, the rows answer other last-position queries (a prefix, a moved-last
    permutation): a last-position query whose answer is in a row already seen is not asked again
    (``from_rows`` counts them: they are neither queries nor charged), and a batch holding permutations of one
    sequence asks it once.

    ``queries`` counts every sequence sent to ``fn``. A call that would pass ``budget`` raises
    :class:`BudgetExceededError` before ``fn`` is asked. Answers that are mis-shaped or non-finite raise
    :class:`OracleAnswerError`. ``precision`` names the precision the answers are computed in (it sets the
    noise floor learners use to tell signal from rounding; ``"auto"`` reads it from the answers, see
    :mod:`~attnprobe.oracles.precision_detect`); ``max_batch`` splits large batches. With a ``log``
    (:class:`~attnprobe.oracles.querylog.QueryLog`, given here and bound to this oracle's ``d``) every answer is
    stored before use and answers already in the log are not asked again: they count in ``queries`` (and their
    phase) and in ``from_log``, but not against ``budget``. Resuming a log first re-asks its recorded probes
    (phase ``"log check"``, paid) and refuses a log of another oracle; queries inside a ``fresh`` phase (the
    functional check) are always asked, never answered from the log (except in a replay, which has nothing else).

    Every query is charged to the innermost active :meth:`phase` (``queries_by_phase``; queries asked outside
    any phase go to ``"unphased"``), so a learner's per-phase counts always sum to its total. ``noise`` is what
    the callable declares about its answers (:class:`~attnprobe.oracles.noise.AnswerNoise`).

    Bounded inputs: ``max_input_norm_used`` is the largest Euclidean norm of any input row sent so far.
    ``max_input_norm`` (``None``: unbounded) is the largest row norm the target accepts; a batch with a longer
    row raises :class:`~attnprobe.errors.InputNormError` before anything is asked or charged. Learners read
    ``oracle.max_input_norm`` to plan probes within it (and
    :func:`~attnprobe.oracles.input_bound.refuse_clipping` to detect a target that clips silently).
    """

    UNPHASED = "unphased"

    def __init__(self, fn: QueryFn, d: int, *, budget: int | None = None, precision: str | None = None,
                 max_batch: int = 65536, name: str | None = None, log=None, outputs: int | None = None,
                 chain=None, eps_floor: float = 0.0, max_input_norm: float | None = None,
                 positions: str | None = None) -> None:
        if not callable(fn):
            hint = (" (a torch module: wrap it with attnprobe.oracles.torch_adapter)"
                    if type(fn).__module__.startswith("torch") else "")
            raise OracleError(f"the oracle must be callable; got {type(fn).__name__}{hint}")
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        #: the defences between ``fn`` and the answers (:class:`~attnprobe.oracles.chain.AnswerChain`)
        self.chain = chain
        self.fn = fn if chain is None else chain.apply(fn)
        self.d = check_int(d, "d", min_value=1)
        self.budget = check_int(budget, "budget", min_value=0, allow_none=True)
        decided = answer_precision(self.fn, precision, None if chain is None else chain.cast)
        self.detector = PrecisionDetector() if decided == "auto" else None
        self._precision = None if decided == "auto" else decided
        #: a rounding floor the answers carry beyond their precision and noise (an oracle derived from another)
        self.eps_floor = float(eps_floor)
        self.max_batch = int(max_batch)
        #: outputs per sequence: None until the first answer (scalar answers set 1 and keep the (B,) shape)
        self.outputs = check_int(outputs, "outputs", min_value=1, allow_none=True)
        self._vector = None if outputs is None else True
        self._scalar: str | None = None  # set by expect_scalar: the learner reading one number per sequence
        self.queries = 0
        self.queries_by_phase: dict[str, int] = {}
        self._phases: list[tuple[str, bool]] = []
        self.log = log
        self.from_log = 0
        self._fresh = 0
        self.max_input_norm = max_input_norm
        #: the largest input row norm sent to this oracle so far
        self.max_input_norm_used = 0.0
        #: True once the callable answered every position ((B, N, K)), False once it answered the last only
        self.every_position: bool | None = None
        #: output rows answered (B·N per batch of every-position answers, B otherwise); last-position answers
        #: read from rows already seen (never asked, never charged)
        self.rows = 0
        self.from_rows = 0
        self._positions = check_positions(positions) or declared_positions(self.fn)
        self._positions_source = "declared" if self._positions else None
        self._row_answers: RowAnswers | None = None
        self._probing = False  # reading the positions: its answers are kept nowhere
        if log is not None:  # bound to this oracle: a log of another width or output count is refused here
            log.attach(self.d, self.outputs, decided)

    @property
    def precision(self) -> str:
        """The answers' binary precision (:func:`answer_precision`): known, declared, or detected (``"auto"``)."""
        if self._precision is None:
            return self.detector.dtype_name if self._detected() else "float64"
        return self._precision

    @property
    def eps(self) -> float:
        """The answers' rounding floor as a machine epsilon (learners separate signal from rounding with it): the
        largest of the precision's machine epsilon (declared or detected), twice the relative rounding the
        answer chain declares (``noise.rel_eps`` is a unit roundoff) and ``eps_floor``. Reading it asks
        nothing unless the precision is ``"auto"`` and still undecided."""
        floor = self._declared_eps()
        if self.detector is not None and self._detected():
            return max(floor, self.detector.eps)
        return floor

    def _declared_eps(self) -> float:
        """The rounding floor the oracle declares (no answer read): precision, chain rounding, ``eps_floor``."""
        return max(machine_epsilon(self._precision or "float64"), 2.0 * self.noise.rel_eps, self.eps_floor)

    def _detected(self) -> bool:
        """``precision="auto"``: when precision is needed before enough answers were seen, ask a few."""
        if not self.detector.decided and not self.detector.probed:
            self.detector.probed = True
            with self.phase("precision"):
                self(self.detector.probe_batch(self.d))
        return self.detector.decided

    def read_kernel_rounding(self) -> int:
        """``precision="auto"``, answers whose bits say float64: ask the smoothness probe once
        (:func:`~attnprobe.oracles.precision_detect.smoothness_batch`, phase ``"precision"``) so that a kernel that
        rounds inside (a float32 softmax) is read as that format. An attention learner calls it before it reads
        :attr:`eps`; returns the queries it asked (0 when the precision is declared or already read)."""
        if self.detector is None:
            return 0
        before = self.queries
        if self._detected() and self.detector.needs_smoothness:
            X = smoothness_batch(self.d, self.detector.seed)
            if self.max_input_norm is not None:  # within the bound the target accepts (the jitter is relative)
                X *= min(1.0, 0.99 * self.max_input_norm / float(np.linalg.norm(X, axis=-1).max()))
            with self.phase("precision"):
                answers = self(X)
            self.detector.observe_smoothness(answers)
        return self.queries - before

    @property
    def noise(self) -> AnswerNoise:
        """The answers' declared noise, from the callable (wrappers compose theirs with what they wrap)."""
        return noise_of(self.fn)

    @contextmanager
    def phase(self, name: str, *, absorb: bool = False, fresh: bool = False) -> Iterator[None]:
        """Charge every query asked inside the ``with`` block to phase ``name`` (the innermost phase wins).

        ``absorb``: the block keeps every query, even those asked inside inner phases (a learner that runs
        another learner as one of its phases, e.g. the transformer's ``"attention"``). ``fresh``: every answer
        inside is asked from the oracle, none taken from the query log (the functional check must test the
        oracle itself); the answers are still logged.
        """
        self._phases.append((str(name), bool(absorb)))
        self._fresh += bool(fresh)
        try:
            yield
        finally:
            self._phases.pop()
            self._fresh -= bool(fresh)

    def _charge(self, n: int) -> None:
        self.queries += n
        key = self.UNPHASED
        if self._phases:
            key = next((name for name, absorb in self._phases if absorb), self._phases[-1][0])
        self.queries_by_phase[key] = self.queries_by_phase.get(key, 0) + n

    @property
    def max_input_norm(self) -> float | None:
        """The largest input row norm the target accepts (``None``: unbounded)."""
        return self._max_input_norm

    @max_input_norm.setter
    def max_input_norm(self, value: float | None) -> None:
        self._max_input_norm = check_float(value, "max_input_norm", min_value=0.0, strict_min=True, allow_none=True)

    def _check_input_norm(self, X: np.ndarray) -> None:
        """Record the largest row norm of ``X``; refuse the batch when it passes ``max_input_norm``."""
        if X.size == 0:
            return
        top = max_row_norm(X)
        limit = self._max_input_norm
        if limit is not None and top > limit * (1 + NORM_ROUNDING):
            norms = np.linalg.norm(X, axis=-1)
            b, n = np.unravel_index(int(np.argmax(norms)), norms.shape)
            raise InputNormError(f"a probe row has norm {top:.4g} (sequence {b}, row {n} of a batch of shape "
                                 f"{X.shape}) but the oracle accepts rows of norm at most {limit:.4g}; the "
                                 "batch was not sent. Use a learner that keeps its probes within the bound, or "
                                 "raise the 'max_input_norm' parameter if the target accepts longer rows",
                                 norm=top, limit=limit)
        self.max_input_norm_used = max(self.max_input_norm_used, top)

    @property
    def remaining(self) -> float:
        spent = self.queries - self.from_log
        return float("inf") if self.budget is None else self.budget - spent

    def require(self, n: int, what: str = "this step", *, paid: bool = False) -> None:
        """Refuse up front when ``n`` more queries do not fit in the budget. With a log, the answers it holds
        that this run has not used yet may cover a plan (``paid=False``); what is asked is checked exactly."""
        credit = 0 if paid or self.log is None else max(0, len(self.log) - self.from_log)
        if n > self.remaining + credit:
            spent = self.queries - self.from_log
            raise BudgetExceededError(
                f"{what} needs {n} more queries but the budget has {int(self.remaining)} left "
                f"(budget {self.budget}, used {spent}); raise the budget to at least {spent + n - credit} "
                "(a lower bound: it covers this step, and later steps may need more)")

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """The last-position answers to ``X`` ((B,) or (B, K)); rows already seen answer what they can."""
        X = as_batch(X, self.d)
        if self.every_position and X.shape[0] and self._reusing():
            y = self._through_rows(X)
        else:
            y = self._answers(X)
            self._keep_rows(X, y)
        if y.ndim == 3:
            y = y[:, -1, :]
        if self._scalar is not None and y.ndim == 2:
            self._refuse_outputs(y.shape[1])
            y = y[:, 0]
        return y

    def answer_rows(self, X: np.ndarray) -> np.ndarray:
        """The output row at every position of every sequence of ``X`` ((B, N, K)); refused in one line when the
        oracle answers the last position only."""
        X = as_batch(X, self.d)
        if self.every_position is False:
            self._refuse_rows()
        y = self._answers(X)
        if y.ndim != 3:
            self._refuse_rows()
        self._keep_rows(X, y)
        return y

    def _reusing(self) -> bool:
        """Whether rows answer other last-position queries here (never inside a ``fresh`` phase)."""
        return self._fresh == 0 and not self._probing and self.positions in REUSABLE

    def _rows_kept(self) -> RowAnswers:
        if self._row_answers is None or self._row_answers.positions != self._positions:
            self._row_answers = RowAnswers(self._positions)
        return self._row_answers

    def _keep_rows(self, X: np.ndarray, y: np.ndarray) -> None:
        if y.ndim == 3 and len(X) and self._reusing():
            self._rows_kept().store(X, y)

    def _refuse_rows(self):
        raise OracleAnswerError(f"the oracle {self.name!r} answers the last position only (shape (B, K)); an "
                                "every-position learner needs the output row at every position (shape (B, N, K)): "
                                "make the oracle return every row, or use a last-position learner")

    @property
    def positions(self) -> str:
        """What the answer rows are: ``"last"`` (the last position only), ``"causal"``, ``"bidirectional"`` (no
        position terms) or ``"positional"``; declared, or read from the answers by :meth:`read_positions`."""
        if self.every_position is False:
            return "last"
        if self._positions is None and self.every_position:
            self.read_positions()
        return self._positions or "last"

    @property
    def positions_source(self) -> str | None:
        """``"declared"`` or ``"read from the answers"`` (None for a last-position oracle)."""
        return None if self.every_position is False else self._positions_source

    def declare_positions(self, value: str | None) -> None:
        """Declare what the rows are (:data:`~attnprobe.oracles.positions.POSITIONS`); ``None``/``"auto"``: read
        them from the answers."""
        declared = check_positions(value)
        if declared is not None:
            self._positions, self._positions_source = declared, "declared"

    def read_positions(self, seed: int = 0) -> str:
        """Read the kind of rows from one probe of three sequences (:func:`~attnprobe.oracles.positions.
        positions_from_rows`), charged to phase ``"positions"``; a declared kind is kept (nothing asked)."""
        if self._positions is not None:
            return self._positions
        limit = self._max_input_norm
        scale = 1.0 if limit is None else min(1.0, limit / 2)
        self._probing = True
        try:
            with self.phase("positions"):
                Y = self.answer_rows(probe_sequences(self.d, np.random.default_rng(seed), scale))
        finally:
            self._probing = False
        tolerance = max(1e3 * self.eps, 1e-12)
        self._positions = positions_from_rows(Y, tolerance)
        self._positions_source = "read from the answers"
        return self._positions

    def _through_rows(self, X: np.ndarray) -> np.ndarray:
        """Last-position answers, each from a row already seen when there is one; the rest asked, one sequence per
        group of queries one sequence answers (bidirectional: permutations of the same tokens)."""
        cache = self._rows_kept()
        keys = cache.query_keys(X)
        found = [cache.get(k) for k in keys]
        ask, groups = [], {}
        for i, (row, g) in enumerate(zip(found, cache.group_keys(X))):
            if row is None and g not in groups:
                groups[g] = i
                ask.append(i)
        local: dict[bytes, np.ndarray] = {}
        if ask:
            Xa = X[np.array(ask)]
            Y = self._answers(Xa)
            if Y.ndim != 3:  # the callable stopped answering every position: refused by _check_shape before
                self._refuse_rows()  # pragma: no cover
            cache.store(Xa, Y)
            for rk, rows in zip(cache.row_keys(Xa), Y):
                local.update(zip(rk, rows))
        out = np.empty((len(X), self.outputs))
        for i, (k, row) in enumerate(zip(keys, found)):
            out[i] = row if row is not None else local[k]
        self.from_rows += len(X) - len(ask)
        return out

    def _answers(self, X: np.ndarray) -> np.ndarray:
        """Every answer to ``X`` as the callable gives it ((B,), (B, K) or (B, N, K)), counted and validated."""
        B = X.shape[0]
        self._check_input_norm(X)
        if self.log is None:
            self.require(B, f"a batch of {B} queries")
        if B == 0:
            if self.every_position:
                return np.zeros((0, X.shape[1], self.outputs))
            return np.zeros((0, self.outputs)) if self._vector else np.zeros(0)
        parts = [self._answer_part(X[i:i + self.max_batch]) for i in range(0, B, self.max_batch)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _answer_part(self, X: np.ndarray) -> np.ndarray:
        y = self._ask(X) if self.log is None else self._through_log(X)
        if self.detector is not None:
            self.detector.observe(y)
        self.rows += int(y.shape[0] * (y.shape[1] if y.ndim == 3 else 1))
        return y

    def _ask_paid(self, X: np.ndarray, what: str = "missing from the log") -> np.ndarray:
        """Ask the callable for ``X`` with the budget checked for all of it (queries the log cannot answer)."""
        self.require(len(X), f"a batch of {len(X)} queries {what}", paid=True)
        return self._ask(X)

    def _ask_again(self, X: np.ndarray) -> np.ndarray:
        return self._ask_paid(X, "re-asked to check that the log is this oracle's")

    def _through_log(self, X: np.ndarray) -> np.ndarray:
        """Answers through the log: recorded ones counted in ``queries`` and ``from_log`` (charged to the current
        phase, not to the budget); the missing ones asked, validated and stored before anything is returned."""
        log = self.log
        if not log.verified:  # a resumed log: is it this oracle's? (a new or replayed one needs no check)
            if len(log) and not log.readonly:
                with self.phase("log check"):
                    log.verify(self._ask_again, self.noise, self._declared_eps())
            log.verified = True
        if self._fresh and not log.readonly:
            y = self._ask_paid(X)
            log.store(_keys(X), X, y)
            log.asked += len(X)
            return y
        before = log.hits
        y = log.answer(X, self._ask_paid)
        hits = log.hits - before
        self._charge(hits)
        self.from_log += hits
        self._check_shape(y, X.shape)  # answers all from the log still fix K (a replay asks nothing)
        return y

    def expect_scalar(self, learner: str) -> None:
        """``learner`` reads one number per sequence: from now on answers of shape (B, 1) come back as (B,), and
        K > 1 outputs per sequence are refused in one line (asks nothing)."""
        self._scalar = str(learner)
        if self.outputs is not None:
            self._refuse_outputs(self.outputs)

    def _refuse_outputs(self, k: int) -> None:
        if k != 1:
            raise OracleAnswerError(f"the oracle {self.name!r} answers {k} outputs per sequence, "
                                    f"but the {self._scalar} "
                                    "learner reads one number per sequence; use a learner that reads K outputs per "
                                    "sequence (the ffn learner for a ReLU network with K outputs), or make the oracle "
                                    "return one output")

    def _ask(self, X: np.ndarray) -> np.ndarray:
        B = X.shape[0]
        try:
            raw = self.fn(X)
        except SystemExit as exc:  # an oracle must not end the process: report it like any failure
            self._charge(B)
            raise OracleError(f"the oracle {self.name!r} called exit({exc.code!r}) on a batch of shape {X.shape}; "
                              "an oracle must return answers or raise an exception") from exc
        except Exception as exc:
            # a remote oracle says how many of the sequences its server charged before failing (``charged``)
            self._charge(min(B, max(0, int(getattr(exc, "charged", B)))))
            raise OracleError(f"the oracle {self.name!r} failed on a batch of shape {X.shape}: "
                              f"{type(exc).__name__}: {exc}") from exc
        except BaseException:  # interrupted inside the call: the batch may have been paid for
            self._charge(B)
            raise
        self._charge(B)
        y = self._numbers(raw, B)
        self._check_shape(y, X.shape)
        bad = ~np.isfinite(y)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise NonFiniteAnswerError(f"the oracle {self.name!r} answered {y[i]} (non-finite) for sequence {i} of "
                                    f"a batch of shape {X.shape}; {int(bad.sum())} answers in the batch are "
                                    "not finite. Check the target for overflow or lower the probe scale.")
        return y

    def _refuse_declared_rows(self, answered: tuple) -> None:
        """A kind of rows was declared (:meth:`declare_positions`) but the oracle answers the last position only:
        the declaration would be ignored, so it is refused."""
        if self._positions_source == "declared":
            raise ConfigError(f"the 'positions' parameter {self._positions} declares answers at every position, "
                              f"but the oracle {self.name!r} answers the last position only (shape {answered}); "
                              "leave it out for this oracle", param="positions")

    def _check_shape(self, y: np.ndarray, shape: tuple) -> None:
        """Answers are (B,), (B, K) or (B, N, K) (every position); K is fixed by the first answer (or by
        ``outputs``), and every-position or not by the first answer: neither may change."""
        B, N = shape[0], shape[1]
        rows = y.ndim == 3 and y.shape[:2] == (B, N) and y.shape[2] >= 1
        if rows and self.every_position is not False and (self.outputs is None or y.shape[2] == self.outputs):
            self.every_position, self._vector, self.outputs = True, True, y.shape[2]
            return
        if self.every_position:
            raise OracleAnswerError(f"the oracle {self.name!r} answered with shape {y.shape} for a batch of shape "
                                    f"{tuple(shape)}; it answered every position before and must return shape "
                                    f"({B}, {N}, {self.outputs}) (the same K outputs at every position)")
        vector = y.ndim == 2 and y.shape[0] == B and y.shape[1] >= 1
        if rows:
            vector = False  # every-position answers after last-position ones: refused below
        if y.shape == (B,) and self._vector is not True:
            self._vector, self.outputs, self.every_position = False, 1, False
            self._refuse_declared_rows(y.shape)
            return
        if vector and self._vector is not False and (self.outputs is None or y.shape[1] == self.outputs):
            self._vector, self.outputs, self.every_position = True, y.shape[1], False
            self._refuse_declared_rows(y.shape)
            return
        want = (f"({B},)" if self._vector is False else f"({B}, {self.outputs})" if self.outputs
                else f"({B},), ({B}, K) or ({B}, {N}, K)")
        raise OracleAnswerError(f"the oracle {self.name!r} answered with shape {y.shape} for a batch of {B} "
                                f"sequences; it must return shape {want} (one number, or the same K outputs, per "
                                "sequence, or per position)")

    def _numbers(self, raw, B: int) -> np.ndarray:
        """The answers as float64, refusing what a conversion would corrupt (complex, strings, objects)."""
        try:
            if hasattr(raw, "detach") and hasattr(raw, "requires_grad"):  # a torch tensor, maybe with a graph
                raw = raw.detach().cpu()
            arr = np.asarray(raw)
            if arr.dtype.kind == "O":
                arr = arr.astype(np.float64)
        except (TypeError, ValueError, OverflowError) as exc:
            arr = None
            cause = exc
        else:
            cause = None
        if arr is None or arr.dtype.kind not in "biuf":
            what = "complex numbers" if arr is not None and arr.dtype.kind == "c" else \
                f"something that is not numbers ({type(raw).__name__}" + \
                (f" of {arr.dtype}" if arr is not None else "") + ")"
            raise OracleAnswerError(f"the oracle {self.name!r} answered with {what}; it must return a real float "
                                    f"array of shape ({B},)") from cause
        return arr.astype(np.float64, copy=False)

    def __repr__(self) -> str:
        return f"Oracle({self.name!r}, d={self.d}, queries={self.queries}, budget={self.budget})"
