"""The answer-chain flags ``extract``, ``serve`` and ``audit`` share: one argparse group, one spelling.

Each flag is named after its stage of :class:`~attnprobe.oracles.chain.AnswerChain` (``--cast float16``,
``--clip R``, ``--noise avq:1e-3``, ``--noise-seed S``, ``--round K``, ``--round-digits K``, ``--membership``);
``--defense SPEC`` gives the same stages as one spec (``float16+round:4``).
"""

from __future__ import annotations

import argparse

from attnprobe.cli.common import nonneg_int, positive_float, positive_int
from attnprobe.errors import ConfigError
from attnprobe.oracles.chain import CASTS, SPEC_HELP, AnswerChain, parse_noise
from attnprobe.oracles.wrappers import MAX_DECIMALS, MAX_DIGITS

#: argparse dest -> AnswerChain field, for every stage flag
FLAG_FIELDS = {"cast": "cast", "clip": "clip", "noise": "noise", "noise_seed": "seed", "round": "decimals",
               "round_digits": "digits", "membership": "membership"}


def _noise(text: str) -> str:
    try:
        kind, level = parse_noise(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _decimals(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of decimals; got {text!r}") from None
    if not -MAX_DECIMALS <= k <= MAX_DECIMALS:
        raise argparse.ArgumentTypeError(f"expected -{MAX_DECIMALS} <= K <= {MAX_DECIMALS}; got {k}")
    return k


def _digits(text: str) -> int:
    k = positive_int(text)
    if k > MAX_DIGITS:
        raise argparse.ArgumentTypeError(f"float64 answers carry at most {MAX_DIGITS} significant digits; got {k}")
    return k


def add_arguments(parser, *, defense_help: str | None = None) -> None:
    """The shared group of defence flags. ``defense_help``: the help of ``--defense`` (None: one chain)."""
    g = parser.add_argument_group("defences between the model and the answers (Sec. 6, App. B)")
    g.add_argument("--defense", metavar="SPEC",
                   help=defense_help or f"the defences as one spec instead of the flags below: {SPEC_HELP}")
    g.add_argument("--cast", choices=CASTS, help="round inputs and answers to this precision (bfloat16 via ml_dtypes)")
    g.add_argument("--clip", type=positive_float, metavar="R",
                   help="scale every input row of norm > R down to norm R (a layer that bounds its inputs)")
    g.add_argument("--noise", type=_noise, metavar="KIND:LEVEL",
                   help="add noise: avq:τ (deterministic, |err| ≤ τ), adversarial:τ, gaussian:σ, uniform:σ")
    g.add_argument("--noise-seed", type=nonneg_int, metavar="S",
                   help="seed of --noise (default 0; in audit, each task's --seed)")
    rounding = g.add_mutually_exclusive_group()
    rounding.add_argument("--round", type=_decimals, metavar="K", help="round answers to K decimals")
    rounding.add_argument("--round-digits", type=_digits, metavar="K", help="round answers to K significant digits")
    g.add_argument("--membership", action="store_true", help="answer only 1[f(X) > 0] (App. B)")


def flags_chain(args, **extra) -> AnswerChain:
    """The chain the stage flags describe (``extra``: stages a subcommand implies, e.g. ``membership=True``)."""
    fields = {field: getattr(args, dest, None) for dest, field in FLAG_FIELDS.items()}
    fields.update({k: v for k, v in extra.items() if v})
    if fields["seed"] is not None and not fields["noise"]:
        raise ConfigError("--noise-seed seeds --noise: give --noise KIND:LEVEL too, or drop --noise-seed",
                          param="noise_seed")
    return AnswerChain(**{k: v for k, v in fields.items() if v is not None and v is not False})


def chain_from_args(args, **extra) -> AnswerChain:
    """One chain from ``--defense SPEC`` and the stage flags together (a stage given in both is refused)."""
    chain = flags_chain(args, **extra)
    spec = getattr(args, "defense", None)
    return chain if spec is None else AnswerChain.parse(spec).combine(chain)


def has_flags(args) -> bool:
    """Whether any stage flag was given."""
    return any(getattr(args, dest, None) not in (None, False) for dest in FLAG_FIELDS)
