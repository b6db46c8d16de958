"""One small exception hierarchy; every message says what to do next (docs/architecture.md, "Exit codes")."""

from __future__ import annotations


class AttnprobeError(Exception):
    """Base class of every error attnprobe raises on purpose."""


class ConfigError(AttnprobeError, ValueError):
    """Invalid arguments, options or files given by the user.

    ``param`` names the library parameter that was wrong (e.g. ``"rank"``) when there is one; the CLI maps it to
    its flag, so library messages never name command-line flags.
    """

    def __init__(self, message: str = "", *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class MissingDependencyError(AttnprobeError):
    """An optional package (or the MiniLM weights) is not installed: no parameter of the run is wrong; the
    message says what to install."""


class OracleError(AttnprobeError):
    """The oracle could not be loaded or called."""


class OracleAnswerError(OracleError):
    """The oracle answered with a mis-shaped or non-finite array."""


class NonFiniteAnswerError(OracleAnswerError):
    """The oracle answered inf or NaN (e.g. its forward pass overflowed its precision)."""


class BudgetExceededError(AttnprobeError):
    """A query would exceed the oracle's budget; raised before the oracle is asked."""


class UnidentifiableError(AttnprobeError):
    """The answers do not determine the parameters (e.g. v = 0 makes W invisible, Thm 4.1)."""


class SaturationError(AttnprobeError):
    """Attention weights are numerically 0 or 1, so the sigmoid cannot be inverted."""


class RecoveryError(AttnprobeError):
    """The recovered parameters fail their own consistency checks (e.g. a wrong rank guess)."""


class SeparationError(RecoveryError):
    """The heads of a whole output row did not separate along a probe difference: ``misfit`` against the
    ``tolerance`` the answers' precision allows (a marginal misfit may pass with another seed)."""

    def __init__(self, message: str = "", *, misfit: float | None = None, tolerance: float | None = None) -> None:
        super().__init__(message)
        self.misfit, self.tolerance = misfit, tolerance


class ModelMismatchError(RecoveryError):
    """The answers are not those of the model the learner assumes, for a cause read from them (a normalised
    output, a row attended besides the input rows)."""


class PausedError(AttnprobeError):
    """A run stopped at the end of its sitting with its stages so far saved: run it again with the same stages
    folder to resume (the CLI's exit code 75, sysexits' "temporary failure: try again")."""


class CheckFailedError(AttnprobeError):
    """The functional check on fresh queries failed: the recovered model does not describe the oracle."""


class InputNormError(OracleError):
    """A probe row is longer than the oracle accepts (``Oracle.max_input_norm``), or the answers show that the
    oracle clips longer rows. ``limit`` is the bound (declared or estimated), ``norm`` the norm that passed it."""

    def __init__(self, message: str = "", *, norm: float | None = None, limit: float | None = None) -> None:
        super().__init__(message)
        self.norm, self.limit = norm, limit
