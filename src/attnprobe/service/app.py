"""FastAPI app serving one oracle callable (docs/architecture.md, "Served API").

``POST /v1/query {"inputs": [B sequences × N rows × d numbers]}`` with ``Authorization: Bearer KEY`` →
``{"outputs": [B numbers]}`` (``B × K`` numbers for a model with K outputs, ``B × N × K`` for a model answering
every position: ``/v1/info`` says ``every_position``); ``GET /v1/info`` (``d``, limits),
``GET /v1/usage`` (the calling key's
``queries`` and ``budget``), ``GET /healthz`` (no key). Bad input gets a 4xx and never reaches the model:
401 without or with a wrong key, 413 for a batch, sequence or body above the limits, 422 for anything
malformed (bad JSON, strings, NaN, ±Infinity, numbers that overflow, empty or ragged sequences, wrong width),
429 over budget or rate. A request carrying an ``Idempotency-Key`` header that the key already used is
answered again from a small cache without a second charge (so a client that retries, or resumes after a
crash, never pays twice for the batch that was in flight).

Bodies are JSON by default; ``Content-Type: application/x-npy`` sends the batch as a ``.npy`` array (little-endian
float64 of shape (B, N, d), read without pickle, header checked before the data) and ``Accept: application/x-npy``
asks for the answers as one (``/v1/info`` lists ``"formats": ["json", "npy"]``). The limits, keys, budgets and
idempotency are the same for both.

The body is read as it arrives: a body past the limit gets 413 whether or not it announced its length
(``Transfer-Encoding: chunked``), a body not complete within ``body_timeout`` seconds gets 408, and a client that
disconnects mid-body costs one log line. A model that fails on a batch gets 500 with one log line, the charge
given back.
"""


import asyncio
import logging
import threading
import zlib
from dataclasses import MISSING, dataclass, fields
from typing import Annotated, Callable

import numpy as np
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError, create_model
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from attnprobe.errors import ConfigError
from attnprobe.oracles import npy_wire
from attnprobe.service.keys import KeyStore, Refused

API_VERSION = "1"
LOG = logging.getLogger("attnprobe.service")

Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Row = Annotated[list[Number], Field(min_length=1, description="one token: d numbers")]
Sequence = Annotated[list[Row], Field(min_length=1, description="N rows of the same width d")]


class QueryRequest(BaseModel):
    inputs: Annotated[list[Sequence], Field(min_length=1, description="B sequences, all of the same length N")]


class QueryResponse(BaseModel):
    outputs: list[float] | list[list[float]] | list[list[list[float]]]


class UsageResponse(BaseModel):
    queries: int
    budget: int | None
    replayed: int = 0


class Health(BaseModel):
    status: str = "ok"


QUERY_BODY = {"required": True, "content": {
    "application/json": {"schema": QueryRequest.model_json_schema()},
    npy_wire.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary",
                                     "description": ".npy array, little-endian float64, shape (B, N, d)"}}}}


@dataclass(frozen=True)
class ServiceOptions:
    """Limits of the served API. ``max_body_bytes`` defaults to what ``max_batch`` sequences of
    ``max_length`` rows need at 32 bytes a number (JSON text), with room for whitespace. ``body_timeout``: seconds
    a request body may take to arrive. ``outputs``: K answers per sequence (None: one, answered as ``(B,)``).
    ``every_position``: the model answers the output row at every position, ``(B, N, K)``."""

    d: int
    max_batch: int = 1024
    max_length: int = 512
    max_body_bytes: int | None = None
    name: str = "attnprobe"
    body_timeout: float = 30.0
    outputs: int | None = None
    every_position: bool = False

    def __post_init__(self) -> None:
        for field in ("d", "max_batch", "max_length"):
            if int(getattr(self, field)) < 1:
                raise ConfigError(f"{field} must be at least 1; got {getattr(self, field)}", param=field)
        if not self.body_timeout > 0:
            raise ConfigError(f"body_timeout must be > 0 seconds; got {self.body_timeout}", param="body_timeout")

    @property
    def body_limit(self) -> int:
        if self.max_body_bytes is not None:
            return int(self.max_body_bytes)
        return 64 * 1024 + 32 * self.max_batch * min(self.max_length, 64) * self.d


#: the :class:`ServiceOptions` fields ``GET /v1/info`` publishes; the response model takes their types and defaults
PUBLISHED = ("d", "max_batch", "max_length", "name", "outputs", "every_position")

