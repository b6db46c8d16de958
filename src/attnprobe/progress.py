"""Progress reporting for long extractions: tqdm when installed, a plain line on stderr otherwise, and only when
stderr is a terminal (a log file or a pipe, ``2> log`` or CI, gets no carriage-return frames: nothing)."""

from __future__ import annotations

import sys
import time


def on_terminal(stream) -> bool:
    """Whether ``stream`` is an interactive terminal (progress frames belong there and nowhere else)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class Progress:
    """Callable ``progress(done, total)`` that draws a bar on a terminal's stderr once the work has run for
    ``delay`` seconds; with stderr not a terminal it draws nothing."""

    def __init__(self, desc: str, enabled: bool = True, delay: float = 1.0, unit: str = "q"):
        self.desc, self.delay, self.unit = desc, delay, unit
        self.enabled = enabled and on_terminal(sys.stderr)
        self.t0 = time.perf_counter()
        self.bar = None
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or time.perf_counter() - self.t0 < self.delay:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            now = time.perf_counter()
            if now - self._last > 1.0 or done >= total:
                units = "queries" if self.unit == "q" else self.unit + "s"
                print(f"\r{self.desc}: {done}/{total} {units}", end="", file=sys.stderr, flush=True)
                self._last = now
            return
        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.desc, unit=self.unit, unit_scale=self.unit == "q", delay=0,
                            leave=False)
        self.bar.total = max(total, done)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and time.perf_counter() - self.t0 >= self.delay:
            print(file=sys.stderr)
