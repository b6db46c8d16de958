"""The HTTP oracle: a served prediction API (docs/architecture.md, "Served API") as an oracle callable, on httpx.

Batches are split to the server's ``max_batch`` (read from ``GET /v1/info`` with ``d``) and sent with bounded
concurrency; 429, 5xx and connection errors are retried with exponential backoff (honouring ``Retry-After``);
401 and other 4xx end the call with one clear :class:`OracleError`. Every request carries an
``Idempotency-Key`` derived from its contents, so a retried batch (or one resent after a crash) is not charged
twice by servers that honour it (``attnprobe serve`` does). Batches travel as ``.npy`` bodies when the server
lists ``"npy"`` among its ``formats`` (``wire="auto"``), else as JSON; one keep-alive connection pool and one
thread pool serve every call, and :func:`oracle_from_http` hands a learner's whole batch to it so ``concurrency``
requests stay in flight until the batch is answered. Nothing about the remote model's precision is taken on trust:
it is read from the answers (``answer_precision = "auto"``, decided by
:func:`~attnprobe.oracles.base.answer_precision` like every oracle's).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

from attnprobe.errors import BudgetExceededError, ConfigError, OracleError
from attnprobe.oracles import npy_wire

KEY_ENV = "ATTNPROBE_API_KEY"
RETRY_STATUS = {429, 500, 502, 503, 504}
WIRE_FORMATS = ("auto", "npy", "json")
MAX_BACKOFF = 8.0
#: retries of the first request when nothing accepts the connection (no server at the address: a retry
#: schedule of seconds only delays saying so)
FIRST_CONTACT_RETRIES = 2


class RemoteRefusal(OracleError):
    """The server refused a request for good (401 or another 4xx that retrying cannot fix)."""


class HttpOracle:
    """Callable ``X (B, N, d) -> y (B,)`` or ``(B, K)`` answered by ``POST {url}/v1/query``.

    ``api_key`` defaults to the ``ATTNPROBE_API_KEY`` environment variable (none: requests go without one, for an
    endpoint without authentication; a 401 then asks for a key); it travels only as a Bearer token
    (a URL with ``user:password@`` is refused: credentials in URLs end up in logs and messages). ``max_batch``
    caps the sequences per request (the server's limit wins when smaller), ``concurrency`` the requests in
    flight, ``timeout`` each request's seconds, ``retries`` the attempts after the first one for a transient
    failure, ``wire`` the body format (``auto``: ``npy`` when the server offers it, else ``json``). When a call fails,
    the error's ``charged`` says how many of its sequences the server answered
    (and charged) before it failed. ``on_retry(message)`` hears of each retry before its wait (the CLI prints it
    on stderr); a first request that finds nothing listening is retried only :data:`FIRST_CONTACT_RETRIES` times.
    """

    #: a remote model's precision is read from its answers (:func:`~attnprobe.oracles.base.answer_precision`)
    answer_precision = "auto"

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 60.0, retries: int = 6,
                 concurrency: int = 4, max_batch: int | None = None, backoff: float = 0.25, wire: str = "auto",
                 on_retry=None):
        import httpx

        self.url = _checked_url(url)
        key = api_key or os.environ.get(KEY_ENV)
        self.keyed, self.on_retry, self._answered = bool(key), on_retry, False
        if key and (not (key.isascii() and key.isprintable()) or key != key.strip()):
            raise ConfigError("the API key must be printable ASCII without spaces at its ends (HTTP headers carry "
                              "nothing else); check --api-key or " + KEY_ENV, param="api_key")
        if not (_is_int(concurrency) and concurrency >= 1 and _is_int(retries) and retries >= 0):
            raise ConfigError(f"the concurrency must be an integer >= 1 and the retries >= 0; got {concurrency} "
                              f"and {retries}", param="concurrency")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ConfigError(f"the timeout must be a finite number of seconds > 0; got {timeout}", param="timeout")
        if wire not in WIRE_FORMATS:
            raise ConfigError(f"the wire format must be one of {', '.join(WIRE_FORMATS)}; got {wire!r}", param="wire")
        self.retries, self.backoff, self.concurrency = int(retries), float(backoff), int(concurrency)
        try:
            self._client = httpx.Client(base_url=self.url, timeout=timeout,
                                        headers={"Authorization": f"Bearer {key}"} if key else {},
                                        limits=httpx.Limits(max_connections=self.concurrency + 1,
                                                            max_keepalive_connections=self.concurrency + 1))
        except (httpx.InvalidURL, ValueError) as exc:
            raise ConfigError(f"the URL {self.url} is not usable ({exc}); give http://HOST:PORT", param="url") from None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.requests = self.retried = 0
        info = _json_object(self._request("GET", "/v1/info"), f"{self.url}/v1/info")
        self.d = _positive_int(info.get("d"), f"{self.url}/v1/info says the input width d is {info.get('d')!r}")
        server_batch = info.get("max_batch", 1024)
        server_batch = _positive_int(server_batch, f"{self.url}/v1/info says max_batch is {server_batch!r}")
        self.max_batch = min(server_batch, int(max_batch)) if max_batch else server_batch
        longest = info.get("max_length")
        self.max_length = None if longest is None else _positive_int(
            longest, f"{self.url}/v1/info says max_length is {longest!r}")
        self.server_name = str(info.get("name", ""))
        offered = info.get("formats")
        npy_offered = isinstance(offered, list) and "npy" in offered
        if wire == "npy" and not npy_offered:
            raise ConfigError(f"{self.url}/v1/info does not offer the npy wire format (formats: {offered!r}); "
                              "use the json wire format", param="wire")
        self.wire = "npy" if wire == "npy" or (wire == "auto" and npy_offered) else "json"
        self.__name__ = self.url

    @property
    def identity(self) -> str:
        """What the query log records for this API: its URL and its own account of the model (name, d)."""
        return f"url {self.url} name={self.server_name} d={self.d}"

    def usage(self) -> dict:
        """``GET /v1/usage``: this key's ``queries`` and ``budget`` on the server."""
        return _json_object(self._request("GET", "/v1/usage"), f"{self.url}/v1/usage")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._client.close()

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 3 or X.shape[2] != self.d:
            raise ConfigError(f"queries to {self.url} must have shape (B, N, {self.d}); got {X.shape}", param="X")
        if self.max_length is not None and X.shape[1] > self.max_length:
            exc = ConfigError(f"{self.url} answers sequences of at most {self.max_length} rows (/v1/info "
                              f"max_length); this run asks {X.shape[1]}: serve it with a larger --max-length "
                              f"(at least {X.shape[1]})", param="max_length")
            exc.charged = 0  # nothing was sent
            raise exc
        chunks = [X[i:i + self.max_batch] for i in range(0, X.shape[0], self.max_batch)]
        if len(chunks) <= 1 or self.concurrency == 1:
            parts = []
            for c in chunks:
                try:
                    parts.append(self._query(c))
                except Exception as exc:
                    exc.charged = sum(len(p) for p in parts)
                    raise
        else:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="attnprobe-http")
            futures = [self._pool.submit(self._query, c) for c in chunks]
            wait(futures)
            failed = [f.exception() for f in futures if f.exception() is not None]
            if failed:  # the other chunks were answered, and charged, all the same
                failed[0].charged = sum(len(f.result()) for f in futures if f.exception() is None)
                raise failed[0]
            parts = [f.result() for f in futures]
        if not parts:
            return np.zeros(0)
        if len({p.shape[1:] for p in parts}) > 1:
            raise OracleError(f"{self.url}/v1/query answered a different number of outputs per sequence for "
                              "two parts of one batch")
        return np.concatenate(parts)

    def _query(self, X: np.ndarray) -> np.ndarray:
        if self.wire == "npy":
            body = npy_wire.encode(X)
            headers = {"Content-Type": npy_wire.MEDIA_TYPE, "Accept": npy_wire.MEDIA_TYPE}
        else:
            body = json.dumps({"inputs": X.tolist()}).encode()
            headers = {"Content-Type": "application/json"}
        headers["Idempotency-Key"] = hashlib.sha256(body).hexdigest()[:40]
        r = self._request("POST", "/v1/query", content=body, headers=headers)
        if r.headers.get("content-type", "").split(";")[0].strip() == npy_wire.MEDIA_TYPE:
            try:
                return npy_wire.decode_answers(r.content, X.shape[0], X.shape[1])
            except npy_wire.WireError as exc:
                raise OracleError(f"{self.url}/v1/query {exc}; an attnprobe API answers one number (or K numbers) "
                                  "per sequence") from None
        out = _json_object(r, f"{self.url}/v1/query")
        try:
            y = np.asarray(out["outputs"], dtype=np.float64)
        except (KeyError, TypeError, ValueError, OverflowError):
            y = None
        rows = y is not None and y.ndim == 3 and y.shape[:2] == X.shape[:2] and y.shape[2] >= 1
        if not rows and (y is None or y.ndim not in (1, 2) or y.shape[0] != X.shape[0]
                         or (y.ndim == 2 and y.shape[1] < 1)):
            got = "no list of numbers under 'outputs'" if y is None else f"outputs of shape {y.shape}"
            raise OracleError(f"{self.url}/v1/query answered {got} for {X.shape[0]} sequences; an attnprobe API "
                              "answers one number (or K numbers) per sequence, or K numbers per position")
        return y

    def _request(self, method: str, path: str, **kw):
        """The response to ``method path`` (status < 400), after retries; refusals raised as typed errors."""
        import httpx

        last = ""
        for attempt in range(self.retries + 1):
            wait_s = min(MAX_BACKOFF, self.backoff * 2 ** attempt)
            try:
                r = self._client.request(method, path, **kw)
            except httpx.TransportError as exc:  # connection refused/reset, timeouts
                last = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, httpx.ConnectError) and not self._answered and attempt >= FIRST_CONTACT_RETRIES:
                    raise OracleError(f"nothing answers at {self.url} ({last}; {attempt + 1} tries): is the server "
                                      "running at that address?") from None
            except httpx.HTTPError as exc:  # e.g. an unusable URL
                raise ConfigError(f"cannot ask {self.url}{path}: {type(exc).__name__}: {exc}", param="url") from None
            else:
                with self._lock:
                    self.requests += 1
                    self._answered = True
                if r.status_code < 400:
                    return r
                detail = _detail(r)
                if r.status_code == 401 and not self.keyed:
                    raise RemoteRefusal(f"{self.url} requires an API key (401: {detail}); give --api-key KEY or set "
                                        f"{KEY_ENV}")
                if r.status_code == 401:
                    raise RemoteRefusal(f"{self.url} refused the API key (401: {detail}); check --api-key or "
                                        f"{KEY_ENV}")
                if r.status_code == 429 and "budget" in detail and "Retry-After" not in r.headers:
                    raise BudgetExceededError(f"{self.url} says this key's budget is spent ({detail})")
                if r.status_code not in RETRY_STATUS:
                    raise RemoteRefusal(f"{self.url}{path} refused the request ({r.status_code}: {detail})")
                last = f"{r.status_code}: {detail}"
                after = r.headers.get("Retry-After")
                if after:
                    try:
                        wait_s = min(MAX_BACKOFF * 4, max(wait_s, float(after)))
                    except ValueError:
                        pass
            if attempt < self.retries:
                with self._lock:
                    self.retried += 1
                if self.on_retry is not None:
                    self.on_retry(f"{self.url}{path}: {last}; retry {attempt + 1} of {self.retries} in {wait_s:.2g} s")
                time.sleep(wait_s)
        raise OracleError(f"{self.url}{path} failed {self.retries + 1} times (last: {last}); "
                          "the server is down, overloaded or out of budget")


