"""Progress reporting for long extractions: tqdm when installed, a plain line on stderr otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    """Callable ``progress(done, total)`` that draws a bar once the work has run for ``delay`` seconds."""

    def __init__(self, desc: str, enabled: bool = True, delay: float = 1.0, unit: str = "q"):
        self.desc, self.enabled, self.delay, self.unit = desc, enabled, delay, unit
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
