"""The learner registry: one entry per learner, holding everything the rest of the package needs to know of it.

An entry (:class:`Learner`) holds the callable, its declared options with their constraints (in the spirit of
scikit-learn's ``_parameter_constraints``: type, range, choices, default, help), what it recovers (a head, a
multi-head layer, a ReLU network, a transformer) and its :class:`Capabilities` (in the spirit of cvxpy's solver
capability flags: takes probes, reads yes/no answers, needs fine answers, needs cvxpy, reads vector answers).
The command line's per-learner flags (``--`` + the option name with dashes), its "this option is not for that
learner" refusals, ``audit``'s learners and the learner contract tests are all derived from this table.

The registry knows no learner: each family package (:mod:`attnprobe.learners.head`, ``ffn``, ``multihead``,
``transformer``) registers its own when it is imported. Adding a learner is one call::

    def extract_mine(oracle, *, seed=0, progress=None, width=4): ...   # returns an Extraction (Run.finish)

    register("mine", extract_mine, recovers="head",
             options=[Option("width", int, "probe width", default=4, low=1)],
             estimate=lambda s: QueryCount.exactly(s.d * s.d + 2 * s.d + 1 + s.check_queries, "d²+2d+1"),
             help="my learner (Thm 4.1 with wider probes)")

``attnprobe extract`` then runs it with its ``width`` option, which it refuses for every other learner,
``attnprobe extract`` prints its query estimate before a run, ``attnprobe audit`` runs it on every defence its
capabilities fit, and the contract tests cover it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

from attnprobe._validation import check_float, check_int, check_option
from attnprobe.errors import ConfigError

#: what a learner recovers (the ``kind`` of the model it returns)
RECOVERS = {"head": "attention_head", "multi_head": "multi_head", "relu_net": "relu_net",
            "transformer": "multihead_transformer", "positional": "positional_attention",
            "block": "transformer_block"}


@dataclass(frozen=True)
class Option:
    """One declared option of a learner: its name (the keyword argument; the CLI flag is ``--`` + the name with
    dashes), type (``int``, ``float``, ``str`` or ``bool``; a ``bool`` option is a switch that is off by
    default), default, constraints and help. ``low``/``high`` bound numbers (``open_low``: strictly above
    ``low``; ``open_high``: strictly below ``high``); ``choices`` lists the allowed values; ``input_file``: the
    value names a file the run reads (an output may not overwrite it)."""

    name: str
    type: type
    help: str
    default: Any = None
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    choices: tuple = ()
    metavar: str | None = None
    input_file: bool = False
    open_high: bool = False

    def __post_init__(self) -> None:
        if self.type not in (int, float, str, bool):
            raise TypeError(f"option {self.name!r}: type must be int, float, str or bool; got {self.type!r}")
        if self.type is bool and self.default not in (None, False):
            raise TypeError(f"option {self.name!r}: a bool option is a switch that is off by default")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def describe(self) -> str:
        """The constraint in words: ``an integer ≥ 1``, ``a finite number > 0``, ``one of 'a', 'b'``."""
        if self.choices:
            return "one of " + ", ".join(map(repr, self.choices))
        what = {int: "an integer", float: "a finite number", str: "a string", bool: "a switch"}[self.type]
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.open_low else '≥'} {self.low:g}")
        if self.high is not None:
            bounds.append(f"{'<' if self.open_high else '≤'} {self.high:g}")
        return what + (" " + " and ".join(bounds) if bounds else "")

    def validate(self, value):
        """``value`` checked against the constraints (None stays None: "not given"); errors name the option."""
        if value is None:
            return None
        if self.choices:
            return check_option(value, self.name, self.choices)
        if self.type is int:
            value = check_int(value, self.name, min_value=self.low, max_value=self.high)
            if self.open_low and value <= self.low:
                raise ConfigError(f"The {self.name!r} parameter must be {self.describe()}; got {value}",
                                  param=self.name)
            return value
        if self.type is float:
            value = check_float(value, self.name, min_value=self.low, max_value=self.high,
                                strict_min=self.open_low)
            if self.open_high and value >= self.high:
                raise ConfigError(f"The {self.name!r} parameter must be {self.describe()}; got {value:g}",
                                  param=self.name)
            return value
        if self.type is bool:
            if not isinstance(value, (bool, numbers.Integral)) or value not in (0, 1):
                raise ConfigError(f"The {self.name!r} parameter must be True or False; got {value!r}",
                                  param=self.name)
            return bool(value)
        if not isinstance(value, str):
            raise ConfigError(f"The {self.name!r} parameter must be a string; got {value!r}", param=self.name)
        return value

    def parse(self, text: str):
        """The command line's reading of ``text`` (argparse ``type``): converted, then :meth:`validate`."""
        try:
            value = self.type(text) if self.type is not str else text
            if self.type is float and not math.isfinite(value):
                raise ValueError
            return self.validate(value)
        except (ValueError, ConfigError):
            raise ValueError(f"expected {self.describe()}; got {text!r}") from None

    def same_as(self, other: "Option") -> bool:
        """Whether two learners declare this option compatibly (one CLI flag can serve both)."""
        return (self.type, self.low, self.high, self.open_low, self.open_high, self.input_file) == \
               (other.type, other.low, other.high, other.open_low, other.open_high, other.input_file)


