"""Command line: ``attnprobe extract | verify | demo | target | serve | audit | reproduce``, one module per subcommand.

Every run ends with an exit code and, unless it succeeded, one line on stderr that says what happened and how
many queries were spent: 0 done and verified; 2 bad input or refused (before or during the run);
3 the functional check failed (nothing written unless ``--keep-failed``); 75 paused at the end of a sitting
(``--sitting``: the stages so far saved, run the same command again); 130 interrupted (SIGINT, Ctrl-C);
143 terminated (SIGTERM); 1 an internal error (a bug: the line says so; ``ATTNPROBE_DEBUG=1`` shows the traceback).

The subcommands (and with them numpy, scipy, torch, cvxpy) are imported inside :func:`main`, after its signal
handling is in place: Ctrl-C in the first second of a run ends it like any other (one line, exit 130).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import sys
import threading

from attnprobe.errors import AttnprobeError, CheckFailedError, PausedError

#: the subcommands' modules under ``attnprobe.cli``, in the order ``--help`` lists them; each has
#: ``add_parser(sub)`` and ``run(args)``
SUBCOMMANDS = ("extract", "verify", "demo", "target", "serve", "audit", "reproduce", "export")

#: exit codes (README "Exit codes")
EXIT_OK, EXIT_BUG, EXIT_REFUSED, EXIT_CHECK_FAILED, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 3, 130, 143
EXIT_PAUSED = 75  # sysexits' EX_TEMPFAIL: the run is not over, run it again

__all__ = ["build_parser", "main", "relative_errors"]


def __getattr__(name: str):
    if name == "relative_errors":  # re-exported, imported on first use (it loads numpy)
        from attnprobe.cli.common import relative_errors
        return relative_errors
    raise AttributeError(f"module 'attnprobe.cli' has no attribute {name!r}")


class Terminated(BaseException):
    """SIGTERM arrived: unwinds the run like KeyboardInterrupt does for SIGINT."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``attnprobe: error: ...``) instead of the usage block, and no abbreviated
    flags (``demo --d 4`` read as ``--dtype 4``: an unknown flag is named as such instead)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(EXIT_REFUSED, f"attnprobe: error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="attnprobe", description="Recover attention weights from black-box queries.")
    sub = p.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"attnprobe.cli.{name}").add_parser(sub)
    return p


@contextlib.contextmanager
def _signals_end_the_run():
    """SIGINT raises KeyboardInterrupt and SIGTERM :class:`Terminated` in the main thread for the duration of a
    run; :func:`main` turns them into the one-line message and exit code 130/143. (Solvers that would trap
    SIGINT run in a child process: :func:`attnprobe.learners.head.nuclear.solve_in_child`.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise Terminated()

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


_SIGNAL_ENDINGS = {signal.SIGINT: ("interrupted", "stopped by SIGINT (Ctrl-C); no result written"),
                   signal.SIGTERM: ("terminated", "stopped by SIGTERM; no result written")}


#: library parameters whose command-line flag is not ``--`` + the parameter name with dashes
PARAM_FLAGS = {"decimals": "--round", "digits": "--round-digits", "tau": "--noise", "sigma": "--noise"}


def _option_for(args, param: str) -> str | None:
    """The flag that sets library parameter ``param`` in this run's subcommand (None when it has none): every
    flag is ``--`` + its destination with dashes, and the parsed ``args`` hold every destination."""
    if param in PARAM_FLAGS:
        return PARAM_FLAGS[param]
    return "--" + param.replace("_", "-") if param.isidentifier() and hasattr(args, param) else None


def flag_message(args, exc: Exception) -> str:
    """The error's message with its library parameter (``exc.param``) named by the CLI flag that sets it."""
    message = re.sub(r"\b[Tt]he '(\w+)' parameter", lambda m: _option_for(args, m.group(1)) or m.group(0),
                     str(exc))
    param = getattr(exc, "param", None)
    flag = _option_for(args, param) if param else None
    return message.replace(f"'{param}'", flag) if flag else message