def _checked_url(url: str) -> str:
    """``url`` without a trailing slash; refused (never echoed with its credentials) when unusable."""
    import httpx

    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError("the URL must start with http:// or https://", param="url")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ConfigError(f"the URL is not usable ({exc}); give http://HOST:PORT", param="url") from None
    if parsed.userinfo:
        raise ConfigError("the URL carries a user name or password; give the key with --api-key or "
                          f"{KEY_ENV} (it is sent as a Bearer token), not in the URL", param="url")
    if not parsed.host:
        raise ConfigError("the URL names no host; give http://HOST:PORT", param="url")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise ConfigError(f"the URL's port {parsed.port} is not between 1 and 65535", param="url")
    return url.rstrip("/")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _positive_int(value, what: str) -> int:
    if not (_is_int(value) and value >= 1):
        raise OracleError(f"{what}; an attnprobe API reports a positive integer (is this an attnprobe API?)")
    return int(value)


def _json_object(r, where: str) -> dict:
    try:
        out = r.json()
    except ValueError:
        out = None
    if not isinstance(out, dict):
        kind = r.headers.get("content-type", "unknown content")
        raise OracleError(f"{where} answered {kind.split(';')[0]} that is not a JSON object; is this an attnprobe "
                          "API?")
    return out


def _detail(r) -> str:
    try:
        detail = r.json().get("detail", "")
    except ValueError:
        detail = r.text[:200]
    if isinstance(detail, list):  # FastAPI validation errors
        detail = "; ".join(str(e.get("msg", e)) for e in detail[:3])
    return str(detail)