@dataclass(frozen=True)
class Capabilities:
    """What a learner can work with (cvxpy's solver capability flags are the model).

    ``value_answers``: reads real-valued answers; ``membership_answers``: reads yes/no answers ``1[f(X) > 0]``
    (App. B); ``noisy_answers``: designed for answers with additive noise or rounding (Sec. 6);
    ``fine_answers``: needs answers rounded at float32 or finer; ``vector_answers``: reads ``(B, K)`` answers;
    ``cvxpy``: needs the cvxpy package. Whether it takes probes is whether it declares a ``probes`` option."""

    value_answers: bool = True
    membership_answers: bool = False
    noisy_answers: bool = False
    fine_answers: bool = False
    vector_answers: bool = False
    cvxpy: bool = False


@dataclass(frozen=True)
class Learner:
    """A registered learner: ``fn(oracle, *, seed, progress, **options) -> Extraction``."""

    name: str
    fn: Callable
    recovers: str
    options: tuple[Option, ...] = ()
    capabilities: Capabilities = field(default_factory=Capabilities)
    help: str = ""
    needs_one_of: tuple[str, ...] = ()
    #: ``estimate(setting) -> QueryCount``: the queries a run will ask, before it asks any
    #: (:mod:`attnprobe.learners.core.estimate`); None: the learner makes no estimate
    estimate: Callable | None = None

    @property
    def kind(self) -> str:
        """The ``kind`` of the model it returns."""
        return RECOVERS[self.recovers]

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def ready(self, options: dict) -> bool:
        """Whether ``options`` give one of the options the learner cannot run without (``needs_one_of``)."""
        return not self.needs_one_of or any(options.get(n) is not None for n in self.needs_one_of)

    @property
    def takes_probes(self) -> bool:
        return "probes" in self.option_names

    def option(self, name: str) -> Option:
        for o in self.options:
            if o.name == name:
                return o
        raise ConfigError(f"learner {self.name!r} has no option {name!r}; its options: "
                          f"{', '.join(self.option_names) or 'none'}", param=name)

    def resolve(self, given: dict | None = None) -> dict:
        """Every declared option's value: ``given`` (validated) or the default. An option this learner does not
        declare is refused (None and False count as not given)."""
        given = {k: v for k, v in (given or {}).items() if v is not None and v is not False}
        for name in given:
            if name not in self.option_names:
                raise ConfigError(f"learner {self.name!r} does not use the {name!r} option; its options: "
                                  f"{', '.join(self.option_names) or 'none'}", param=name)
        return {o.name: (o.validate(given[o.name]) if o.name in given else o.default) for o in self.options}

    def __call__(self, oracle, *, seed: int = 0, progress=None, **options):
        """Run the learner on ``oracle`` with ``options`` (validated; defaults filled in)."""
        return self.fn(oracle, seed=seed, progress=progress, **self.resolve(options))

    def fits(self, *, membership: bool = False, coarse: bool = False, vector: bool = False) -> bool:
        """Whether the learner can work on answers of this sort (yes/no, coarser than float32, vectors) with the
        packages installed here."""
        caps = self.capabilities
        if membership and not caps.membership_answers or not membership and not caps.value_answers:
            return False
        if coarse and caps.fine_answers or vector and not caps.vector_answers:
            return False
        return not caps.cvxpy or _has_cvxpy()


