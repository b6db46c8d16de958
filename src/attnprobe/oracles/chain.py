"""The answer chain: which defences sit between a model and its answers, as one value.

An :class:`AnswerChain` is built in Python (``AnswerChain(cast="float16", decimals=4)``), from one spec string
(``AnswerChain.parse("float16+round:4")``) or from the CLI flags that share its names (``--cast float16
--round 4``; see :mod:`attnprobe.cli.answer_chain`). It builds the wrapped callable (:meth:`AnswerChain.apply`),
states its noise (:attr:`AnswerChain.answer_noise`, composed by the wrappers as in
:mod:`attnprobe.oracles.noise`) and names itself (:attr:`AnswerChain.spec`, stable: the query log and the audit
reports use it). An :class:`~attnprobe.oracles.base.Oracle` is built with its chain (``Oracle(fn, d, chain=...)``).

The spec grammar: stages joined by ``+``, in any order, each at most once, ``none`` for no defence::

    float32 | float16 | bfloat16 | cast:DTYPE      inputs and answers cast (Sec. 4 in deployed precision)
    clip:R                                          input rows of norm > R scaled down to norm R
    avq:τ | adversarial:τ | gaussian:σ | uniform:σ  answer noise (Sec. 6); also noise:KIND:LEVEL
    noise-seed:S                                    seed of the noise
    round:K | round-digits:K                        answers rounded to K decimals / K significant digits
    membership                                      answers 1[f(X) > 0] (App. B)

``digits:K`` is read as ``round-digits:K`` and ``noise:σ`` as ``gaussian:σ`` (fresh Gaussian noise); the chain's
:attr:`~AnswerChain.spec` names them by their canonical spellings.

The stages apply innermost first: input clip, cast, noise, rounding, membership.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from attnprobe.errors import ConfigError
from attnprobe.oracles.noise import AnswerNoise, noise_of
from attnprobe.oracles.wrappers import (MAX_DECIMALS, MAX_DIGITS, NOISE_KINDS, AdversarialNoise, BoundedNoise,
                                        ClipInputs, FreshNoise, Membership, Precision, Rounded)

#: the precisions a chain may cast to (float64 answers are the uncast ones)
CASTS = ("float32", "float16", "bfloat16")
#: one line naming every stage, for help texts and error messages
SPEC_HELP = ("none, float32 / float16 / bfloat16 (cast), clip:R, avq:τ / adversarial:τ / gaussian:σ / uniform:σ "
             "(noise), noise-seed:S, round:K (K decimals), round-digits:K (K significant digits), membership "
             "(answers 1[f > 0]); join stages with +")


def format_level(x: float) -> str:
    """A noise level or bound as the shortest text that reads back as the same float (``1e-06``, ``0.001``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


def parse_noise(spec: str) -> tuple[str, float]:
    """``KIND:LEVEL`` (e.g. ``avq:1e-3``) -> (kind, level), the value of ``--noise`` and of a noise stage."""
    kind, _, level = str(spec).partition(":")
    if kind not in NOISE_KINDS or not level:
        raise ConfigError(f"noise must look like KIND:LEVEL with KIND one of {', '.join(NOISE_KINDS)} "
                          f"(e.g. avq:1e-3); got {spec!r}", param="noise")
    return kind, _number(level, f"the noise level in {spec!r}", param="noise")


def _number(text: str, what: str, *, integer: bool = False, param: str | None = None):
    try:
        if isinstance(text, bool) or (integer and not isinstance(text, str) and not float(text).is_integer()):
            raise ValueError(text)
        x = int(text) if integer else float(text)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{what} must be a {'whole ' if integer else ''}number; got {text!r}",
                          param=param) from None
    if not (math.isfinite(x) and (integer or x >= 0)):
        raise ConfigError(f"{what} must be a finite number >= 0; got {text!r}", param=param)
    return x


