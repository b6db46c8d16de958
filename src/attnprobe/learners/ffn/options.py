"""The FFN learner's settings (:class:`FFNOptions`), validated by their declared constraints (:data:`OPTIONS`,
the registry's :class:`~attnprobe.learners.core.registry.Option`)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from attnprobe.errors import ConfigError
from attnprobe.learners.core.registry import Option
from attnprobe.learners.ffn.regions import PROBE_FRACTION

#: seconds the 0/1 program may spend on neuron orientations by default
SIGN_TIME_LIMIT = 5.0
#: the constraints of :class:`FFNOptions`' fields (the defaults are the dataclass's)
OPTIONS = (
    Option("refine", str, "which regions are re-measured", choices=("auto", "always", "never")),
    Option("polish", str, "when the neurons are refitted by least squares", choices=("auto", "always", "never")),
    Option("bias", bool, "a biased network (None: unless v is given)", choices=(None, True, False)),
    Option("chebyshev", bool, "grazed regions re-measured at their deepest point", choices=(True, False)),
    Option("noise_factor", float, "roundings within which answers lie on a line", low=0, open_low=True),
    Option("min_width", float, "shortest search interval", low=0, open_low=True),
    Option("min_jump", float, "smallest kept gradient jump, relative", low=0, high=1),
    Option("min_region", float, "narrowest kept region", low=0, high=1),
    Option("probe_fraction", float, "reach of the gradient probes towards the nearest kink", low=0, open_low=True,
           high=1, open_high=True),
    Option("sign_time_limit", float, "seconds of the 0/1 program", low=0, open_low=True),
    Option("reach", float, "reach of the biased search line", low=1, open_low=True),
    Option("hidden", int, "hidden width if known", low=1),
    Option("check_count", int, "fresh inputs of the functional check", low=1),
)


@dataclass(frozen=True)
class FFNOptions:
    """The FFN learner's settings, validated on construction (every error names its parameter).

    * ``bias``: learn ``w_oᵀReLU(Aᵀx + b) + c`` (default, searched in the lifted space) or the paper's bias-free
      ``w_oᵀReLU(Aᵀx)`` (``False``; implied when ``v`` is given);
    * ``noise_factor``: answers within this many roundings of the largest answer count as "on a line" (default
      64 for float64 answers, 8 for coarser ones, whose pieces between kinks are then also checked against a
      least-squares line through all their answers);
    * ``min_width``: search intervals shorter than this (in units of the search line; default
      ``max(1e-9, 1024·eps)``) are taken to hold one kink;
    * ``min_jump`` / ``min_region``: a kink whose gradient jump is below ``min_jump`` times the largest (or below
      its finite-difference noise), and a region narrower than ``min_region``, are merged away;
    * ``probe_fraction``: how far towards the nearest kink along the line the gradient probes reach;
    * ``refine``: ``"auto"`` re-measures regions whose probes crossed a recovered hyperplane or broke Euler's
      identity, ``"always"`` every region once more, ``"never"`` none;
    * ``chebyshev``: regions the search line only grazes are re-measured at the deepest point of their cell;
    * ``polish``: refit all neurons by least squares on ``3·D·m`` fresh random inputs (``"auto"``: only when
      answers are coarser than float64; ``"always"``, ``"never"``);
    * ``sign_time_limit``: seconds for the 0/1 program that fixes neuron orientations;
    * ``reach``: biased nets: the search line reaches ``reach`` times its own scale (kinks farther out are missed);
    * ``hidden``: the hidden width if known: neurons the answers cannot show are then reported as unidentifiable;
    * ``check_count``: fresh inputs of the functional check.
    """

    bias: bool | None = None
    noise_factor: float | None = None
    min_width: float | None = None
    min_jump: float = 1e-6
    min_region: float = 1e-7
    probe_fraction: float = PROBE_FRACTION
    refine: str = "auto"
    chebyshev: bool = True
    polish: str = "auto"
    sign_time_limit: float = SIGN_TIME_LIMIT
    reach: float = 1e6
    hidden: int | None = None
    check_count: int = 64

    def __post_init__(self) -> None:
        defaults = {f.name: f.default for f in fields(self)}
        for option in OPTIONS:  # the declared constraints (the registry's mechanism): every error names its option
            value = getattr(self, option.name)
            if value is None and defaults[option.name] is not None:
                raise ConfigError(f"The {option.name!r} parameter must be {option.describe()}; got None",
                                  param=option.name)
            option.validate(value)

    @classmethod
    def build(cls, options: "FFNOptions | None", settings: dict) -> "FFNOptions":
        """``options`` with ``settings`` (keyword arguments of :func:`extract_ffn`) applied; unknown names are
        refused with the list of known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ConfigError(f"unknown FFN option(s) {', '.join(map(repr, unknown))}; "
                              f"known: {', '.join(sorted(known))}",
                              param=unknown[0])
        return replace(options or cls(), **settings)
