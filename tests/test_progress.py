"""Progress bars belong to terminals: a stderr that is a file or a pipe (``2> log``, CI) gets no frames."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).parents[1] / "src")
DRAW = ("from attnprobe.progress import Progress\n"
        "p = Progress('work', delay=0.0)\n"
        "for i in range(1, 4):\n    p(i, 3)\n"
        "p.close()\n")


def test_no_frames_when_stderr_is_a_pipe_or_a_file(tmp_path):
    env = dict(os.environ, PYTHONPATH=SRC)
    p = subprocess.run([sys.executable, "-c", DRAW], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == ""
    with open(tmp_path / "log", "w") as log:
        subprocess.run([sys.executable, "-c", DRAW], env=env, stderr=log, check=True, timeout=60)
    assert (tmp_path / "log").read_text() == ""


def test_frames_on_a_terminal():
    pty = pytest.importorskip("pty")
    import select

    import fcntl
    import struct
    import termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide
    seen = b""
    try:  # the child's end stays open here, so what it wrote stays readable after it exits
        p = subprocess.run([sys.executable, "-c", DRAW], env=dict(os.environ, PYTHONPATH=SRC), stderr=child,
                           stdout=subprocess.DEVNULL, timeout=60)
        while select.select([main], [], [], 0.5)[0]:
            seen += os.read(main, 4096)
    finally:
        os.close(child)
        os.close(main)
    assert p.returncode == 0
    assert b"work:" in seen and b"/3.00" in seen
