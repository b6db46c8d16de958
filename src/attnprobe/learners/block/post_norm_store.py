"""A post-norm run's stage results kept in a folder (one ``.npz`` a stage), so a run longer than one sitting resumes
where it stopped (docs/block.md, "Chained from MiniLM's answers, in sittings": MiniLM layer 2 took ~67 min in six
runs, its factor search ~38 of them).

A stage found in the folder is loaded, not run (its queries are not asked again); a long stage (the factor search,
the directions past the probes) saves its state as it goes and stops with :class:`Paused` once the store's time
is up. The folder belongs to one block and one seed: :meth:`StageStore.bind` keeps the block's answer to one fixed
sequence, the width, heads and seed, and refuses a folder of another block or setting in one line (the check at the
end of the run would tell a wrong stage apart too, after the whole run).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from attnprobe.errors import ConfigError, PausedError

#: the answer a resumed run must give again to the store's fingerprint sequence (float64 answers; the block learner
#: reads nothing coarser): far above a re-run's rounding, far below any other block's difference
FINGERPRINT_TOLERANCE = 1e-9


class Paused(PausedError):
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
        self.count = None  # the oracle's query counter once bound (:meth:`bind`)
        self.earlier = 0  # queries the earlier sittings asked up to their last save (the ledger)

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
        """Save stage ``name`` and the ledger (queries of every sitting up to this save)."""
        self._write(name, **arrays)
        self.saved = True
        if self.count is not None:
            self._write("ledger", queries=self.earlier + self.count())

    def _write(self, name: str, **arrays) -> None:
        """``name``.npz written whole, then renamed: a run killed mid-write leaves the previous save."""
        tmp = self.folder / f".{name}.tmp.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, self.folder / f"{name}.npz")

    def queries(self) -> int:
        """Queries asked over every sitting so far (the earlier ones up to their last save: a sitting killed between
        saves loses its last queries from the count)."""
        return self.earlier + (self.count() if self.count is not None else 0)

    def pause_if_due(self, where: str, share: float = 0.0) -> None:
        """Raise :class:`Paused` (naming ``where``) once less than ``share`` of the sitting is left (0: once the
        deadline has passed) — never before this sitting has saved something (each sitting moves the run on)."""
        if self.saved and self.deadline is not None and self.deadline - time.monotonic() < share * self.seconds:
            raise Paused(f"{where}: paused at the store's deadline with the stages so far saved in {self.folder}; "
                         "run again with the same folder to resume")

    def bind(self, rows, d: int, setting: dict, count=None) -> None:
        """Tie the folder to this block (one query: a fixed sequence of three rows) and ``setting`` (heads, width,
        seed): saved on the first sitting, compared on every later one — another block's or setting's folder is
        refused in one line before any stage is loaded. ``count``: the run's query counter (``() -> int``), kept in
        the folder's ledger at every save (:meth:`queries`)."""
        start = count() if count is not None else 0
        X = np.random.default_rng(20261130).standard_normal((1, 3, d))
        Y = np.asarray(rows(X), dtype=np.float64)
        f = self.folder / "fingerprint.npz"
        if not f.exists():
            if any(p for p in self.folder.iterdir() if not p.name.startswith(".")):
                raise ConfigError(f"the stages folder {self.folder} holds files but no fingerprint: it was not made "
                                  "by this route; give an empty or new folder", param="stages")
            self._count_from(count, start)
            self._write("fingerprint", X=X, Y=Y, **{k: np.asarray(v) for k, v in setting.items()})  # not a stage
            return
        with np.load(f, allow_pickle=False) as z:
            saved = {k: z[k] for k in z.files}
        for k, v in setting.items():
            if k not in saved or saved[k].tolist() != np.asarray(v).tolist():
                was = saved[k].tolist() if k in saved else "not saved"
                raise ConfigError(f"the stages folder {self.folder} was made with {k} = {was}, not {v}: give a "
                                  "new folder, or the setting it was made with", param="stages")
        if saved["X"].shape != X.shape:
            raise ConfigError(f"the stages folder {self.folder} was made for a block of width "
                              f"{saved['X'].shape[-1]}, not {d}: give a new folder", param="stages")
        off = float(np.abs(Y - saved["Y"]).max() / max(np.abs(saved["Y"]).max(), 1e-300))
        if not off <= FINGERPRINT_TOLERANCE:
            raise ConfigError(f"the stages folder {self.folder} was made from another block: its fingerprint "
                              f"sequence is answered {off:.1e} differently (relative); give a new folder",
                              param="stages")
        self._count_from(count, start)

    def _count_from(self, count, start: int) -> None:
        """Count this sitting's queries from ``start`` on top of the ledger's (the fingerprint's query is each
        sitting's own)."""
        if count is None:
            return
        ledger = self.folder / "ledger.npz"
        if ledger.exists():
            with np.load(ledger, allow_pickle=False) as z:
                self.earlier = int(z["queries"])
        self.count = lambda: count() - start