@dataclass(frozen=True)
class AnswerChain:
    """The defences between a model and its answers (module docstring). Every field is validated once.

    ``cast``: float32/float16/bfloat16 (inputs and answers); ``clip``: the input-row bound R; ``noise``:
    ``"KIND:LEVEL"`` or ``(kind, level)``; ``seed``: the noise's seed (None: 0, or the caller's); ``decimals``
    / ``digits``: rounding to K decimals or K significant digits (at most one); ``membership``: 0/1 answers.
    """

    cast: str | None = None
    clip: float | None = None
    noise: str | tuple | None = None
    seed: int | None = None
    decimals: int | None = None
    digits: int | None = None
    membership: bool = False

    def __post_init__(self) -> None:
        if self.cast is not None and self.cast not in CASTS:
            raise ConfigError(f"a cast is one of {', '.join(CASTS)}; got {self.cast!r}", param="cast")
        if self.clip is not None:
            clip = _number(self.clip, "the input-row bound R", param="clip")
            if clip <= 0:
                raise ConfigError(f"the input-row bound R must be > 0; got {self.clip!r}", param="clip")
            object.__setattr__(self, "clip", float(clip))
        if self.noise is not None:
            kind, level = parse_noise(self.noise) if isinstance(self.noise, str) else self.noise
            if kind not in NOISE_KINDS:
                raise ConfigError(f"unknown noise kind {kind!r}; choose one of {', '.join(NOISE_KINDS)}",
                                  param="noise")
            object.__setattr__(self, "noise", f"{kind}:{format_level(_number(level, 'the noise level'))}")
        if self.seed is not None:
            seed = _number(self.seed, "the noise seed", integer=True, param="noise_seed")
            if seed < 0:
                raise ConfigError(f"the noise seed must be >= 0; got {self.seed!r}", param="noise_seed")
            object.__setattr__(self, "seed", int(seed))
        if self.decimals is not None and self.digits is not None:
            raise ConfigError("round to decimals or to significant digits, not both", param="digits")
        if self.decimals is not None:
            k = _number(self.decimals, "the decimals of rounding", integer=True, param="decimals")
            if not -MAX_DECIMALS <= k <= MAX_DECIMALS:
                raise ConfigError(f"rounding to K decimals needs -{MAX_DECIMALS} <= K <= {MAX_DECIMALS}; got {k}",
                                  param="decimals")
            object.__setattr__(self, "decimals", int(k))
        if self.digits is not None:
            k = _number(self.digits, "the significant digits of rounding", integer=True, param="digits")
            if not 1 <= k <= MAX_DIGITS:
                raise ConfigError(f"rounding to K significant digits needs 1 <= K <= {MAX_DIGITS} (float64 answers "
                                  f"carry at most {MAX_DIGITS}); got {k}", param="digits")
            object.__setattr__(self, "digits", int(k))
        if not isinstance(self.membership, bool):
            raise ConfigError(f"membership is True or False; got {self.membership!r}", param="membership")

    # --- building ---------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, spec: str) -> "AnswerChain":
        """One chain from its spec string (module docstring): ``"float16+round:4"``, ``"avq:1e-3"``, ``"none"``."""
        text = str(spec).strip()
        if not text:
            raise ConfigError(f"an empty defence; choose from: {SPEC_HELP}", param="defense")
        fields: dict = {}
        for term in (t.strip() for t in text.split("+")):
            if term == "none" and text == "none":
                continue
            if term == "none":
                raise ConfigError(f"'none' is the defence with no stage and stands alone; drop it from {text!r}",
                                  param="defense")
            key, value = _stage(term, text)
            if key in fields or (key in ("decimals", "digits") and {"decimals", "digits"} & fields.keys()):
                raise ConfigError(f"the defence {text!r} sets {_STAGE_NAMES[key]} twice; give each stage once",
                                  param="defense")
            fields[key] = value
        return cls(**fields)

    def combine(self, other: "AnswerChain") -> "AnswerChain":
        """Both chains' stages in one (e.g. flags and a spec); a stage the two set differently is refused."""
        mine, theirs = self._stages(), other._stages()
        both = {k for k in mine.keys() & theirs.keys() if mine[k] != theirs[k]}
        if {"decimals", "digits"} <= (mine.keys() | theirs.keys()):
            both |= {"digits"}
        if both:
            raise ConfigError(f"{' and '.join(sorted({_STAGE_NAMES[k] for k in both}))} given twice (in "
                              f"{self.spec!r} and in {other.spec!r}); give each stage once", param="defense")
        return AnswerChain(**{**mine, **theirs})

    def seeded(self, seed: int) -> "AnswerChain":
        """This chain with its noise seeded by ``seed`` unless the chain names its own seed."""
        return self if self.seed is not None else replace(self, seed=seed)

    def _stages(self) -> dict:
        return {k: getattr(self, k) for k in _STAGE_NAMES if getattr(self, k) not in (None, False)}

    # --- what it is -------------------------------------------------------------------------------------
    @property
    def empty(self) -> bool:
        """No defence: the answers are the model's own."""
        return not self._stages().keys() - {"seed"}

    @property
    def spec(self) -> str:
        """The canonical spec (module docstring), stable for equal chains: ``none`` when empty. It is also the
        chain's identity in query logs and its name in audit reports."""
        if self.empty:
            return "none"
        parts = []
        if self.clip is not None:
            parts.append(f"clip:{format_level(self.clip)}")
        if self.cast:
            parts.append(self.cast)
        if self.noise:
            parts.append(self.noise)
            if self.seed:
                parts.append(f"noise-seed:{self.seed}")
        if self.decimals is not None:
            parts.append(f"round:{self.decimals}")
        if self.digits is not None:
            parts.append(f"round-digits:{self.digits}")
        if self.membership:
            parts.append("membership")
        return "+".join(parts)

    name = spec

    @property
    def slug(self) -> str:
        """The spec as a file-name part: ``round:4`` -> ``round4``, ``float16+avq:0.001`` -> ``float16_avq0.001``."""
        return self.spec.replace(":", "").replace("+", "_")

    @property
    def answer_noise(self) -> AnswerNoise:
        """What the chain does to exact answers (:class:`AnswerNoise`), composed by its wrappers."""
        return noise_of(self.apply(_never_called))

    def identity_options(self) -> dict:
        """The options that change the answers, for :func:`attnprobe.oracles.querylog.identity_of` (None and
        False entries are dropped there)."""
        return {"cast": self.cast, "clip": self.clip, "noise": self.noise,
                "noise_seed": (self.seed or 0) if self.noise else None, "round": self.decimals,
                "round_digits": self.digits, "membership": self.membership}

    def __str__(self) -> str:
        return self.spec

    # --- using it ---------------------------------------------------------------------------------------
    def apply(self, fn):
        """``fn`` wrapped in the chain, innermost first: input clip, cast, noise, rounding, membership. The
        empty chain returns ``fn`` itself."""
        out = fn
        if self.cast:
            out = Precision(out, self.cast)
        if self.noise:
            kind, level = parse_noise(self.noise)
            seed = self.seed or 0
            if kind == "avq":
                out = BoundedNoise(out, level, seed=seed)
            elif kind == "adversarial":
                out = AdversarialNoise(out, level)
            else:
                out = FreshNoise(out, level, kind=kind, seed=seed)
        if self.decimals is not None or self.digits is not None:
            out = Rounded(out, decimals=self.decimals, digits=self.digits)
        if self.membership:
            out = Membership(out)
        if self.clip is not None:  # outermost: it transforms the inputs before any other stage sees them
            out = ClipInputs(out, self.clip)
        return out

    def oracle(self, fn, d: int, **kwargs):
        """An :class:`~attnprobe.oracles.base.Oracle` answering ``fn`` through this chain."""
        from attnprobe.oracles.base import Oracle

        return Oracle(fn, d, chain=self, **kwargs)


