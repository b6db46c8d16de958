"""CPU seconds of a test run: the run and every process it starts, counted even where a worker is not the run's own
child (multiprocessing's fork server forks the audit's workers, and nobody waits for the server but the kernel).

    PYTHONPATH=src python benchmarks/suite_cpu.py -q tests/test_audit_files.py      # any pytest arguments

It runs ``python -m pytest ARGS`` as a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): orphaned
descendants are handed to this process, which waits for every one, so their CPU time is in its
``RUSAGE_CHILDREN``. On a shared machine CPU seconds vary much less than wall seconds; compare before and after on
the same files.
"""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    if ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("suite_cpu: prctl(PR_SET_CHILD_SUBREAPER) failed (Linux only)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rc = subprocess.call([sys.executable, "-m", "pytest", *argv])
    while True:  # orphans reparented here (a fork server and what it forked)
        try:
            os.wait()
        except ChildProcessError:
            break
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"cpu {r.ru_utime + r.ru_stime:.1f} s (user {r.ru_utime:.1f}, sys {r.ru_stime:.1f}), "
          f"wall {time.perf_counter() - t0:.1f} s, pytest exit {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
