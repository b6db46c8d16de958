"""API keys: stored only as SHA-256 hashes, compared in constant time; per-key usage, budget and rate."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from attnprobe.errors import ConfigError

#: idempotent requests remembered per key (a retried or resumed batch is answered again without a charge)
IDEMPOTENCY_CACHE = 256


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass
class KeyUsage:
    """What one key has spent: ``queries`` charged, ``replayed`` answered again from the idempotency cache."""

    queries: int = 0
    replayed: int = 0
    tokens: float = 0.0
    stamp: float = field(default_factory=time.monotonic)
    answers: OrderedDict = field(default_factory=OrderedDict)


class Refused(Exception):
    """A request the key may not make now: ``status`` 429 (budget or rate), with a ``retry_after`` in s."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class KeyStore:
    """The server's keys (hashed), each with a query budget and a token-bucket rate limit.

    ``rate`` is in queries (sequences) per second; the bucket holds ``burst`` queries (at least the largest
    allowed batch, so every legal request can pass once the bucket is full).
    """

    def __init__(self, keys, *, budget: int | None = None, rate: float | None = None, burst: float = 0.0):
        keys = [k for k in keys if k]
        if not keys:
            raise ConfigError("the server needs at least one API key (--api-key KEY or --api-key-file F)", param="keys")
        if budget is not None and budget < 0:
            raise ConfigError(f"the budget must be >= 0; got {budget}", param="budget")
        if rate is not None and not rate > 0:
            raise ConfigError(f"the rate must be > 0 queries per second; got {rate}", param="rate")
        self._hashes = [key_hash(k) for k in keys]
        self.budget = budget
        self.rate = rate
        self.burst = max(float(burst), float(rate or 0.0))
        self._usage = {h: KeyUsage(tokens=self.burst) for h in self._hashes}
        self._lock = threading.Lock()

    def identify(self, presented: str | None) -> bytes | None:
        """The stored hash matching ``presented``; every stored hash is compared (constant time)."""
        if not presented:
            return None
        h = key_hash(presented)
        found = None
        for stored in self._hashes:
            if hmac.compare_digest(stored, h):
                found = stored
        return found

    def usage(self, kh: bytes) -> KeyUsage:
        return self._usage[kh]

    def cached(self, kh: bytes, idem: str | None):
        """Answers of an earlier request with the same idempotency key (counted as replayed), else None."""
        if not idem:
            return None
        with self._lock:
            u = self._usage[kh]
            hit = u.answers.get(idem)
            if hit is not None:
                u.answers.move_to_end(idem)
                u.replayed += len(hit)
            return hit

    def remember(self, kh: bytes, idem: str | None, outputs: list) -> None:
        if not idem:
            return
        with self._lock:
            u = self._usage[kh]
            u.answers[idem] = outputs
            while len(u.answers) > IDEMPOTENCY_CACHE:
                u.answers.popitem(last=False)

    def charge(self, kh: bytes, n: int) -> None:
        """Charge ``n`` queries to the key, or raise :class:`Refused` (budget or rate) and charge nothing."""
        with self._lock:
            u = self._usage[kh]
            if self.budget is not None and u.queries + n > self.budget:
                raise Refused(f"over budget: this key has used {u.queries} of {self.budget} queries and the "
                              f"request asks for {n} more")
            if self.rate is not None:
                now = time.monotonic()
                u.tokens = min(self.burst, u.tokens + (now - u.stamp) * self.rate)
                u.stamp = now
                if n > u.tokens:
                    wait = (n - u.tokens) / self.rate
                    raise Refused(f"rate limit: {self.rate:g} queries per second; retry in {wait:.2f} s", wait)
                u.tokens -= n
            u.queries += n

    def refund(self, kh: bytes, n: int) -> None:
        """Give back a charge for a request the server could not answer (its own failure)."""
        with self._lock:
            self._usage[kh].queries -= n
