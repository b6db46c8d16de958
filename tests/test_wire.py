"""The binary (.npy) wire format of the served API, on a real uvicorn server (127.0.0.1, free port)."""

import io
import json

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from attnprobe.errors import ConfigError, OracleError  # noqa: E402
from attnprobe.learners import extract_exact  # noqa: E402
from attnprobe.oracles import Oracle, npy_wire  # noqa: E402
from attnprobe.oracles.http import HttpOracle, oracle_from_url  # noqa: E402
from attnprobe.service import KeyStore, ServiceOptions, build_app  # noqa: E402
from attnprobe.service.server import BackgroundServer  # noqa: E402
from attnprobe.targets.random_heads import random_head  # noqa: E402

D = 4
KEY = "wire-key"
NPY = {"Authorization": f"Bearer {KEY}", "Content-Type": npy_wire.MEDIA_TYPE, "Accept": npy_wire.MEDIA_TYPE}


@pytest.fixture(scope="module")
def served():
    head = random_head(D, seed=7)
    app = build_app(head, ServiceOptions(d=D, max_batch=16, max_length=8), KeyStore([KEY], budget=10_000))
    with BackgroundServer(app) as srv:
        yield srv, head


def usage(srv) -> int:
    return httpx.get(srv.url + "/v1/usage", headers={"Authorization": f"Bearer {KEY}"}).json()["queries"]


def npy_bytes(a, **kw) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, **kw)
    return buf.getvalue()


def with_header(header: dict, data: bytes = b"") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + data


