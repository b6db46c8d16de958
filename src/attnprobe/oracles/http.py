"""The HTTP oracle: a served prediction API (docs/architecture.md, "Served API") as an oracle callable, on httpx.

Batches are split to the server's ``max_batch`` (read from ``GET /v1/info`` with ``d``) and sent with bounded
concurrency; 429, 5xx and connection errors are retried with exponential backoff (honouring ``Retry-After``);
401 and other 4xx end the call with one clear :class:`OracleError`. Every request carries an
``Idempotency-Key`` derived from its contents, so a retried batch (or one resent after a crash) is not charged
twice by servers that honour it (``attnprobe serve`` does).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from attnprobe.errors import BudgetExceededError, ConfigError, OracleError

KEY_ENV = "ATTNPROBE_API_KEY"
RETRY_STATUS = {429, 500, 502, 503, 504}
MAX_BACKOFF = 8.0


class RemoteRefusal(OracleError):
    """The server refused a request for good (401 or another 4xx that retrying cannot fix)."""


class HttpOracle:
    """Callable ``X (B, N, d) -> y (B,)`` answered by ``POST {url}/v1/query``.

    ``api_key`` defaults to the ``ATTNPROBE_API_KEY`` environment variable. ``max_batch`` caps the sequences
    per request (the server's limit wins when smaller), ``concurrency`` the requests in flight, ``timeout`` each
    request's seconds, ``retries`` the attempts after the first one for a transient failure.
    """

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 60.0, retries: int = 6,
                 concurrency: int = 4, max_batch: int | None = None, backoff: float = 0.25):
        import httpx

        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"the URL must start with http:// or https://; got {url!r}")
        key = api_key or os.environ.get(KEY_ENV)
        if not key:
            raise ConfigError(f"the API needs a key: give --api-key KEY or set {KEY_ENV}")
        if concurrency < 1 or retries < 0 or not timeout > 0:
            raise ConfigError("concurrency must be >= 1, retries >= 0 and the timeout > 0 seconds")
        self.url = url.rstrip("/")
        self.retries, self.backoff, self.concurrency = int(retries), float(backoff), int(concurrency)
        self._client = httpx.Client(base_url=self.url, timeout=timeout,
                                    headers={"Authorization": f"Bearer {key}"},
                                    limits=httpx.Limits(max_connections=self.concurrency + 1))
        self._lock = threading.Lock()
        self.requests = self.retried = 0
        info = self._request("GET", "/v1/info")
        try:
            self.d = int(info["d"])
            server_batch = int(info.get("max_batch") or 1024)
        except (KeyError, TypeError, ValueError) as exc:
            raise OracleError(f"{self.url}/v1/info did not say the input width d; is this an attnprobe API?") from exc
        self.max_batch = min(server_batch, int(max_batch)) if max_batch else server_batch
        self.server_name = str(info.get("name", ""))
        self.__name__ = self.url

    @property
    def identity(self) -> str:
        """What the query log records to refuse mixing answers of two different APIs."""
        return f"url={self.url} name={self.server_name} d={self.d}"

    def usage(self) -> dict:
        """``GET /v1/usage``: this key's ``queries`` and ``budget`` on the server."""
        return self._request("GET", "/v1/usage")

    def close(self) -> None:
        self._client.close()

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 3 or X.shape[2] != self.d:
            raise ConfigError(f"queries to {self.url} must have shape (B, N, {self.d}); got {X.shape}")
        chunks = [X[i:i + self.max_batch] for i in range(0, X.shape[0], self.max_batch)]
        if len(chunks) <= 1 or self.concurrency == 1:
            parts = [self._query(c) for c in chunks]
        else:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(chunks))) as pool:
                parts = list(pool.map(self._query, chunks))
        return np.concatenate(parts) if parts else np.zeros(0)

    def _query(self, X: np.ndarray) -> np.ndarray:
        body = json.dumps({"inputs": X.tolist()}).encode()
        idem = hashlib.sha256(body).hexdigest()[:40]
        out = self._request("POST", "/v1/query", content=body,
                            headers={"Content-Type": "application/json", "Idempotency-Key": idem})
        try:
            y = np.asarray(out["outputs"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as exc:
            raise OracleError(f"{self.url}/v1/query answered without a list of numbers under 'outputs'") from exc
        if y.shape != (X.shape[0],):
            raise OracleError(f"{self.url}/v1/query answered {y.size} numbers for {X.shape[0]} sequences")
        return y

    def _request(self, method: str, path: str, **kw) -> dict:
        import httpx

        last = ""
        for attempt in range(self.retries + 1):
            wait = min(MAX_BACKOFF, self.backoff * 2 ** attempt)
            try:
                r = self._client.request(method, path, **kw)
            except httpx.TransportError as exc:  # connection refused/reset, timeouts
                last = f"{type(exc).__name__}: {exc}"
            else:
                with self._lock:
                    self.requests += 1
                if r.status_code < 400:
                    return r.json()
                detail = _detail(r)
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
                        wait = min(MAX_BACKOFF * 4, max(wait, float(after)))
                    except ValueError:
                        pass
            if attempt < self.retries:
                with self._lock:
                    self.retried += 1
                time.sleep(wait)
        raise OracleError(f"{self.url}{path} failed {self.retries + 1} times (last: {last}); "
                          "the server is down, overloaded or out of budget")


def _detail(r) -> str:
    try:
        detail = r.json().get("detail", "")
    except ValueError:
        detail = r.text[:200]
    if isinstance(detail, list):  # FastAPI validation errors
        detail = "; ".join(str(e.get("msg", e)) for e in detail[:3])
    return str(detail)


def oracle_from_url(url: str, api_key: str | None = None, d: int | None = None, *, timeout: float = 60.0,
                    retries: int = 6, concurrency: int = 4, **kwargs):
    """An :class:`~attnprobe.oracles.base.Oracle` asking the API at ``url`` (``d`` read from ``/v1/info``)."""
    from attnprobe.oracles.base import Oracle

    fn = HttpOracle(url, api_key, timeout=timeout, retries=retries, concurrency=concurrency)
    if d is not None and int(d) != fn.d:
        raise ConfigError(f"--d {d} does not match the width d = {fn.d} that {url}/v1/info reports")
    kwargs.setdefault("max_batch", fn.max_batch * fn.concurrency)
    kwargs.setdefault("precision", "auto")  # a remote model's precision is read from its answers
    return Oracle(fn, fn.d, name=fn.url, **kwargs)
