"""The learner registry: one entry per learner, holding everything the rest of the package needs to know of it.

An entry (:class:`Learner`) holds the callable, its declared options with their constraints (in the spirit of
scikit-learn's ``_parameter_constraints``: type, range, choices, default, help), what it recovers (a head, a
multi-head layer, a ReLU network, a transformer) and its :class:`Capabilities` (in the spirit of cvxpy's solver
capability flags: takes probes, reads yes/no answers, needs fine answers, needs cvxpy, reads vector answers).
The command line's per-learner flags (``--`` + the option name with dashes), its "this option is not for that
learner" refusals, ``audit``'s learners and the learner contract tests are all derived from this table.

Adding a learner is one call::

    def extract_mine(oracle, *, seed=0, progress=None, width=4): ...   # returns an Extraction (Run.finish)

    register("mine", extract_mine, recovers="head",
             options=[Option("width", int, "probe width", default=4, low=1)],
             help="my learner (Thm 4.1 with wider probes)")

``attnprobe extract`` then runs it with its ``width`` option, which it refuses for every other learner,
``attnprobe audit`` runs it on every defence its capabilities fit, and the contract tests cover it.
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
            "transformer": "multihead_transformer"}


@dataclass(frozen=True)
class Option:
    """One declared option of a learner: its name (the keyword argument; the CLI flag is ``--`` + the name with
    dashes), type (``int``, ``float``, ``str`` or ``bool``; a ``bool`` option is a switch that is off by
    default), default, constraints and help. ``low``/``high`` bound numbers (``open_low``: strictly above
    ``low``); ``choices`` lists the allowed values; ``input_file``: the value names a file the run reads (an
    output may not overwrite it)."""

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
            bounds.append(f"≤ {self.high:g}")
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
            return check_float(value, self.name, min_value=self.low, max_value=self.high,
                               strict_min=self.open_low)
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
        return (self.type, self.low, self.high, self.open_low, self.input_file) == \
               (other.type, other.low, other.high, other.open_low, other.input_file)


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
             help: str = "", needs_one_of: tuple[str, ...] = ()) -> Learner:
    """Register (or replace) learner ``name``; returns its entry. An option it shares by name with another
    learner must carry the same type and bounds (one CLI flag serves both); ``needs_one_of``: options of which
    at least one must be given for the learner to run (an audit leaves it out of ``auto`` otherwise)."""
    if recovers not in RECOVERS:
        raise ConfigError(f"recovers must be one of {', '.join(RECOVERS)}; got {recovers!r}", param="recovers")
    options = tuple(options)
    for o in options:
        for other in _LEARNERS.values():
            if other.name != name and o.name in other.option_names and not o.same_as(other.option(o.name)):
                raise ConfigError(f"option {o.name!r} of learner {name!r} differs in type or bounds from the one "
                                  f"of learner {other.name!r}; give it another name", param=o.name)
    entry = Learner(name, fn, recovers, options, capabilities or Capabilities(), help, tuple(needs_one_of))
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


# ------------------------------------------------------------------------------------------- the learners
# Each adapter maps the declared options onto the learner's keyword arguments; the learners import lazily.

_NO_BIAS = Option("no_bias", bool, "learn the paper's bias-free model (d+d² queries)")
_RANK = Option("rank", int, "rank bound r of W (head dimension); lowrank detects it when omitted", low=1)
_SIGN_TIME = Option("sign_time_limit", float, "seconds the 0/1 program may spend on neuron orientations "
                    "(m > d; default 5)", default=5.0, low=0, open_low=True, metavar="SEC")
_W_BOUND = Option("w_bound", float, "known W ≥ 2 with ‖W‖_F ≤ W (probes paper)")
_MARGIN = Option("margin", float, "known μ ≤ min nonzero |v_i| (probes paper)")


def _basis(probes: str) -> str:
    """``paper`` is the paper's probe design, the basis probes of Thm 4.1."""
    return "basis" if probes == "paper" else probes


def _exact(oracle, *, seed, progress, probes, no_bias):
    from attnprobe.learners.exact import extract_exact

    return extract_exact(oracle, probes=_basis(probes), bias=not no_bias, seed=seed, progress=progress)


def _lowrank(oracle, *, seed, progress, rank, oversample, no_bias):
    from attnprobe.learners.lowrank import extract_lowrank

    return extract_lowrank(oracle, rank=rank, oversample=oversample, bias=not no_bias, seed=seed,
                           progress=progress)


def _nuclear(oracle, *, seed, progress, rank, measurements, solver, solver_time_limit, no_bias):
    from attnprobe.learners.nuclear import extract_nuclear

    return extract_nuclear(oracle, rank=rank, measurements=measurements, solver=solver,
                           solver_time_limit=solver_time_limit, bias=not no_bias, seed=seed, progress=progress)