def test_info_advertises_both_formats_and_json_stays_the_default(served):
    srv, head = served
    info = httpx.get(srv.url + "/v1/info", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert info["formats"] == ["json", "npy"]
    X = np.random.default_rng(0).standard_normal((3, 2, D))
    r = httpx.post(srv.url + "/v1/query", json={"inputs": X.tolist()}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.headers["content-type"].startswith("application/json")
    assert np.array_equal(r.json()["outputs"], head(X))


@pytest.mark.parametrize("accept", [npy_wire.MEDIA_TYPE, "application/json"])
def test_npy_request_answers_are_the_models_answers_bit_for_bit(served, accept):
    srv, head = served
    X = np.random.default_rng(1).standard_normal((5, 3, D)) * 10.0 ** np.arange(-3, 2)[:, None, None]
    r = httpx.post(srv.url + "/v1/query", content=npy_wire.encode(X), headers={**NPY, "Accept": accept})
    assert r.status_code == 200, r.text
    y = np.load(io.BytesIO(r.content), allow_pickle=False) if accept == npy_wire.MEDIA_TYPE else \
        np.array(r.json()["outputs"])
    assert y.dtype == np.float64 and np.array_equal(y, head(X))


def test_json_request_can_ask_for_an_npy_answer(served):
    srv, head = served
    X = np.random.default_rng(2).standard_normal((2, 2, D))
    r = httpx.post(srv.url + "/v1/query", json={"inputs": X.tolist()}, headers={k: v for k, v in NPY.items()
                                                                                  if k != "Content-Type"})
    assert r.headers["content-type"] == npy_wire.MEDIA_TYPE
    assert np.array_equal(npy_wire.decode_answers(r.content, 2), head(X))


X_OK = np.zeros((2, 2, D))
HOSTILE = {
    "float32": (npy_bytes(X_OK.astype(np.float32)), {422}),
    "big-endian float64": (npy_bytes(X_OK.astype(">f8")), {422}),
    "int64": (npy_bytes(X_OK.astype(np.int64)), {422}),
    "object array": (npy_bytes(np.array([[[1.0] * D]], dtype=object), allow_pickle=True), {422}),
    "structured dtype": (npy_bytes(np.zeros((1, 1, D), dtype=[("a", "<f8")])), {422}),
    "fortran order": (npy_bytes(np.asfortranarray(np.ones((2, 3, D)))), {422}),
    "huge shape header": (with_header({"descr": "<f8", "fortran_order": False, "shape": (1 << 40, 1 << 40, D)}),
                          {413}),
    "huge length, batch 1": (with_header({"descr": "<f8", "fortran_order": False, "shape": (1, 1 << 62, D)}), {413}),
    "huge width": (with_header({"descr": "<f8", "fortran_order": False, "shape": (1, 1, 1 << 62)}), {422}),
    "negative shape": (with_header({"descr": "<f8", "fortran_order": False, "shape": (-1, 2, D)}), {422}),
    "truncated data": (npy_wire.encode(np.ones((2, 2, D)))[:-8], {422}),
    "trailing bytes": (npy_wire.encode(np.ones((2, 2, D))) + b"\0" * 8, {422}),
    "header only": (with_header({"descr": "<f8", "fortran_order": False, "shape": (2, 2, D)}), {422}),
    "truncated header": (npy_wire.encode(np.ones((2, 2, D)))[:20], {422}),
    "not npy at all": (b"hello world, this is not an array", {422}),
    "empty body": (b"", {422}),
    "header is code": (b"\x93NUMPY\x01\x00" + (b"__import__('os').system('true')" + b" " * 33 + b"\n"), {422}),
    "wrong ndim": (npy_wire.encode(np.ones((2, D))), {422}),
    "wrong width": (npy_wire.encode(np.ones((2, 2, D + 1))), {422}),
    "empty batch": (npy_wire.encode(np.ones((0, 2, D))), {422}),
    "empty sequence": (npy_wire.encode(np.ones((2, 0, D))), {422}),
    "batch above max": (npy_wire.encode(np.ones((17, 2, D))), {413}),
    "sequence above max length": (npy_wire.encode(np.ones((1, 9, D))), {413}),
    "NaN": (npy_wire.encode(np.full((1, 2, D), np.nan)), {422}),
    "infinity": (npy_wire.encode(np.full((1, 2, D), -np.inf)), {422}),
    "answer overflows": (npy_wire.encode(np.full((1, 2, D), 1e300)), {422}),
    "body too large": (b"\x93NUMPY" + b" " * 10_000_000, {413}),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_malformed_npy_bodies_get_4xx_uncharged_and_the_server_stays_up(served, case):
    srv, _ = served
    body, expected = HOSTILE[case]
    before = usage(srv)
    r = httpx.post(srv.url + "/v1/query", content=body, headers=NPY, timeout=20)
    assert r.status_code in expected, (case, r.status_code, r.text[:300])
    assert isinstance(r.json()["detail"], (str, list))
    assert usage(srv) == before
    assert httpx.get(srv.url + "/healthz").status_code == 200


def test_chunked_npy_body_past_the_limit_gets_413(served):
    srv, _ = served

    def chunks():
        yield npy_wire.encode(np.ones((16, 8, D)))[:128]
        for _ in range(200):
            yield b"\0" * 65536

    r = httpx.post(srv.url + "/v1/query", content=chunks(), headers=NPY, timeout=20)
    assert r.status_code == 413


def test_idempotent_npy_resend_is_not_charged_twice(served):
    srv, head = served
    X = np.random.default_rng(3).standard_normal((4, 2, D))
    h = {**NPY, "Idempotency-Key": "npy-resend"}
    before = usage(srv)
    r1 = httpx.post(srv.url + "/v1/query", content=npy_wire.encode(X), headers=h)
    r2 = httpx.post(srv.url + "/v1/query", content=npy_wire.encode(X), headers=h)
    assert r1.content == r2.content and np.array_equal(npy_wire.decode_answers(r2.content, 4), head(X))
    assert usage(srv) == before + 4


def test_budget_holds_over_npy():
    head = random_head(D, seed=1)
    app = build_app(head, ServiceOptions(d=D, max_batch=8), KeyStore(["k"], budget=10))
    with BackgroundServer(app) as srv:
        h = {**NPY, "Authorization": "Bearer k"}
        assert httpx.post(srv.url + "/v1/query", content=npy_wire.encode(np.ones((8, 2, D))), headers=h).is_success
        r = httpx.post(srv.url + "/v1/query", content=npy_wire.encode(np.ones((3, 2, D))), headers=h)
        assert r.status_code == 429
        assert httpx.post(srv.url + "/v1/query", content=npy_wire.encode(np.ones((3, 2, D))),
                          headers={**h, "Authorization": "Bearer nope"}).status_code == 401


def test_vector_answers_travel_as_npy():
    W = np.random.default_rng(4).standard_normal((D, 3))

    def fn(X):
        return X[:, -1, :] @ W

    app = build_app(fn, ServiceOptions(d=D, max_batch=4, outputs=3), KeyStore(["k"]))
    with BackgroundServer(app) as srv:
        client = HttpOracle(srv.url, "k", concurrency=2)
        assert client.wire == "npy"
        X = np.random.default_rng(5).standard_normal((10, 2, D))
        assert np.array_equal(client(X), fn(X))
        client.close()


def test_http_extraction_over_npy_equals_in_process_bit_for_bit():
    head = random_head(6, seed=11)
    app = build_app(head, ServiceOptions(d=6, max_batch=8), KeyStore(["k"]))
    with BackgroundServer(app) as srv:
        remote = oracle_from_url(srv.url, "k", concurrency=3, wire="npy")
        local = Oracle(head, 6)
        over_npy, in_process = extract_exact(remote, seed=5), extract_exact(local, seed=5)
        assert remote.fn.wire == "npy" and over_npy.check.passed
        got, want = over_npy.model.arrays(), in_process.model.arrays()
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
        assert remote.queries == local.queries == remote.fn.usage()["queries"] > 0
        assert remote.fn.requests >= -(-remote.queries // 8)  # split to the server's max batch


def test_client_falls_back_to_json_for_a_server_without_npy(served):
    srv, head = served

    # a server that does not list npy: the client's "auto" sends JSON and "npy" is refused up front
    from fastapi import FastAPI

    old = FastAPI()

    @old.get("/v1/info")
    def info():
        return {"d": D, "max_batch": 4, "name": "old"}

    @old.post("/v1/query")
    async def query(request: dict):
        X = np.asarray(request["inputs"], dtype=np.float64)
        return {"outputs": head(X).tolist()}

    with BackgroundServer(old) as old_srv:
        fn = HttpOracle(old_srv.url, KEY)
        assert fn.wire == "json"
        X = np.random.default_rng(6).standard_normal((6, 2, D))
        assert np.array_equal(fn(X), head(X))
        with pytest.raises(ConfigError, match="npy"):
            HttpOracle(old_srv.url, KEY, wire="npy")
    with pytest.raises(ConfigError, match="wire format"):
        HttpOracle(srv.url, KEY, wire="xml")


def test_client_refuses_a_malformed_npy_answer():
    from fastapi import FastAPI
    from starlette.responses import Response

    bad = FastAPI()

    @bad.get("/v1/info")
    def info():
        return {"d": D, "max_batch": 4, "formats": ["json", "npy"]}

    @bad.post("/v1/query")
    def query():
        return Response(npy_wire.encode(np.ones(3)), media_type=npy_wire.MEDIA_TYPE)  # 3 answers for 2 sequences

    with BackgroundServer(bad) as srv:
        fn = HttpOracle(srv.url, KEY, retries=0)
        with pytest.raises(OracleError, match="shape"):
            fn(np.zeros((2, 2, D)))


def test_codec_round_trips_and_reads_no_pickle():
    X = np.random.default_rng(7).standard_normal((3, 2, D))
    assert np.array_equal(npy_wire.decode_queries(npy_wire.encode(X), D, 3, 2), X)
    assert json.loads(json.dumps(X.tolist())) == X.tolist()
    with pytest.raises(npy_wire.WireError, match="dtype"):
        npy_wire.decode_queries(npy_bytes(np.array([[[None] * D]], dtype=object), allow_pickle=True), D, 3, 2)


def test_a_served_float32_model_is_read_as_float32_like_the_same_model_in_process():
    from dataclasses import replace

    head32 = replace(random_head(D, seed=8), dtype="float32")
    app = build_app(head32, ServiceOptions(d=D, max_batch=64), KeyStore(["k"]))
    with BackgroundServer(app) as srv:
        remote = oracle_from_url(srv.url, "k")
        declared, detected = Oracle(head32, D), Oracle(head32, D, precision="auto")
        assert remote.detector is not None  # nothing declared over HTTP: read from the answers
        assert remote.precision == declared.precision == detected.precision == "float32"
        assert remote.eps == declared.eps == detected.eps
        assert oracle_from_url(srv.url, "k", precision="float16").precision == "float16"  # a declaration wins
        from attnprobe.oracles.wrappers import Rounded

        rounded = Oracle(Rounded(remote.fn, digits=12), D)  # an answer wrapper on the client: still read
        assert rounded.detector is not None
        remote.fn.close()
    head64 = random_head(D, seed=8)
    with BackgroundServer(build_app(head64, ServiceOptions(d=D), KeyStore(["k"]))) as srv:
        assert oracle_from_url(srv.url, "k").precision == Oracle(head64, D).precision == "float64"


def test_both_ends_send_without_waiting_for_acks(served):
    srv, _ = served
    import socket

    assert srv.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)  # accepted connections inherit it
    client = HttpOracle(srv.url, KEY)  # httpcore sets it on the client's sockets; the HTTP/in-process ratio needs it
    r = client._client.get("/healthz")
    assert r.extensions["network_stream"].get_extra_info("socket").getsockopt(socket.IPPROTO_TCP,
                                                                              socket.TCP_NODELAY)
    client.close()


def test_codec_writes_what_numpy_saves_and_reads_a_joined_body_without_another_copy():
    for shape in [(3, 2, D), (0, 2, D), (5,), (2, 3)]:
        a = np.random.default_rng(9).standard_normal(shape)
        assert npy_wire.encode(a) == npy_bytes(a)
    strided = np.random.default_rng(10).standard_normal((4, 6, D))[:, ::2]
    assert npy_wire.encode(strided) == npy_bytes(np.ascontiguousarray(strided))
    raw = npy_wire.encode(strided)
    body = npy_wire.joined([raw[:100], raw[100:101], raw[101:]])  # the chunks a server receives
    assert body.tobytes() == raw
    X = npy_wire.decode_queries(body, D, 4, 3)
    assert np.array_equal(X, strided) and X.flags.writeable and np.shares_memory(X, body)
    Y = npy_wire.decode_queries(raw, D, 4, 3)  # read-only bytes: a writable copy
    assert np.array_equal(Y, strided) and Y.flags.writeable


def test_chunked_npy_body_within_the_limit_is_answered(served):
    srv, head = served
    X = np.random.default_rng(11).standard_normal((16, 8, D))
    body = npy_wire.encode(X)

    def chunks():
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    r = httpx.post(srv.url + "/v1/query", content=chunks(), headers=NPY, timeout=20)
    assert r.status_code == 200, r.text
    assert np.array_equal(npy_wire.decode_answers(r.content, 16), head(X))


def test_a_learners_batch_goes_to_the_api_whole_with_several_requests_in_flight():
    in_flight, most = 0, 0
    lock = __import__("threading").Lock()
    head = random_head(D, seed=12)

    class Counting:
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            nonlocal in_flight, most
            import asyncio

            with lock:
                in_flight += 1
                most = max(most, in_flight)
            try:
                if scope["type"] == "http" and scope["path"] == "/v1/query":
                    await asyncio.sleep(0.05)  # hold each request long enough for the next ones to arrive
                await self.app(scope, receive, send)
            finally:
                with lock:
                    in_flight -= 1

    app = Counting(build_app(head, ServiceOptions(d=D, max_batch=8), KeyStore(["k"])))
    with BackgroundServer(app) as srv:
        remote = oracle_from_url(srv.url, "k", concurrency=3)
        fn, calls = remote.fn, []
        remote.fn = lambda X: calls.append(len(X)) or fn(X)
        X = np.random.default_rng(13).standard_normal((8 * 12, 2, D))
        assert np.array_equal(remote(X), head(X))
        assert calls == [len(X)]  # the oracle hands the whole batch to the HTTP client at once
        assert fn.requests == 1 + 12  # /v1/info, then the batch in 12 requests of the server's max batch
        assert most == 3
        fn.close()


@pytest.mark.parametrize("announced, status", [(b"\xb2", 400), (b"-1", 400), (b"1e3", 400),
                                               (b"99999999999999999999", 413), (b"12", 422)])
def test_the_announced_length_is_checked_before_the_body_is_read(announced, status):
    import asyncio

    app = build_app(random_head(D, seed=0), ServiceOptions(d=D, max_batch=4), KeyStore(["k"]))
    sent, read = [], []

    async def receive():
        read.append(1)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "path": "/v1/query",
             "raw_path": b"/v1/query", "query_string": b"", "root_path": "", "scheme": "http",
             "server": ("test", 80), "client": ("test", 1),
             "headers": [(b"content-length", announced), (b"authorization", b"Bearer k")]}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == status
    assert bool(read) == (status == 422)  # refused on the header alone, or read and found malformed


@pytest.mark.parametrize("pad", [0, 1, 3])
def test_data_at_any_byte_offset_is_read_exactly(served, pad):
    srv, head = served
    import struct

    X = np.random.default_rng(14).standard_normal((3, 2, D))
    header = (f"{{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2, {D}), }}" + " " * pad + "\n").encode()
    body = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + X.tobytes()  # data not 8-byte aligned
    r = httpx.post(srv.url + "/v1/query", content=body, headers=NPY)
    assert r.status_code == 200, r.text
    assert np.array_equal(npy_wire.decode_answers(r.content, 3), head(X))