def oracle_from_http(fn: HttpOracle, d: int | None = None, **kwargs):
    """An :class:`~attnprobe.oracles.base.Oracle` asking the API behind ``fn`` (``d`` checked against
    ``/v1/info``); ``kwargs`` go to the Oracle (``log``, ``budget``, ...)."""
    from attnprobe.oracles.base import Oracle

    if d is not None and int(d) != fn.d:
        raise ConfigError(f"--d {d} does not match the width d = {fn.d} that {fn.url}/v1/info reports", param="d")
    # the learner's whole batch goes to fn at once, which keeps ``concurrency`` requests in flight through it
    kwargs.setdefault("max_batch", max(65536, fn.max_batch * fn.concurrency))
    return Oracle(fn, fn.d, name=fn.url, **kwargs)


def oracle_from_url(url: str, api_key: str | None = None, d: int | None = None, *, timeout: float = 60.0,
                    retries: int = 6, concurrency: int = 4, wire: str = "auto", **kwargs):
    """An :class:`~attnprobe.oracles.base.Oracle` asking the API at ``url`` (``d`` read from ``/v1/info``)."""
    fn = HttpOracle(url, api_key, timeout=timeout, retries=retries, concurrency=concurrency, wire=wire)
    return oracle_from_http(fn, d, **kwargs)