InfoResponse = create_model(
    "InfoResponse", __doc__="What ``GET /v1/info`` answers: the published service options, the API version, the "
                            "calling key's rate limit and the body formats.",
    **{f.name: (f.type, ... if f.default is MISSING else f.default)
       for f in fields(ServiceOptions) if f.name in PUBLISHED},
    api_version=(str, API_VERSION), rate=(float | None, None), formats=(list[str], ["json", "npy"]))


class AnnouncedLengthLimit:
    """ASGI middleware: a request announcing a ``Content-Length`` above ``limit`` gets 413 (400 when it is not a
    number) before the app reads a byte of it. Plain ASGI, so the body's chunks pass through untouched."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, int(limit)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            size = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"content-length"), None)
            refusal = None
            if size is not None and not (size.strip().isascii() and size.strip().isdigit()):
                refusal = JSONResponse({"detail": "Content-Length is not a number"}, status_code=400)
            elif size is not None and int(size) > self.limit:
                refusal = JSONResponse({"detail": f"request body of {size} bytes is above the limit of {self.limit}; "
                                                  "send smaller batches"}, status_code=413)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _problem(status: int, message: str, headers: dict | None = None) -> HTTPException:
    return HTTPException(status_code=status, detail=message, headers=headers)


def build_app(fn: Callable[[np.ndarray], np.ndarray], options: ServiceOptions, keys: KeyStore) -> FastAPI:
    """The app answering ``fn(X) -> y`` (X of shape (B, N, d)) under ``options`` for the keys in ``keys``."""
    app = FastAPI(title="attnprobe prediction API", version=API_VERSION,
                  description="A black-box attention model: send sequences, get one number per sequence.")
    model_lock = threading.Lock()
    d = int(options.d)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        # the offending input is not echoed back: it may be NaN/Infinity (not JSON) or megabytes long
        errors = [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type"))}
                  for e in exc.errors()[:10]]
        return JSONResponse({"detail": errors}, status_code=422)

    app.add_middleware(AnnouncedLengthLimit, limit=options.body_limit)

    def caller(authorization: Annotated[str | None, Header()] = None) -> bytes:
        scheme, _, token = (authorization or "").partition(" ")
        kh = keys.identify(token.strip()) if scheme.lower() == "bearer" else None
        if kh is None:
            raise _problem(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                           {"WWW-Authenticate": "Bearer"})
        return kh

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        return Health()

    @app.get("/v1/info", response_model=InfoResponse, responses={401: {"description": "missing or wrong key"}})
    def info(kh: Annotated[bytes, Depends(caller)]) -> InfoResponse:
        return InfoResponse(**{f: getattr(options, f) for f in PUBLISHED}, rate=keys.rate)

    @app.get("/v1/usage", response_model=UsageResponse, responses={401: {"description": "missing or wrong key"}})
    def usage(kh: Annotated[bytes, Depends(caller)]) -> UsageResponse:
        u = keys.usage(kh)
        return UsageResponse(queries=u.queries, budget=keys.budget, replayed=u.replayed)

    async def read_body(request: Request) -> list[bytes]:
        """The body's chunks, counted as they arrive (413 past the limit) and timed (408 past ``body_timeout``);
        memory follows what was sent, not what was announced."""
        chunks, size = [], 0
        try:
            async with asyncio.timeout(options.body_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > options.body_limit:
                        raise _problem(413, f"request body above the limit of {options.body_limit} bytes; send "
                                            "smaller batches")
                    chunks.append(chunk)
        except TimeoutError:
            LOG.warning("request body from %s not complete after %g s: answered 408", _client(request),
                        options.body_timeout)
            raise _problem(408, f"the request body did not arrive within {options.body_timeout:g} s",
                           {"Connection": "close"}) from None
        return chunks

    @app.post("/v1/query", response_model=QueryResponse, openapi_extra={"requestBody": QUERY_BODY},
              responses={401: {"description": "missing or wrong key"}, 408: {"description": "body too slow"},
                         413: {"description": "batch too big"}, 429: {"description": "over budget or rate"}})
    async def query(request: Request, kh: Annotated[bytes, Depends(caller)],
                    idempotency_key: Annotated[str | None, Header(max_length=128)] = None) -> QueryResponse:
        try:
            chunks = await read_body(request)
        except ClientDisconnect:
            LOG.info("client %s disconnected before its request body was complete", _client(request))
            return Response(status_code=400)
        npy_out = npy_wire.MEDIA_TYPE in request.headers.get("accept", "")
        if request.headers.get("content-type", "").split(";")[0].strip().lower() == npy_wire.MEDIA_TYPE:
            try:
                X = npy_wire.decode_queries(npy_wire.joined(chunks), d, options.max_batch, options.max_length)
            except npy_wire.WireError as exc:
                raise _problem(413 if exc.too_large else 422, str(exc)) from None
            return await run_in_threadpool(answer_array, X, kh, idempotency_key, npy_out)
        # the body is parsed by pydantic's own JSON parser (several times faster than json.loads + validation);
        # NaN, ±Infinity and numbers that overflow to infinity are refused there like any malformed input
        try:
            body = QueryRequest.model_validate_json(b"".join(chunks))
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        return await run_in_threadpool(answer, body, kh, idempotency_key, npy_out)

    def answer(body: QueryRequest, kh: bytes, idempotency_key: str | None, npy_out: bool = False):
        B = len(body.inputs)
        if B > options.max_batch:
            raise _problem(413, f"a batch of {B} sequences is above the limit of {options.max_batch}")
        N = len(body.inputs[0])
        if N > options.max_length:
            raise _problem(413, f"sequences of {N} rows are above the limit of {options.max_length}")
        for i, seq in enumerate(body.inputs):
            if len(seq) != N:
                raise _problem(422, f"sequence {i} has {len(seq)} rows but sequence 0 has {N}; all sequences of "
                                    "a batch must have the same length")
            for j, row in enumerate(seq):
                if len(row) != d:
                    raise _problem(422, f"row {j} of sequence {i} has {len(row)} numbers; every row needs d = {d}")
        return answer_array(np.asarray(body.inputs, dtype=np.float64), kh, idempotency_key, npy_out)

    def answer_array(X: np.ndarray, kh: bytes, idempotency_key: str | None, npy_out: bool):
        """Charge, ask the model and answer (as JSON, or as ``.npy`` when ``npy_out``) for a checked batch X."""
        B, N = X.shape[:2]
        idem = None
        if idempotency_key:
            # the cached answer is reused only for a batch of the same shape and CRC-32 under the same key (the
            # key is the client's promise of the same batch; the check catches a client that breaks it, at a
            # third of a cryptographic hash's cost; the cache is per API key, so nobody else is affected)
            idem = f"{idempotency_key}:{zlib.crc32(np.ascontiguousarray(X)):08x}:{B}x{N}"
        hit = keys.cached(kh, idem)
        if hit is not None:
            return _answered(hit, npy_out)
        try:
            keys.charge(kh, B)
        except Refused as exc:
            headers = {"Retry-After": f"{max(1, int(np.ceil(exc.retry_after)))}"} if exc.retry_after else None
            raise _problem(429, str(exc), headers) from exc
        try:
            with model_lock, np.errstate(all="ignore"):
                y = np.asarray(fn(X), dtype=np.float64)
            k = options.outputs
            if options.every_position:
                if not (y.ndim == 3 and y.shape[:2] == (B, N) and k in (None, y.shape[2])):
                    raise ValueError(f"answered shape {y.shape} for {B} sequences of {N} rows (every position)")
            else:
                if y.shape == (B, 1) and k in (None, 1):
                    y = y.reshape(B)
                if not (y.shape == (B,) and k in (None, 1)
                        or y.ndim == 2 and y.shape[0] == B and k in (None, y.shape[1])):
                    raise ValueError(f"answered shape {y.shape} for {B} sequences")
        except Exception as exc:
            keys.refund(kh, B)
            LOG.error("the model failed on a batch of shape %s: %s: %s", X.shape, type(exc).__name__, exc)
            raise _problem(500, "the model failed on this batch (the server's log says why); it was not "
                                "charged") from None
        if not np.all(np.isfinite(y)):
            keys.refund(kh, B)
            raise _problem(422, "the model's answer is not finite for this input (its numbers are too large for "
                                "the model's precision); send smaller numbers")
        keys.remember(kh, idem, y)
        return _answered(y, npy_out)

    return app


def _answered(y, npy_out: bool):
    """The answers ``y`` (an array, or the lists a cache kept) as the client asked for them."""
    if npy_out:
        return Response(npy_wire.encode(np.asarray(y, dtype=np.float64)), media_type=npy_wire.MEDIA_TYPE)
    return QueryResponse(outputs=y.tolist() if isinstance(y, np.ndarray) else y)


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "unknown"
