"""Engines that run audit tasks: a local process pool (default) or Ray (a local cluster or an existing one).

Both call ``on_result(index, record)`` as each task finishes, in completion order, and return
``(records, interrupted)`` with ``records[i]`` the record of ``tasks[i]`` (None if it never finished).
Ctrl-C (KeyboardInterrupt) stops the workers and returns what finished, with ``interrupted = True``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from typing import Callable, Sequence

from attnprobe.audit.tasks import Task, failed_record, run_task
from attnprobe.errors import ConfigError, MissingDependencyError

OnResult = Callable[[int, dict], None]


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which stops them (otherwise each prints a traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


#: one BLAS thread per worker, as Ray gives its workers: no oversubscription of the cores, and the same
#: floating-point summation order (so the same numbers) on either engine
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """Set environment variables for the processes started inside the block (a process copies the environment when
    it starts: the fork server, started in the first such block, passes them on to every worker it forks)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def signals_held(*signums: int):
    """Hold the signals ``signums`` back inside the block (not lost: handled when it ends). Blocked in this thread,
    so processes started inside the block inherit them blocked; and, since the kernel may hand a signal to any
    other thread (Ray's, the process pool's), their Python handlers are swapped for one that only notes them and
    the noted ones are raised again at the end. Only the main thread handles signals: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    holding = [True]
    handlers = {s: signal.getsignal(s) for s in signums}

    def note(signum, frame):  # once the block has ended, a signal arriving before its handler is back goes to it
        if holding[0] or not callable(handlers[signum]):
            noted.append(signum)
        else:
            handlers[signum](signum, frame)

    for s, h in handlers.items():
        if h is not None:  # None: a handler set outside Python, left alone
            signal.signal(s, note)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(signums))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # signals pending on the process arrive here...
        _python_handlers_run()  # ...and their Python handlers (``note``, still in place) run here, not later
        holding[0] = False
        for s, h in handlers.items():
            if h is not None:
                signal.signal(s, h)
        _deliver(list(dict.fromkeys(noted)))


def _python_handlers_run() -> None:
    """Nothing: calling a Python function is where CPython runs the Python handlers of signals that have arrived
    (a C call such as ``pthread_sigmask`` returning does not), so the ones unblocked just before are noted while the
    noting handler is still in place instead of reaching a handler swapped in later."""


def _deliver(signums: list[int]) -> None:
    """Raise each signal again (to its handler), every one of them even when a handler raises."""
    if signums:
        try:
            signal.raise_signal(signums[0])
        finally:
            _deliver(signums[1:])


def _indexed(item: tuple[int, Task]) -> tuple[int, dict]:
    i, task = item
    return i, run_task(task)


def run_processes(tasks: Sequence[Task], on_result: OnResult, workers: int = 1):
    """Run the tasks on ``workers`` fresh processes, forked from multiprocessing's fork server: one process this
    process starts once (with :data:`ONE_THREAD`), which has imported the audit's modules; a worker inherits
    nothing of the caller but its ``sys.path`` and working directory (as a spawned one), and starts without
    importing them again (~0.8 s a worker)."""
    if int(workers) < 1:
        raise ConfigError(f"workers must be at least 1; got {workers}", param="workers")
    records: list[dict | None] = [None] * len(tasks)
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
    else:  # Windows: no fork server; spawned workers import the audit themselves
        ctx = multiprocessing.get_context("spawn")
    with _environment(ONE_THREAD):
        pool = ctx.Pool(min(int(workers), max(1, len(tasks))), initializer=_ignore_sigint)
    try:
        for i, rec in pool.imap_unordered(_indexed, list(enumerate(tasks))):
            records[i] = rec
            on_result(i, rec)
    except KeyboardInterrupt:
        pool.terminate()
        pool.join()
        return records, True
    except BaseException:  # ``on_result`` gave up (e.g. a full disk): no worker is left running
        pool.terminate()
        pool.join()
        raise
    pool.close()
    pool.join()
    return records, False


def run_ray(tasks: Sequence[Task], on_result: OnResult, address: str | None = None, workers: int | None = None):
    """Run the tasks as Ray tasks: on a local cluster of ``workers`` CPUs started here (``address`` None) or
    on the cluster at ``address`` (attnprobe must be importable on its nodes). A cluster started here is
    shut down afterwards."""
    if address:  # a socket check, before Ray is imported: a dead address is named whether or not Ray is installed
        reachable(address)
    try:
        import ray
    except ImportError as exc:
        raise MissingDependencyError("--ray needs Ray: pip install 'attnprobe[ray]'") from exc
    started = not ray.is_initialized()
    records: list[dict | None] = [None] * len(tasks)
    pending: list = []
    interrupted = False
    try:
        if started:
            _start_ray(ray, address, workers)
        remote = ray.remote(num_cpus=1, max_retries=0)(run_task)
        index = {remote.remote(task): i for i, task in enumerate(tasks)}
        pending = list(index)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                i = index[ref]
                try:
                    records[i] = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the worker died (e.g. out of memory)
                    records[i] = failed_record(tasks[i], f"{type(exc).__name__}: {exc}")
                on_result(i, records[i])
    except KeyboardInterrupt:
        interrupted = True
        for ref in pending:
            ray.cancel(ref, force=True)
    finally:
        if started:
            ray.shutdown()
    return records, interrupted


def _start_ray(ray, address: str | None, workers: int | None) -> None:
    """``ray.init``: a private local cluster of ``workers`` CPUs (``address`` None; never one found running on the
    machine or named by a stale ray_current_cluster file, which would refuse num_cpus), or the cluster at
    ``address``. Ctrl-C is held back while Ray starts its processes: they inherit the blocked signal, so a Ctrl-C
    sent to the whole process group (a terminal's) reaches only this process, which then stops the cluster
    (``ray.shutdown``) instead of leaving half-started Ray processes behind. SIGTERM keeps the handler it had
    (the audit's: stop like Ctrl-C)."""
    kw = {"address": address} if address else {"address": "local", "num_cpus": int(workers) if workers else None}
    main = threading.current_thread() is threading.main_thread()
    on_term = signal.getsignal(signal.SIGTERM) if main else None
    try:
        with signals_held(signal.SIGINT):
            try:
                ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                         runtime_env={"env_vars": ONE_THREAD}, **kw)
            finally:
                if on_term is not None:  # Ray's core worker takes SIGTERM over (a stack dump, an abort): give it back
                    signal.signal(signal.SIGTERM, on_term)
    except (ConnectionError, RuntimeError, TimeoutError, ValueError) as exc:
        where = f"at {address}" if address else "on this machine"
        raise ConfigError(f"cannot start or join a Ray cluster {where} ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else exc!r}); check the address, or give --ray "
                          "without an address for a private local cluster", param="address") from None


#: seconds to wait for a Ray cluster's address to accept a connection before refusing it
RAY_CONNECT_TIMEOUT = 5.0


#: the client's opening of an HTTP/2 connection (RFC 9113 §3.4) and an empty SETTINGS frame: a gRPC server (Ray's
#: GCS, the Ray Client server) answers with a SETTINGS frame of its own
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def reachable(address: str, timeout: float = RAY_CONNECT_TIMEOUT) -> None:
    """Refuse (one :class:`ConfigError`) a Ray ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``) that does not
    accept a TCP connection within ``timeout`` s, or accepts it but does not answer as a gRPC server does (an
    HTTP/2 SETTINGS frame; not checked when ``RAY_USE_TLS`` is on): Ray itself would retry for minutes. ``auto``
    is left to Ray."""
    import socket

    text = address.split("://", 1)[-1]
    host, sep, port = text.rpartition(":")
    if address == "auto" or not sep:
        return
    try:
        port_n = int(port)
    except ValueError:
        raise ConfigError(f"the Ray address {address!r} must look like HOST:PORT", param="address") from None
    if not 0 < port_n < 65536:
        raise ConfigError(f"the Ray address {address!r} has no valid port (1..65535)", param="address")
    hint = "start one there with 'ray start --head' or give --ray without an address for a private local cluster"
    tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")  # gRPC inside TLS: no plain frames to read
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", port_n), timeout=timeout) as sock:
            if tls:
                return
            sock.sendall(_HTTP2_PREFACE)
            head = b""
            while len(head) < 9:  # a frame header: length (3 bytes), type, flags, stream id
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except socket.timeout:
        head = b""
    except OSError as exc:
        raise ConfigError(f"no Ray cluster answers at {address} ({exc.strerror or exc}); {hint}",
                          param="address") from None
    if len(head) < 9 or head[3] != 4:
        raise ConfigError(f"the server at {address} is not a Ray cluster (it does not answer as Ray's gRPC server "
                          f"does); give the address 'ray start --head' printed (HOST:6379), or {hint.split(' or ')[1]}",
                          param="address")


#: engine name (as written to results.json) -> runner
ENGINES = {"processes": run_processes, "ray": run_ray}
