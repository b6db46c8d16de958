"""Output restrictions a defender may deploy, as names for ``--defense``, mapped onto the answer wrappers
(:func:`attnprobe.oracles.wrappers.wrap`): precision casts, rounding, noise and yes/no answers (App. B)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnprobe.errors import ConfigError
from attnprobe.oracles.wrappers import NOISE_KINDS, wrap_oracle

CASTS = ("float32", "float16", "bfloat16")
HELP = ("none, float32, float16, bfloat16, round:K (K decimals), digits:K (K significant digits), noise:σ "
        "(fresh Gaussian noise), avq:τ / adversarial:τ / gaussian:σ / uniform:σ, membership (answers 1[f > 0])")


@dataclass(frozen=True)
class Defense:
    """One named restriction of the answers; ``wrap`` holds the keyword arguments of ``wrap_oracle``."""

    name: str
    wrap: tuple = ()

    @property
    def membership(self) -> bool:
        return dict(self.wrap).get("membership", False)

    @property
    def answers(self) -> dict:
        """What the answers are like, as :meth:`attnprobe.learners.registry.Learner.fits` asks: yes/no
        (``membership``) and coarser than float32 (``coarse``: a float16/bfloat16 cast, rounding to decimals or
        to fewer than 7 significant digits, noise)."""
        w = dict(self.wrap)
        coarse = (w.get("cast") in ("float16", "bfloat16") or "decimals" in w or w.get("digits", 99) < 7
                  or "noise" in w)
        return {"membership": self.membership, "coarse": bool(coarse)}

    @property
    def slug(self) -> str:
        """The name as a file-name part: ``round:4`` -> ``round4``, ``noise:1e-06`` -> ``noise1e-06``."""
        return self.name.replace(":", "")

    def apply(self, oracle, seed: int = 0):
        """Wrap ``oracle`` in place with this restriction (noise seeded by ``seed``); returns the oracle."""
        if self.wrap:
            wrap_oracle(oracle, seed=seed, **dict(self.wrap))
        return oracle


def _level(spec: str, value: str, integer: bool = False):
    try:
        x = int(value) if integer else float(value)
    except ValueError as exc:
        raise ConfigError(f"the defence {spec!r} needs a {'whole ' if integer else ''}number after ':'") from exc
    if not (math.isfinite(x) and x >= 0):
        raise ConfigError(f"the defence {spec!r} needs a finite level >= 0")
    return x


def parse_defense(spec: str) -> Defense:
    """``float16`` / ``round:4`` / ``noise:1e-6`` / ``membership`` ... -> :class:`Defense`."""
    spec = spec.strip()
    kind, _, value = spec.partition(":")
    if spec == "none":
        return Defense("none")
    if spec in CASTS:
        return Defense(spec, (("cast", spec),))
    if spec == "membership":
        return Defense(spec, (("membership", True),))
    if kind == "round" and value:
        return Defense(f"round:{_level(spec, value, True)}", (("decimals", _level(spec, value, True)),))
    if kind == "digits" and value:
        k = _level(spec, value, True)
        if k < 1:
            raise ConfigError(f"the defence {spec!r} needs at least 1 significant digit")
        return Defense(f"digits:{k}", (("digits", k),))
    if kind in ("noise", *NOISE_KINDS) and value:
        level = _level(spec, value)
        noise_kind = "gaussian" if kind == "noise" else kind
        return Defense(f"{kind}:{level:g}", (("noise", f"{noise_kind}:{level!r}"),))
    raise ConfigError(f"unknown defence {spec!r}; choose from: {HELP}")


def parse_defenses(text: str) -> list[Defense]:
    """A comma-separated ``--defense`` list; duplicates are refused."""
    out = [parse_defense(s) for s in text.split(",") if s.strip()]
    if not out:
        raise ConfigError(f"--defense is empty; choose from: {HELP}")
    names = [d.name for d in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"--defense lists a defence twice: {', '.join(names)}")
    return out
