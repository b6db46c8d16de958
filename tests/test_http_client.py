"""The --url client as a new user meets it: an endpoint without authentication needs no key, an attnprobe API
without one is asked for it in one line, and a dead server is named within seconds with each retry said on
stderr."""

import json
import socket
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from attnprobe.service import KeyStore, ServiceOptions, build_app  # noqa: E402
from attnprobe.service.server import BackgroundServer  # noqa: E402
from attnprobe.targets.random_heads import random_head  # noqa: E402
from hostile import refused, run, snapshot  # noqa: E402

D = 4


def _open_api(head, seen: list):
    """An endpoint of the attnprobe API's shape without any authentication (it records the headers it got)."""
    from fastapi import FastAPI, Request

    app = FastAPI()

    @app.get("/v1/info")
    def info(request: Request):
        seen.append(request.headers.get("authorization"))
        return {"d": D, "max_batch": 64, "name": "open"}

    @app.post("/v1/query")
    async def query(request: Request):
        seen.append(request.headers.get("authorization"))
        X = np.asarray((await request.json())["inputs"], dtype=np.float64)
        return {"outputs": head(X).tolist()}

    return BackgroundServer(app)


def test_an_endpoint_without_auth_is_queried_without_a_key(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ATTNPROBE_API_KEY", raising=False)
    head, seen = random_head(D, seed=2), []
    with _open_api(head, seen) as srv:
        rc, _, err = run(capsys, "extract", "--url", srv.url, "--out", tmp_path / "r.npz", "--quiet")
    assert rc == 0, err
    assert seen and set(seen) == {None}  # no Authorization header was ever sent
    assert json.loads((tmp_path / "r.json").read_text())["check"]["passed"]


def test_an_api_that_wants_a_key_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ATTNPROBE_API_KEY", raising=False)
    app = build_app(random_head(D, seed=2), ServiceOptions(d=D), KeyStore(["k"], budget=1000))
    with BackgroundServer(app) as srv:
        line = refused(capsys, tmp_path, "extract", "--url", srv.url, "--out", tmp_path / "r.npz", "--quiet",
                       says="requires an API key (401")
    assert "give --api-key KEY or set ATTNPROBE_API_KEY" in line


def test_a_dead_server_is_named_within_seconds_and_every_retry_is_said(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNPROBE_API_KEY", "k")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = snapshot(tmp_path)
    t0 = time.monotonic()
    rc, _, err = run(capsys, "extract", "--url", f"http://127.0.0.1:{port}", "--out", tmp_path / "r.npz")
    took = time.monotonic() - t0
    lines = err.splitlines()
    assert rc == 2 and took < 5, (rc, took)
    assert [ln.split(";")[1].strip() for ln in lines[:-1]] == ["retry 1 of 6 in 0.25 s", "retry 2 of 6 in 0.5 s"]
    assert all(ln.startswith("attnprobe: note: ") and "Connection refused" in ln for ln in lines[:-1])
    assert lines[-1].startswith("attnprobe: error: nothing answers at") and "no queries spent" in lines[-1]
    assert snapshot(tmp_path) == before
