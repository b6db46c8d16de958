"""The acceptance rule the Gauss–Newton polishes share: a step is kept only when it lowers the residual, and the
descent stops at the first step that does not, or once the residual is below a floor (nothing left to gain)."""

from __future__ import annotations

from typing import TypeVar

State = TypeVar("State")


def keep_if_lower(history: list[float], err: float, current: State, trial: State, *,
                  floor: float) -> tuple[State, bool]:
    """``(trial, go on)`` when ``err`` (the trial's residual) is below ``history[-1]`` (then appended to
    ``history``), else ``(current, False)``; go on is False too once ``err < floor``."""
    if not err < history[-1]:
        return current, False
    history.append(err)
    return trial, not err < floor
