"""The defences an audit compares: a comma-separated list of answer chains, one per ``--defense`` entry
(:class:`attnprobe.oracles.chain.AnswerChain`; ``float16``, ``round:4``, ``float16+gaussian:1e-6``,
``membership``, ...)."""

from __future__ import annotations

from attnprobe.errors import ConfigError
from attnprobe.oracles.chain import SPEC_HELP, AnswerChain

#: one audited defence is one answer chain; its ``name`` is the chain's spec
Defense = AnswerChain
HELP = f"comma-separated defences, each a spec: {SPEC_HELP}"


def parse_defenses(text: str) -> list[AnswerChain]:
    """A comma-separated ``--defense`` list of chains; a chain listed twice (in any spelling) is refused."""
    out = [AnswerChain.parse(s) for s in str(text).split(",") if s.strip()]
    if not out:
        raise ConfigError(f"--defense is empty; choose from: {SPEC_HELP}", param="defense")
    names = [d.name for d in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"--defense lists a defence twice: {', '.join(names)}", param="defense")
    return out


def answers_left(defense: AnswerChain) -> dict:
    """What the answers a defence leaves are like, as :meth:`attnprobe.learners.core.registry.Learner.fits` asks:
    yes/no (``membership``) and coarser than float32 (``coarse``: a float16/bfloat16 cast, rounding to decimals
    or to fewer than 7 significant digits, noise)."""
    coarse = (defense.cast in ("float16", "bfloat16") or defense.decimals is not None
              or (defense.digits is not None and defense.digits < 7) or defense.noise is not None)
    return {"membership": bool(defense.membership), "coarse": bool(coarse)}
