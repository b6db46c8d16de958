"""The served API on a real uvicorn server (127.0.0.1, free port): auth, limits, hostile input, OpenAPI fuzzing."""

import json

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from attnprobe.errors import BudgetExceededError, ConfigError, OracleError  # noqa: E402
from attnprobe.learners import extract_exact  # noqa: E402
from attnprobe.oracles import Oracle  # noqa: E402
from attnprobe.oracles.http import HttpOracle, oracle_from_url  # noqa: E402
from attnprobe.service import KeyStore, ServiceOptions, build_app  # noqa: E402
from attnprobe.service.server import BackgroundServer  # noqa: E402
from attnprobe.targets.random_heads import random_head  # noqa: E402

D = 4
KEY = "test-key-1"


@pytest.fixture(scope="module")
def served():
    head = random_head(D, seed=7)
    app = build_app(head, ServiceOptions(d=D, max_batch=16, max_length=8), KeyStore([KEY, "other-key"], budget=400))
    with BackgroundServer(app) as srv:
        yield srv, head


def post(url, body, key=KEY, raw=False):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    content = body if raw else json.dumps(body)
    return httpx.post(url + "/v1/query", content=content, headers=headers, timeout=10)


def seq(N=2, d=D, value=0.5):
    return [[value] * d for _ in range(N)]


