"""Run the app with uvicorn: in the foreground (``attnprobe serve``) or in a background thread (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time

from attnprobe.errors import ConfigError


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free port chosen by the OS, no race)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: an answer leaves at once, not after the client's delayed ACK (~40 ms a
    # request on Linux, since the response's head and body are written separately)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}; choose another --port or --host",
                          param="port") from exc
    sock.listen(2048)
    return sock


def _config(app, log_level: str):
    import uvicorn

    return uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off", timeout_keep_alive=30)


def serve_forever(app, host: str, port: int, log_level: str = "info", announce=None) -> None:
    """Serve until stopped; ``announce(url)`` is called once the socket listens (so nothing claims to serve
    on a port that could not be bound)."""
    import uvicorn

    sock = bind(host, port)
    if announce is not None:
        bound = sock.getsockname()[1]
        announce(f"http://{'[' + host + ']' if ':' in host else host}:{bound}")
    uvicorn.Server(_config(app, log_level)).run(sockets=[sock])


class BackgroundServer:
    """uvicorn serving ``app`` from a daemon thread on a free loopback port (or ``port``); ``url``; ``stop()``.

    Use as a context manager. The server is real (TCP on 127.0.0.1); nothing about HTTP is mocked.
    """

    def __init__(self, app, host: str = "127.0.0.1", log_level: str = "warning", port: int = 0):
        import uvicorn

        self.sock = bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn.Server(_config(app, log_level))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, timeout: float = 20.0) -> "BackgroundServer":
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() - t0 > timeout:
                raise RuntimeError("the uvicorn server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