def _robust(oracle, *, seed, progress, probes, no_bias, tolerance, queries, max_scale, no_retries, w_bound,
            margin):
    from attnprobe.learners.robust import MAX_RETRIES, extract_robust, extract_robust_paper

    if probes == "paper":
        tol = tolerance if tolerance is not None else oracle.noise.tolerance
        return extract_robust_paper(oracle, w_bound=w_bound, margin=margin, tolerance=tol, seed=seed,
                                    progress=progress)
    return extract_robust(oracle, bias=not no_bias, tolerance=tolerance, queries=queries, seed=seed,
                          max_scale=max_scale, retries=0 if no_retries else MAX_RETRIES, progress=progress)


def _membership(oracle, *, seed, progress, probes, w_bound, margin, eps_w, delta, samples):
    from attnprobe.learners.membership import extract_membership, extract_membership_paper

    if probes == "paper":
        return extract_membership_paper(oracle, w_bound=w_bound, margin=margin, eps_w=eps_w, delta=delta,
                                        samples=samples, seed=seed, progress=progress)
    return extract_membership(oracle, seed=seed, progress=progress)


def _transformer(oracle, *, seed, progress, probes, sign_time_limit, transformer_route):
    """``regions`` (default): multi-head attention, a biased K-output FFN and the residual, detected; ``paper``:
    Sec. 4.1's route through TF(X) − TF(−X) (one head, bias-free FFN, one output; implied by ``probes``)."""
    route = transformer_route or ("paper" if probes else "regions")
    if route == "paper":
        from attnprobe.learners.transformer import extract_transformer

        return extract_transformer(oracle, probes=_basis(probes or "orthogonal"), seed=seed, progress=progress,
                                   sign_time_limit=sign_time_limit)
    if probes:
        raise ConfigError(f"the 'probes' parameter chooses the probes of the paper's transformer route; drop it "
                          f"({probes}) or use the 'transformer_route' parameter paper")
    from attnprobe.learners.transformer_multihead import extract_transformer_multihead

    return extract_transformer_multihead(oracle, seed=seed, progress=progress, sign_time_limit=sign_time_limit)


def _ffn(oracle, *, seed, progress, no_bias, sign_time_limit, hidden, activation):
    """ReLU (critical points) or smooth (GELU, tanh-GELU, SiLU: derivatives), as given or read from the answers."""
    from attnprobe.learners.smooth_ffn.dispatch import extract_ffn_any

    return extract_ffn_any(oracle, seed=seed, progress=progress, activation=activation, hidden=hidden,
                           bias=not no_bias, sign_time_limit=sign_time_limit)


def load_subspaces(path, d: int) -> list:
    """Head subspace bases (Prop. C.2) from an ``.npz`` file: an array ``subspaces`` (or ``E``) of shape
    ``(H, d, d_h)``, or one ``(d, d_h)`` array per head (in file order). Read through the safe loader (a regular
    file, real numbers, headers checked before anything is decompressed) and refused above ``8·d²`` numbers
    (``Σ d_h ≤ d``) or when the file is a saved model."""
    from attnprobe.models.io import load_arrays

    arrays = load_arrays(path, max_bytes=8 * 8 * d * d + 4096, what="subspaces file")
    if "kind" in arrays:
        raise ConfigError(f"{path} is a saved {arrays['kind']} model, not head subspaces; give an .npz with an "
                          "(H, d, d_h) array named 'subspaces'", param="subspaces")
    for key in ("subspaces", "E"):
        if key in arrays:
            if arrays[key].ndim != 3:
                raise ConfigError(f"the {key!r} array of {path} has shape {arrays[key].shape}; it must be (H, d, d_h)",
                                  param="subspaces")
            return list(arrays[key])
    if not arrays:
        raise ConfigError(f"{path} holds no arrays; save an (H, d, d_h) array named 'subspaces'", param="subspaces")
    return list(arrays.values())


def _multihead(oracle, *, seed, progress, no_bias, heads, max_heads, subspaces, multihead_learner, rank):
    from attnprobe.learners.multihead import extract_multihead

    if subspaces is not None and multihead_learner != "auto":
        raise ConfigError(f"known subspaces are learned by the subspaces learner (Prop. C.2), "
                          f"not {multihead_learner!r}; "
                          "drop the 'multihead_learner' option", param="multihead_learner")
    bases = load_subspaces(subspaces, oracle.d) if subspaces is not None else None
    method = "subspaces" if bases is not None else multihead_learner
    return extract_multihead(oracle, heads=heads, max_heads=max_heads, subspaces=bases, bias=not no_bias,
                             method=method, rank=rank, seed=seed, progress=progress)


_HEAD_PROBES = ("orthogonal", "basis", "gaussian", "paper")

register("exact", _exact, recovers="head", help="Thm 4.1: exact recovery from d²+2d+1 value queries",
         options=[Option("probes", str, "probe design: orthogonal (default), basis (= paper), gaussian",
                         default="orthogonal", choices=_HEAD_PROBES), _NO_BIAS])