NO_DEFENSE = AnswerChain()

#: field -> what it is called in messages
_STAGE_NAMES = {"clip": "the input clip", "cast": "the cast", "noise": "the noise", "seed": "the noise seed",
                "decimals": "the rounding", "digits": "the rounding", "membership": "membership"}


def _stage(term: str, spec: str) -> tuple[str, object]:
    """One ``+``-separated term of a spec -> (field, value)."""
    kind, _, value = term.partition(":")
    if term in CASTS:
        return "cast", term
    if term == "membership":
        return "membership", True
    if kind == "cast" and value:
        if value not in CASTS:
            raise ConfigError(f"the defence {spec!r} casts to {value!r}; choose one of {', '.join(CASTS)}",
                              param="defense")
        return "cast", value
    if kind == "clip" and value:
        return "clip", _number(value, f"the input-row bound R in {spec!r}", param="defense")
    if kind == "round" and value:
        return "decimals", _number(value, f"K in {term!r}", integer=True, param="defense")
    if kind in ("round-digits", "digits") and value:
        return "digits", _number(value, f"K in {term!r}", integer=True, param="defense")
    if kind == "noise-seed" and value:
        return "seed", _number(value, f"the seed in {term!r}", integer=True, param="defense")
    if kind in NOISE_KINDS and value:
        return "noise", parse_noise(term)
    if kind == "noise" and value:  # noise:KIND:LEVEL, or noise:σ: fresh Gaussian noise (gaussian:σ)
        if value.partition(":")[0] in NOISE_KINDS:
            return "noise", parse_noise(value)
        return "noise", parse_noise(f"gaussian:{value}")
    raise ConfigError(f"unknown defence {term!r} in {spec!r}; choose from: {SPEC_HELP}", param="defense")


def _never_called(X):  # pragma: no cover - a placeholder whose wrappers are only asked for their noise
    raise AssertionError("the placeholder of AnswerChain.answer_noise was called")