_LEARNERS: dict[str, Learner] = {}


def register(name: str, fn: Callable, *, recovers: str, options=(), capabilities: Capabilities | None = None,
             help: str = "", needs_one_of: tuple[str, ...] = (), estimate: Callable | None = None) -> Learner:
    """Register (or replace) learner ``name``; returns its entry. An option it shares by name with another
    learner must carry the same type and bounds (one CLI flag serves both); ``needs_one_of``: options of which
    at least one must be given for the learner to run (an audit leaves it out of ``auto`` otherwise);
    ``estimate(setting) -> QueryCount``: its query estimate, asked before a run."""
    if recovers not in RECOVERS:
        raise ConfigError(f"recovers must be one of {', '.join(RECOVERS)}; got {recovers!r}", param="recovers")
    options = tuple(options)
    for o in options:
        for other in _LEARNERS.values():
            if other.name != name and o.name in other.option_names and not o.same_as(other.option(o.name)):
                raise ConfigError(f"option {o.name!r} of learner {name!r} differs in type or bounds from the one "
                                  f"of learner {other.name!r}; give it another name", param=o.name)
    entry = Learner(name, fn, recovers, options, capabilities or Capabilities(), help, tuple(needs_one_of), estimate)
    _LEARNERS[name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove learner ``name`` (tests register throw-away learners)."""
    _LEARNERS.pop(name, None)


def learner(name: str) -> Learner:
    """The entry of learner ``name``; an unknown name is refused with the list of known ones."""
    if name not in _LEARNERS:
        raise ConfigError(f"unknown learner {name!r}; choose one of {', '.join(_LEARNERS)}", param="method")
    return _LEARNERS[name]


def learners(recovers: str | None = None) -> list[Learner]:
    """Every registered learner (in registration order), or those that recover ``recovers``."""
    return [e for e in _LEARNERS.values() if recovers is None or e.recovers == recovers]


def noise_learners(recovers: str) -> list[str]:
    """Names of the learners of ``recovers`` designed for answers with additive noise or rounding (Sec. 6) that
    can run here: what a learner refused by such answers points at."""
    return [e.name for e in learners(recovers) if e.capabilities.noisy_answers and e.fits()]


def options() -> dict[str, tuple[Option, tuple[str, ...]]]:
    """Every declared option name -> (its declaration, the learners that declare it). A shared option whose
    learners describe it differently gets one help naming each (``exact: ...; robust: ...``) and the union of
    their choices."""
    from dataclasses import replace

    found: dict[str, list[tuple[str, Option]]] = {}
    for e in _LEARNERS.values():
        for o in e.options:
            found.setdefault(o.name, []).append((e.name, o))
    out = {}
    for name, decl in found.items():
        first = decl[0][1]
        if len({o.help for _, o in decl}) > 1:
            choices = tuple(dict.fromkeys(c for _, o in decl for c in o.choices))
            first = replace(first, help="; ".join(f"{n}: {o.help}" for n, o in decl), choices=choices)
        out[name] = (first, tuple(n for n, _ in decl))
    return out


def _has_cvxpy() -> bool:
    import importlib.util

    return importlib.util.find_spec("cvxpy") is not None


#: the switch every learner of a biased model declares alike (one CLI flag serves them all)
NO_BIAS = Option("no_bias", bool, "learn the paper's bias-free model (d+d² queries)")