def test_answers_are_the_models_answers(served):
    srv, head = served
    X = np.random.default_rng(0).standard_normal((3, 2, D))
    r = post(srv.url, {"inputs": X.tolist()})
    assert r.status_code == 200
    assert np.array_equal(np.array(r.json()["outputs"]), head(X))
    assert httpx.get(srv.url + "/healthz").status_code == 200
    info = httpx.get(srv.url + "/v1/info", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert info == {"d": D, "max_batch": 16, "max_length": 8, "name": "attnprobe", "outputs": None,
                    "every_position": False, "api_version": "1", "rate": None, "formats": ["json", "npy"]}


HOSTILE = {
    "no key": (None, {"inputs": [seq()]}, False, {401}),
    "wrong key": ("nope", {"inputs": [seq()]}, False, {401}),
    "prefix of a key": (KEY[:-1], {"inputs": [seq()]}, False, {401}),
    "batch above max": (KEY, {"inputs": [seq()] * 17}, False, {413, 422}),
    "sequence above max length": (KEY, {"inputs": [seq(N=9)]}, False, {413, 422}),
    "bad JSON": (KEY, b'{"inputs": [[[1, 2', True, {422}),
    "not an object": (KEY, b"[1, 2, 3]", True, {422}),
    "wrong width": (KEY, {"inputs": [seq(d=D + 1)]}, False, {422}),
    "ragged rows": (KEY, {"inputs": [[[0.1] * D, [0.1] * (D - 1)]]}, False, {422}),
    "ragged sequences": (KEY, {"inputs": [seq(N=2), seq(N=3)]}, False, {422}),
    "strings": (KEY, {"inputs": [[["0.1"] * D]]}, False, {422}),
    "booleans": (KEY, {"inputs": [[[True] * D]]}, False, {422}),
    "null": (KEY, {"inputs": [[[None] * D]]}, False, {422}),
    "NaN": (KEY, b'{"inputs": [[[NaN, 1, 1, 1]]]}', True, {422}),
    "Infinity": (KEY, b'{"inputs": [[[Infinity, 1, 1, 1]]]}', True, {422}),
    "-Infinity": (KEY, b'{"inputs": [[[-Infinity, 1, 1, 1]]]}', True, {422}),
    "overflow 1e999": (KEY, b'{"inputs": [[[1e999, 1, 1, 1]]]}', True, {422}),
    "answer overflows": (KEY, {"inputs": [[[1e300] * D, [1e300] * D]]}, False, {422}),
    "empty batch": (KEY, {"inputs": []}, False, {422}),
    "empty sequence": (KEY, {"inputs": [[]]}, False, {422}),
    "empty row": (KEY, {"inputs": [[[]]]}, False, {422}),
    "missing field": (KEY, {"queries": [seq()]}, False, {422}),
    "scalar inputs": (KEY, {"inputs": 3}, False, {422}),
    "body too large": (KEY, b"{" + b" " * 10_000_000 + b"}", True, {413}),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_requests_get_4xx_and_the_server_stays_up(served, case):
    srv, head = served
    key, body, raw, expected = HOSTILE[case]
    before = httpx.get(srv.url + "/v1/usage", headers={"Authorization": "Bearer other-key"}).json()["queries"]
    r = post(srv.url, body, key=key if key != KEY else "other-key", raw=raw)
    assert r.status_code in expected, (case, r.status_code, r.text)
    assert isinstance(r.json()["detail"], (str, list))
    after = httpx.get(srv.url + "/v1/usage", headers={"Authorization": "Bearer other-key"}).json()["queries"]
    assert after == before  # a refused request is never charged
    assert httpx.get(srv.url + "/healthz").status_code == 200


def test_budget_gives_429_and_nothing_past_it():
    head = random_head(D, seed=1)
    app = build_app(head, ServiceOptions(d=D, max_batch=8), KeyStore(["k"], budget=10))
    with BackgroundServer(app) as srv:
        assert post(srv.url, {"inputs": [seq()] * 8}, key="k").status_code == 200
        r = post(srv.url, {"inputs": [seq()] * 3}, key="k")
        assert r.status_code == 429 and "budget" in r.json()["detail"]
        assert post(srv.url, {"inputs": [seq()] * 2}, key="k").status_code == 200
        usage = httpx.get(srv.url + "/v1/usage", headers={"Authorization": "Bearer k"}).json()
        assert usage == {"queries": 10, "budget": 10, "replayed": 0}
        fn = HttpOracle(srv.url, "k", retries=2, backoff=0.01)
        with pytest.raises(BudgetExceededError, match="budget"):
            fn(np.zeros((1, 1, D)))


class SteppingClock:
    """A monotonic clock that moves ``step`` seconds each time it is read: the rate limiter then refills a fixed
    number of tokens per request, however fast or loaded the machine is."""

    def __init__(self, start: float, step: float) -> None:
        self.now, self.step = start, step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now


def test_rate_limit_gives_429_with_retry_after_and_the_client_waits(monkeypatch):
    import time

    head = random_head(D, seed=1)
    app = build_app(head, ServiceOptions(d=D, max_batch=4), KeyStore(["k"], rate=10.0, burst=4))
    # 1/8 s per request at 10 queries/s: 1.25 tokens per request against 4 per batch of 4 and a bucket of 10, so
    # the 4th quick request is refused (10 → 6 → 3.25 → 0.5, then 1.75 < 4), and the client's 4 batches of 4
    # cannot all pass in a row (that needs 16 ≤ 10 + 4·1.25): it retries at least once
    monkeypatch.setattr("attnprobe.service.keys.time", SteppingClock(time.monotonic(), 0.125))
    with BackgroundServer(app) as srv, httpx.Client(base_url=srv.url, headers={"Authorization": "Bearer k"}) as c:
        replies = [c.post("/v1/query", json={"inputs": [seq()] * 4}) for _ in range(12)]
        codes = [r.status_code for r in replies]
        assert codes[:4] == [200, 200, 200, 429]
        assert all(int(r.headers["Retry-After"]) >= 1 for r in replies if r.status_code == 429)
        # a batch the rate limit refuses is not charged: the key has used 4 queries per answered batch only
        assert c.get("/v1/usage").json()["queries"] == 4 * codes.count(200) < 4 * len(codes)
        fn = HttpOracle(srv.url, "k", retries=20, backoff=0.01)
        X = np.random.default_rng(2).standard_normal((16, 2, D))
        assert np.array_equal(fn(X), head(X))  # 16 queries at 10/s: the client backs off and gets them all
        assert fn.retried > 0


def test_client_errors_are_one_clear_line(served):
    srv, _ = served
    with pytest.raises(OracleError, match="refused the API key"):
        HttpOracle(srv.url, "wrong")
    with pytest.raises(OracleError, match="requires an API key.*ATTNPROBE_API_KEY"):  # asked without one
        HttpOracle(srv.url, None)
    with pytest.raises(ConfigError, match=r"--d 5 does not match"):
        oracle_from_url(srv.url, KEY, d=5)
    with pytest.raises(OracleError, match="failed 2 times"):
        HttpOracle("http://127.0.0.1:9", KEY, retries=1, backoff=0.01, timeout=2)


def test_http_extraction_equals_in_process_bit_for_bit_and_usage_matches():
    head = random_head(6, seed=11)
    app = build_app(head, ServiceOptions(d=6, max_batch=8), KeyStore(["k"]))
    with BackgroundServer(app) as srv:
        remote = oracle_from_url(srv.url, "k", concurrency=3)
        res_http = extract_exact(remote, seed=5)
        local = Oracle(head, 6)
        res_local = extract_exact(local, seed=5)
        a, b = res_http.model.arrays(), res_local.model.arrays()
        assert a.keys() == b.keys()
        for name in a:
            assert np.array_equal(np.asarray(a[name]), np.asarray(b[name])), name
        assert remote.queries == local.queries > 0
        assert remote.fn.usage()["queries"] == remote.queries
        assert res_http.check.passed


def test_idempotent_resend_is_not_charged_twice():
    head = random_head(D, seed=1)
    app = build_app(head, ServiceOptions(d=D, max_batch=8), KeyStore(["k"]))
    with BackgroundServer(app) as srv:
        h = {"Authorization": "Bearer k", "Idempotency-Key": "abc"}
        X = np.random.default_rng(3).standard_normal((5, 2, D)).tolist()
        r1 = httpx.post(srv.url + "/v1/query", json={"inputs": X}, headers=h)
        r2 = httpx.post(srv.url + "/v1/query", json={"inputs": X}, headers=h)
        assert r1.json() == r2.json()
        other = np.random.default_rng(4).standard_normal((5, 2, D)).tolist()  # same key, other batch: charged
        r3 = httpx.post(srv.url + "/v1/query", json={"inputs": other}, headers=h)
        assert r3.json() != r1.json()
        assert httpx.get(srv.url + "/v1/usage", headers=h).json() == {"queries": 10, "budget": None, "replayed": 5}


def test_keys_are_stored_hashed():
    store = KeyStore(["secret-key"])
    assert b"secret-key" not in b"".join(store._hashes)
    assert store.identify("secret-key") is not None and store.identify("secret-kex") is None
    with pytest.raises(ConfigError):
        KeyStore([])


def _fuzz(srv, max_examples, modes):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation import GenerationMode

    schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
    seen = {}
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in modes:
            @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=GenerationMode(mode)))
            def check(case):
                r = case.call(base_url=srv.url, headers={"Authorization": f"Bearer {KEY}"})
                seen[r.status_code] = seen.get(r.status_code, 0) + 1
                assert r.status_code < 500, (op.method, op.path, r.status_code, r.text[:300])

            try:
                check()
            except Unsatisfiable:  # e.g. no negative example exists for an operation without parameters
                assert mode == "negative"
    return seen


