"""What a learner may ask of an oracle (:class:`~attnprobe.oracles.base.Oracle` and its wrappers provide it): the
learners are typed against this protocol, never against the oracle package's classes, and read nothing else."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import numpy as np

from attnprobe.oracles.noise import AnswerNoise


@runtime_checkable
class LearnerOracle(Protocol):
    """A counted, budgeted black box ``X (B, N, d) -> y (B,) or (B, K)``.

    ``queries`` / ``queries_by_phase``: sequences answered so far (by the phase charged); ``budget`` (None:
    unlimited) and ``remaining``; ``eps``: the answers' rounding; ``precision``: its name; ``noise``: what the
    answers declare about their noise; ``outputs``: K (None until the first answer); ``max_input_norm``: the
    largest input row norm accepted (None: unbounded) and ``max_input_norm_used`` the largest sent so far;
    ``chain``: the answer chain the answers went through (None: none declared)."""

    d: int
    name: str
    queries: int
    queries_by_phase: dict[str, int]
    budget: int | None
    outputs: int | None
    max_input_norm: float | None
    max_input_norm_used: float
    #: the defences between the model and the answers (an :class:`~attnprobe.oracles.chain.AnswerChain`), or None
    chain: object | None

    @property
    def eps(self) -> float: ...

    @property
    def precision(self) -> str: ...

    @property
    def noise(self) -> AnswerNoise: ...

    @property
    def remaining(self) -> float: ...

    def __call__(self, X: np.ndarray) -> np.ndarray: ...

    def phase(self, name: str, *, absorb: bool = False, fresh: bool = False) -> AbstractContextManager: ...

    def require(self, n: int, what: str = "this step") -> None: ...

    def expect_scalar(self, learner: str) -> None: ...