register("lowrank", _lowrank, recovers="head", help="low-rank heads from 2dr − r² bilinear measurements",
         options=[_RANK, Option("oversample", int, "extra sketch directions/probes for noisy answers (default 0 "
                                "for float64, 4 for coarser answers)", low=0), _NO_BIAS])
register("nuclear", _nuclear, recovers="head", capabilities=Capabilities(cvxpy=True),
         needs_one_of=("rank", "measurements"),
         help="Thm 5.1: low-rank heads by nuclear-norm minimisation",
         options=[_RANK, Option("measurements", int, "number m of rank-one measurements (default from the measured "
                                "phase transition)", low=1),
                  Option("solver", str, "cvxpy solver (default auto = SCS, then CLARABEL)", default="auto"),
                  Option("solver_time_limit", float, "refuse up front when the solver is estimated to take longer "
                         "(default 300)", default=300.0, low=0, open_low=True, metavar="SEC"), _NO_BIAS])
register("robust", _robust, recovers="head", capabilities=Capabilities(noisy_answers=True),
         help="Sec. 6: heads from answers with additive noise or rounding",
         options=[Option("probes", str, "orthogonal (default) or paper (Thm 6.1)", default="orthogonal",
                         choices=("orthogonal", "paper")), _NO_BIAS,
                  Option("tolerance", float, "the answers' additive error bound τ (default: the declared noise)"),
                  Option("queries", int, "queries to plan for (extra ones shrink the error)", low=1),
                  Option("max_scale", float, "largest probe norm the API accepts", low=0, open_low=True),
                  Option("no_retries", bool, "never re-measure a probe (spend exactly the planned queries; unresolved "
                         "weights clipped)"), _W_BOUND, _MARGIN])
register("membership", _membership, recovers="head",
         capabilities=Capabilities(value_answers=False, membership_answers=True),
         help="App. B: heads from yes/no answers 1[f(X) > 0]",
         options=[Option("probes", str, "bisection (default) or paper (App. B)", default="bisection",
                         choices=("bisection", "paper")), _W_BOUND, _MARGIN,
                  Option("eps_w", float, "probes paper: target ε_W (default 0.1)", default=0.1, low=0,
                         open_low=True),
                  Option("delta", float, "probes paper: failure probability (default 0.05)", default=0.05, low=0,
                         open_low=True),
                  Option("samples", int, "probes paper: sign samples (overrides Thm B.1's k)", low=1)])
register("transformer", _transformer, recovers="transformer",
         capabilities=Capabilities(fine_answers=True, vector_answers=True),
         help="a one-layer transformer: multi-head attention, a biased ReLU FFN, K outputs, the residual (heads up "
              "to order, the FFN up to neuron permutation and scale; Sec. 4.1's route with transformer_route paper)",
         options=[Option("transformer_route", str, "regions (default: heads, FFN biases, K outputs and residual "
                         "detected) or paper (Sec. 4.1: one head, bias-free FFN, one output, via TF(X) - TF(-X); "
                         "implied by probes)", choices=("regions", "paper")),
                  Option("probes", str, "paper route: probe design of W, as for exact (default orthogonal)",
                         choices=_HEAD_PROBES), _SIGN_TIME])
register("ffn", _ffn, recovers="relu_net", capabilities=Capabilities(fine_answers=True, vector_answers=True),
         help="Sec. 4.1: a ReLU network from length-1 queries (critical points); smooth FFNs (GELU, tanh-GELU, "
              "SiLU) from derivatives of the answers, the activation detected or given",
         options=[_NO_BIAS, _SIGN_TIME,
                  Option("hidden", int, "hidden width if known (ReLU: neurons no answer shows are then reported as "
                         "unidentifiable; smooth: skips the width search)", low=1, metavar="M"),
                  Option("activation", str, "the FFN's activation (default: read from the answers)",
                         choices=("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"))])
register("multihead", _multihead, recovers="multi_head", capabilities=Capabilities(vector_answers=True),
         help="Sec. 7, App. C: every head of a multi-head layer, up to permutation",
         options=[_NO_BIAS, Option("heads", int, "number of heads (detected when omitted)", low=1, metavar="H"),
                  Option("max_heads", int, "upper bound on the number of heads", low=1, metavar="H0"),
                  Option("subspaces", str, "known mutually orthogonal head subspaces: an (H, d, d_h) array "
                         "'subspaces' (Prop. C.2)", metavar="FILE.npz", input_file=True),
                  Option("multihead_learner", str, "orthogonal: heads in unknown orthogonal subspaces (App. C "
                         "Hessians); generic: overlapping heads; auto (default): generic, then orthogonal when generic "
                         "fails; vector: whole output rows (picked by auto when the answers are K-vectors)",
                         default="auto",
                         choices=("auto", "orthogonal", "generic", "vector")),
                  _RANK])
