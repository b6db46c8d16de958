"""A post-norm run's stage results kept in a folder (one ``.npz`` a stage), so a run longer than one sitting resumes
where it stopped (docs/block.md, "Chained from MiniLM's answers, in sittings": MiniLM layer 2 took ~67 min in six
runs, its factor search ~38 of them).

A stage found in the folder is loaded, not run (its queries are not asked again); a long stage (the factor search,
the directions past the probes) saves its state as it goes and stops with :class:`Paused` once the store's time
is up. The folder belongs to one block and one seed: a result from another block is not detected here — the check
at the end of the run is what tells a wrong stage apart.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np


class Paused(Exception):
    """A run stopped at its store's deadline with its stages so far saved: run it again with the same folder."""


class StageStore:
    """Stage results under ``folder``; ``seconds``: the time after which :meth:`pause_if_due` stops the run (None:
    never). ``resumed`` lists the stages loaded."""

    def __init__(self, folder, seconds: float | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.resumed: list[str] = []
        self.saved = False

    def get(self, name: str) -> dict | None:
        """The arrays saved for stage ``name``, or None when it has not been saved."""
        f = self.folder / f"{name}.npz"
        if not f.exists():
            return None
        with np.load(f, allow_pickle=False) as z:
            out = {k: z[k] for k in z.files}
        self.resumed.append(name)
        return out

    def put(self, name: str, **arrays) -> None:
        """Save stage ``name`` (written whole, then renamed: a run killed mid-write leaves the previous save)."""
        tmp = self.folder / f".{name}.tmp.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, self.folder / f"{name}.npz")
        self.saved = True

    def pause_if_due(self, where: str, share: float = 0.0) -> None:
        """Raise :class:`Paused` (naming ``where``) once less than ``share`` of the sitting is left (0: once the
        deadline has passed) — never before this sitting has saved something (each sitting moves the run on)."""
        if self.saved and self.deadline is not None and self.deadline - time.monotonic() < share * self.seconds:
            raise Paused(f"{where}: paused at the store's deadline with the stages so far saved in {self.folder}; "
                         "run again with the same folder to resume")