def _written(args, message: str) -> str:
    """``message`` with "no result written" replaced by what an interrupted run did write (``args.written``)."""
    paths = getattr(args, "written", None)
    if not paths or "no result written" not in message:
        return message
    folders = sorted({str(p.parent) for p in paths})
    return message.replace("no result written", f"{len(paths)} file(s) written before it stopped (in "
                           f"{', '.join(folders)}: {', '.join(p.name for p in paths[:3])}"
                           f"{', ...' if len(paths) > 3 else ''}); the run is incomplete")


def _end(args, kind: str, message: str, code: int) -> int:
    """Print the one line that ends a failed run (with the queries it spent) and return the exit code."""
    message = _written(args, message)
    tail = ""
    if getattr(args, "command", None) in ("extract", "demo"):
        from attnprobe.cli.common import queries_spent
        tail = queries_spent(args)
    text = message.rstrip(". ") if tail else message
    line = f"attnprobe: {kind}: {text}" + (f"; {tail}" if tail else "")
    print(" ".join(line.split()), file=sys.stderr)
    return code


class _ReaderMayLeave:
    """``sys.stdout`` for the length of a run: when the reader of a pipe goes away (``| head``, ``| true``),
    further output is dropped instead of ending the run with BrokenPipeError. The run finishes (its files are
    written) and exits with its own code: output nobody reads is not a failure of the run."""

    def __init__(self, stream):
        self._stream, self.gone = stream, False

    def write(self, text):
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self):
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self):
        self.gone = True
        try:  # the bytes still buffered would fail again at exit: point the descriptor at /dev/null
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _stdout_reader_may_leave():
    real = sys.stdout
    sys.stdout = guard = _ReaderMayLeave(real)
    try:
        yield
    finally:
        guard.flush()
        if sys.stdout is guard:
            sys.stdout = real


def _close_log(args) -> None:
    """Close the run's query log (its WAL is folded back into the file: nothing is left half-written)."""
    for log in (getattr(getattr(args, "tracked_oracle", None), "log", None), getattr(args, "query_log", None)):
        if log is not None:
            log.close()


def main(argv: list[str] | None = None) -> int:
    args = None  # until parsed: a signal while the subcommands import ends the run with the same one line
    try:
        with _signals_end_the_run():
            parser = build_parser()
            try:
                args = parser.parse_args(argv)
            except SystemExit as exc:  # --help, or a usage error already printed on one line
                return exc.code if isinstance(exc.code, int) else EXIT_REFUSED
            with _stdout_reader_may_leave():
                try:
                    return args.func(args)
                finally:
                    _close_log(args)
    except CheckFailedError as exc:
        return _end(args, "check failed", str(exc), EXIT_CHECK_FAILED)
    except PausedError as exc:
        return _end(args, "paused", str(exc), EXIT_PAUSED)
    except AttnprobeError as exc:
        return _end(args, "error", flag_message(args, exc), EXIT_REFUSED)
    except KeyboardInterrupt:
        return _end(args, *_SIGNAL_ENDINGS[signal.SIGINT], EXIT_SIGINT)
    except Terminated:
        return _end(args, *_SIGNAL_ENDINGS[signal.SIGTERM], EXIT_SIGTERM)
    except MemoryError:
        return _end(args, "error", "out of memory; try a smaller model width or method", EXIT_REFUSED)
    except Exception as exc:  # a bug: still one line, never a traceback unless asked for
        if os.environ.get("ATTNPROBE_DEBUG"):
            raise
        return _end(args, "internal error", f"{type(exc).__name__}: {exc} (a bug in attnprobe; rerun with "
                    "ATTNPROBE_DEBUG=1 for the traceback and report it)", EXIT_BUG)


if __name__ == "__main__":
    sys.exit(main())
