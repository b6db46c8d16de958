"""Queries a run will need, before it asks any: the budget to buy for an extraction.

The estimate is the learner's own: its registry entry holds an ``estimate(setting) -> QueryCount`` that follows the
learner's plan plus what the plan leaves adaptive (calibration, re-measured probes, the functional check).
``low`` and ``high`` bound the count when the answers behave; ``queries`` is the expected value. This module knows
no learner: it asks the entry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from attnprobe.errors import ConfigError
from attnprobe.learners.core import registry
from attnprobe.learners.core.check import check_queries
from attnprobe.models.rows import check_positions


@dataclass(frozen=True)
class Setting:
    """What an estimate is asked for: the width ``d``, the K numbers each answer holds (``outputs``, None:
    undeclared), the answers' ``precision``, whether the functional check runs, the learner's options (its
    declared names: ``rank``, ``heads``, ``hidden``, ...; None when not given) and ``positions``: what the answers'
    rows are when the oracle answers every position (``causal``, ``bidirectional``, ``positional``: declared,
    docs/every-position.md), None for the last position; ``layout``: a whole block's (``pre``, ``post``,
    ``parallel``) where the target declares it (a model folder's family), None when not known."""

    d: int
    outputs: int | None = None
    precision: str = "float64"
    bias: bool = True
    check: bool = True
    options: dict = field(default_factory=dict)
    positions: str | None = None
    layout: str | None = None

    @property
    def coarse(self) -> bool:
        """Answers coarser than float64 (float32 and below)."""
        return self.precision not in ("float64", "auto")

    @property
    def check_queries(self) -> int:
        return check_queries() if self.check else 0

    def option(self, name: str):
        return self.options.get(name)

    def needs(self, name: str, what: str):
        """The option ``name``, or a :class:`ConfigError` naming it: ``what`` says why the estimate needs it."""
        value = self.options.get(name)
        if value is None:
            raise ConfigError(what, param=name)
        return value

    def refuse_coarse(self, learner: str) -> None:
        """Answers coarser than float32 are refused by ``learner`` before it asks: no estimate for them either."""
        if self.precision not in ("float64", "float32", "auto"):
            raise ConfigError(f"{learner} needs answers in float32 or finer; {self.precision} answers would be "
                              "refused, so there is nothing to estimate", param="precision")


def duration(seconds: float) -> str:
    """``seconds`` in words: s, min or h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class QueryCount:
    """A learner's estimate: expected ``queries``, the range ``low`` … ``high`` they fall in, and ``basis``
    (how the count is made up, in words); where the learner models them, the expected ``seconds`` of its own
    computing and its ``peak_bytes`` of memory (None: not modelled)."""

    queries: int
    low: int
    high: int
    basis: str
    seconds: float | None = None
    peak_bytes: int | None = None

    @classmethod
    def exactly(cls, queries: int, basis: str) -> "QueryCount":
        """A count known in advance (a non-adaptive learner)."""
        return cls(int(queries), int(queries), int(queries), basis)


@dataclass(frozen=True)
class Estimate:
    """Expected queries and the range they fall in; ``cost`` at ``price_per_1k`` (None when no price); the
    learner's expected ``seconds`` and ``peak_bytes`` where it models them (None: not modelled)."""

    method: str
    d: int
    queries: int
    low: int
    high: int
    basis: str
    price_per_1k: float | None = None
    seconds: float | None = None
    peak_bytes: int | None = None

    @property
    def cost(self) -> float | None:
        return None if self.price_per_1k is None else self.queries * self.price_per_1k / 1000

    def to_dict(self) -> dict:
        return {**asdict(self), "cost": self.cost}


def estimate_queries(method: str, d: int, *, outputs: int | None = None, precision: str = "float64",
                     bias: bool = True, check: bool = True, price_per_1k: float | None = None,
                     positions: str | None = None, layout: str | None = None, **options) -> Estimate:
    """The queries learner ``method`` will ask at width ``d``, from its registry entry's estimate; asks nothing.

    ``options`` are the learner's declared options (``rank``: lowrank and scalar multihead; ``heads``: multihead;
    ``hidden``: ffn; validated as for a run, None meaning not given); ``outputs``: the K numbers each answer holds,
    declared (None: undeclared, i.e. one number); ``positions``: the oracle answers every position and its rows
    are ``causal``, ``bidirectional`` or ``positional`` (declared; None or ``"last"``: the last position);
    ``layout``: a whole block's layout where declared (``pre``, ``post``, ``parallel``; None: not known). Raises
    :class:`ConfigError` naming the missing parameter, or ``method`` when the learner makes no estimate."""
    entry = registry.learner(method)
    if entry.estimate is None:
        known = [e.name for e in registry.learners() if e.estimate is not None]
        raise ConfigError(f"no query estimate for method {method!r}; estimates exist for {', '.join(known)}",
                          param="method")
    resolved = entry.resolve({k: v for k, v in options.items() if v is not None})
    rows = None if positions == "last" else check_positions(positions)
    if layout not in (None, "pre", "post", "parallel"):
        raise ConfigError(f"a block's layout is pre, post or parallel; got {layout!r}", param="layout")
    setting = Setting(int(d), outputs, precision, bool(bias) and not resolved.get("no_bias"), bool(check), resolved,
                      rows, layout)
    count = entry.estimate(setting)
    return Estimate(method, int(d), int(count.queries), int(count.low), int(count.high), count.basis, price_per_1k,
                    count.seconds, count.peak_bytes)