def test_schemathesis_finds_no_5xx(served):
    srv, _ = served
    seen = _fuzz(srv, 12, ["positive", "negative"])
    assert all(code < 500 for code in seen) and sum(seen.values()) > 30


@pytest.mark.slow
def test_schemathesis_long_run_finds_no_5xx(served):
    srv, _ = served
    seen = _fuzz(srv, 500, ["positive", "negative"])
    assert all(code < 500 for code in seen)


def test_an_idempotency_key_reused_for_the_same_numbers_in_another_shape_is_a_new_batch():
    """The same 16 numbers as 2 sequences of 2 rows, then as 1 sequence of 4 rows, under one Idempotency-Key: the
    bytes (and their CRC) agree but the batches do not. The second is answered by the model (one output, its own)
    and charged, never served the first's two cached outputs."""
    head = random_head(D, seed=1)
    app = build_app(head, ServiceOptions(d=D, max_batch=8), KeyStore(["k"]))
    with BackgroundServer(app) as srv:
        h = {"Authorization": "Bearer k", "Idempotency-Key": "same"}
        X = np.random.default_rng(5).standard_normal((2, 2, D))
        r1 = httpx.post(srv.url + "/v1/query", json={"inputs": X.tolist()}, headers=h)
        r2 = httpx.post(srv.url + "/v1/query", json={"inputs": X.reshape(1, 4, D).tolist()}, headers=h)
        assert r1.status_code == r2.status_code == 200
        assert np.array_equal(r2.json()["outputs"], head(X.reshape(1, 4, D)))
        assert httpx.get(srv.url + "/v1/usage", headers=h).json() == {"queries": 3, "budget": None, "replayed": 0}


def test_a_sequence_above_the_servers_max_length_is_refused_before_it_is_sent(served):
    """The served max_length is read from /v1/info: a longer sequence is refused client-side in one line that says
    which flag to raise, nothing sent or charged (the server would answer 413 after the upload)."""
    srv, head = served
    client = HttpOracle(srv.url, KEY)
    assert client.max_length == 8
    before = client.usage()["queries"]
    with pytest.raises(ConfigError, match=r"at most 8 rows.*asks 9.*--max-length \(at least 9\)"):
        client(np.zeros((2, 9, D)))
    assert client.usage()["queries"] == before and client.requests == 3  # /v1/info and two /v1/usage only
    assert np.allclose(client(np.ones((1, 8, D))), head(np.ones((1, 8, D))), rtol=0, atol=1e-12)
