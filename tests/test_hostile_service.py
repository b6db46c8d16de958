"""Hostile clients and odd servers: bodies that lie about their size or never finish, clients that vanish,
K-output models, odd /v1/info answers and URL options. Server-side: a 4xx (never 5xx) and at most one log line
per bad client; client-side: exit code 2, one stderr line, no file harmed."""

import logging
import socket
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from attnprobe.errors import OracleError  # noqa: E402
from attnprobe.models.io import save_model  # noqa: E402
from attnprobe.oracles import Oracle  # noqa: E402
from attnprobe.oracles.http import HttpOracle  # noqa: E402
from attnprobe.service import KeyStore, ServiceOptions, build_app  # noqa: E402
from attnprobe.service.server import BackgroundServer  # noqa: E402
from attnprobe.targets.random_heads import random_head  # noqa: E402
from hostile import refused, run  # noqa: E402

D = 4
AUTH = {"Authorization": "Bearer k"}


def _head_server(**options):
    opts = dict(d=D, max_batch=8, max_length=8)
    opts.update(options)
    budget = opts.pop("budget", None)
    return BackgroundServer(build_app(random_head(D, seed=1), ServiceOptions(**opts), KeyStore(["k"], budget=budget)))


def _raw(port: int, head: bytes, body: bytes = b"", wait: float = 3.0) -> bytes:
    """Send ``head`` and ``body`` on a fresh socket; return what the server answers within ``wait`` s."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(head + body)
        try:
            return s.recv(65536)  # the status line and headers come in one segment
        except socket.timeout:
            return b""


def _request_head(length: str | None = None, chunked: bool = False) -> bytes:
    lines = ["POST /v1/query HTTP/1.1", "Host: x", "Authorization: Bearer k", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_chunked_body_past_the_limit_gets_413_and_is_not_charged():
    with _head_server(max_body_bytes=50_000) as srv:
        def body():
            yield b'{"inputs": [[['
            for _ in range(20_000):
                yield b"0.5, "
            yield b"0.5]]]}"

        r = httpx.post(srv.url + "/v1/query", content=body(), headers=AUTH, timeout=10)
        assert r.status_code == 413 and "limit" in r.json()["detail"]
        assert httpx.get(srv.url + "/v1/usage", headers=AUTH).json()["queries"] == 0
        X = np.random.default_rng(0).standard_normal((2, 2, D))
        r = httpx.post(srv.url + "/v1/query", content=iter([f'{{"inputs": {X.tolist()}}}'.encode()]), headers=AUTH)
        assert r.status_code == 200 and len(r.json()["outputs"]) == 2  # a small chunked body is fine


def test_a_half_sent_body_times_out_with_408():
    with _head_server(body_timeout=0.5) as srv:
        t0 = time.monotonic()
        reply = _raw(srv.port, _request_head(length="1000"), b'{"inputs": [[[0.1,', wait=5.0)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert time.monotonic() - t0 < 4.5
        assert httpx.get(srv.url + "/healthz").status_code == 200


def test_clients_that_disconnect_mid_body_cost_one_log_line_each(caplog):
    caplog.set_level(logging.INFO)
    with _head_server() as srv:
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", srv.port)) as s:
                s.sendall(_request_head(length="5000") + b'{"inputs": [[[0.1, 0.2,')
        time.sleep(0.5)
        assert httpx.get(srv.url + "/healthz").status_code == 200
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    mine = [r for r in caplog.records if "disconnected" in r.getMessage()]
    assert len(mine) == 5 and all("\n" not in r.getMessage() for r in mine)


def test_a_k_output_model_is_served_as_b_by_k():
    W = np.random.default_rng(0).standard_normal((3, D))

    def fn(X):
        return X[:, -1, :] @ W.T

    with BackgroundServer(build_app(fn, ServiceOptions(d=D, outputs=3), KeyStore(["k"]))) as srv:
        X = np.random.default_rng(1).standard_normal((5, 2, D))
        r = httpx.post(srv.url + "/v1/query", json={"inputs": X.tolist()}, headers=AUTH)
        assert r.status_code == 200
        assert np.array_equal(np.array(r.json()["outputs"]), fn(X))
        assert httpx.get(srv.url + "/v1/info", headers=AUTH).json()["outputs"] == 3
        o = Oracle(HttpOracle(srv.url, "k"), D)
        assert np.array_equal(o(X), fn(X)) and o.outputs == 3


def test_a_model_that_fails_gets_500_with_one_log_line_and_no_charge(caplog):
    def broken(X):
        raise RuntimeError("weights missing")

    with BackgroundServer(build_app(broken, ServiceOptions(d=D), KeyStore(["k"]))) as srv:
        r = httpx.post(srv.url + "/v1/query", json={"inputs": [[[0.1] * D]]}, headers=AUTH)
        assert r.status_code == 500 and "not charged" in r.json()["detail"]
        assert httpx.get(srv.url + "/v1/usage", headers=AUTH).json()["queries"] == 0
    assert not [r for r in caplog.records if r.exc_info]
    assert len([r for r in caplog.records if "weights missing" in r.getMessage()]) == 1


@pytest.mark.parametrize("concurrency", [1, 4])
def test_queries_spent_count_only_what_the_server_charged(concurrency):
    """33 sequences in chunks of 8 against a budget of 20: the Oracle counts exactly what /v1/usage charged."""
    with _head_server(budget=20) as srv:
        o = Oracle(HttpOracle(srv.url, "k", concurrency=concurrency, retries=0), D)
        with pytest.raises(OracleError, match="budget"):
            o(np.random.default_rng(0).standard_normal((33, 2, D)))
        charged = httpx.get(srv.url + "/v1/usage", headers=AUTH).json()["queries"]
        assert 0 < o.queries == charged <= 20


def test_a_413_batch_is_not_counted_as_asked():
    with _head_server(max_length=3) as srv:
        client = HttpOracle(srv.url, "k", retries=0)
        o = Oracle(client, D)
        with pytest.raises(OracleError, match="at most 3 rows"):  # refused by the client, from /v1/info
            o(np.zeros((2, 5, D)))
        client.max_length = None  # a server that does not publish its limit: its 413 is the refusal
        with pytest.raises(OracleError, match="413"):
            o(np.zeros((2, 5, D)))
        assert o.queries == 0 == httpx.get(srv.url + "/v1/usage", headers=AUTH).json()["queries"]


# --- odd servers, URLs and options through the CLI ----------------------------------------------------------------

def _fake_api(info=None, text=None):
    """A server whose /v1/info answers ``info`` as JSON, or ``text`` as HTML."""
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse, JSONResponse

    app = FastAPI()

    @app.get("/v1/info")
    def _info():
        return HTMLResponse(text) if text is not None else JSONResponse(info)

    return BackgroundServer(app)


@pytest.mark.parametrize("info, text, says", [
    (None, "<html><body>Welcome to nginx!</body>\n</html>", "not a JSON object"),
    ([1, 2, 3], None, "not a JSON object"),
    ({"d": 4.7, "max_batch": 8}, None, "input width d is 4.7"),
    ({"d": "4", "max_batch": 8}, None, "input width d is '4'"),
    ({"d": 0, "max_batch": 8}, None, "input width d is 0"),
    ({"d": True, "max_batch": 8}, None, "input width d is True"),
    ({"max_batch": 8}, None, "input width d is None"),
    ({"d": 4, "max_batch": -5}, None, "max_batch is -5"),
    ({"d": 4, "max_batch": 2.5}, None, "max_batch is 2.5"),
])
def test_odd_info_answers_are_refused_in_one_line(tmp_path, capsys, monkeypatch, info, text, says):
    monkeypatch.setenv("ATTNPROBE_API_KEY", "k")
    with _fake_api(info, text) as srv:
        refused(capsys, tmp_path, "extract", "--url", srv.url, "--out", tmp_path / "r.npz", "--quiet", "--retries",
                "0", says=says)


@pytest.mark.parametrize("url, extra, says", [
    ("http://[::1", [], "not usable"),
    ("http://localhost:99999", [], "port 99999"),
    ("ftp://localhost:1", [], "must start with http://"),
    ("http://user:hunter2@127.0.0.1:9", [], "not in the URL"),
    ("http://127.0.0.1:9", ["--timeout", "inf"], "finite number of seconds"),
    ("http://127.0.0.1:9", ["--timeout", "nan"], "finite number of seconds"),
    ("http://127.0.0.1:9", ["--timeout", "-1"], "finite number of seconds"),
    ("http://127.0.0.1:9", ["--concurrency", "0"], "concurrency must be"),
    ("http://127.0.0.1:9", ["--retries", "-1"], "retries >= 0"),
    ("http://127.0.0.1:9", ["--api-key", "clé-secrète"], "printable ASCII"),
    ("http://127.0.0.1:9", ["--api-key", "a\nb"], "printable ASCII"),
])
def test_odd_urls_and_options_are_refused_in_one_line_without_echoing_secrets(tmp_path, capsys, monkeypatch, url,
                                                                              extra, says):
    monkeypatch.setenv("ATTNPROBE_API_KEY", "k")
    line = refused(capsys, tmp_path, "extract", "--url", url, *extra, "--out", tmp_path / "r.npz", "--quiet",
                   says=says)
    assert "hunter2" not in line and "secrète" not in line


def test_serve_refuses_bad_ports_key_files_and_broken_models_before_it_says_serving(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNPROBE_API_KEY", "k")
    save_model(random_head(D, seed=1), tmp_path / "head.npz")
    target = ["--target", tmp_path / "head.npz"]
    for port in ("70000", "-1", "http"):
        refused(capsys, tmp_path, "serve", *target, "--port", port, says="port from 0 to 65535")
    (tmp_path / "keys.txt").write_bytes(b"\xff\xfe k\xe9y\n")
    refused(capsys, tmp_path, "serve", *target, "--api-key-file", tmp_path / "keys.txt", says="not UTF-8")
    refused(capsys, tmp_path, "serve", *target, "--api-key", "caf\u00e9", says="characters an HTTP header")
    for flag, value in (("--max-batch", "0"), ("--budget", "-1"), ("--rate", "nan"), ("--max-length", "0")):
        refused(capsys, tmp_path, "serve", *target, flag, value, says=flag)
    (tmp_path / "victims.py").write_text("def broken(X):\n    raise ValueError('no weights')\n")
    monkeypatch.chdir(tmp_path)
    refused(capsys, tmp_path, "serve", "--oracle", "victims:broken", "--d", "4", says="fails on a test query")
    with socket.socket() as busy:  # a port in use: refused before "serving ..." is printed
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        rc, out, err = run(capsys, "serve", *target, "--port", str(busy.getsockname()[1]))
        assert rc == 2 and "serving" not in out and "cannot listen" in err


def test_serve_answers_a_k_output_model_file_and_extract_resumes_through_its_log(tmp_path, capsys, monkeypatch):
    """``serve --target`` a ReLU network with 3 outputs: /v1/info says so, the ffn learner recovers it over
    HTTP, and a rerun through the same query log asks only the log check and the functional check."""
    import json

    from attnprobe.cli import build_parser
    from attnprobe.cli.serve import build_from_args
    from attnprobe.targets import random_relu_net

    monkeypatch.setenv("ATTNPROBE_API_KEY", "k")
    save_model(random_relu_net(4, 6, seed=2, outputs=3), tmp_path / "relu.npz")
    app, options = build_from_args(build_parser().parse_args(["serve", "--target", str(tmp_path / "relu.npz")]))
    assert options.outputs == 3
    with BackgroundServer(app) as srv:
        assert httpx.get(srv.url + "/v1/info", headers=AUTH).json()["outputs"] == 3
        for out in ("a.npz", "b.npz"):
            rc, _, err = run(capsys, "extract", "--url", srv.url, "--method", "ffn", "--log", tmp_path / "q.sqlite",
                             "--out", tmp_path / out, "--quiet")
            assert rc == 0, err
    second = json.loads((tmp_path / "b.json").read_text())
    from attnprobe.oracles.querylog import MAX_PROBES

    asked = second["details"]["oracle"]["queries_asked"]  # the log's probes re-asked, and the check afresh
    assert second["check"]["queries"] < asked <= second["check"]["queries"] + MAX_PROBES
    rc, _, err = run(capsys, "verify", "--target", tmp_path / "relu.npz", "--result", tmp_path / "b.npz")
    assert rc == 0, err
