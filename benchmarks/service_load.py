"""Load test of the served API on loopback: queries/s with 1, 8 and 64 concurrent clients (a bounded async httpx
loop), and one extraction over HTTP against the same extraction in process.

    PYTHONPATH=src python benchmarks/service_load.py [--seconds 8] [--batch 32] [--d 32] [--length 8]

The server is a real ``attnprobe serve`` subprocess (uvicorn, one worker) on 127.0.0.1 at a free port; every
level runs for at most ``--seconds`` and ``--max-requests``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from report import table, write_section

from attnprobe.learners import extract_exact
from attnprobe.models.io import save_model
from attnprobe.oracles import Oracle
from attnprobe.oracles.http import oracle_from_url
from attnprobe.targets.random_heads import random_head

KEY = "load-test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(target: Path, max_batch: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, ATTNPROBE_API_KEY=KEY)
    proc = subprocess.Popen([sys.executable, "-m", "attnprobe", "serve", "--target", str(target), "--port", str(port),
                             "--max-batch", str(max_batch), "--quiet"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not start: " + proc.stderr.read().decode()[-2000:])


async def level(url: str, clients: int, body: bytes, batch: int, seconds: float, max_requests: int) -> dict:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    sent = 0
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as client:
        async def worker():
            nonlocal sent, errors
            while time.perf_counter() < deadline and sent < max_requests:
                sent += 1
                t = time.perf_counter()
                r = await client.post("/v1/query", content=body)
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - t)
                else:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    lat = np.array(latencies) * 1e3
    return {"clients": clients, "requests": len(latencies), "errors": errors, "seconds": wall,
            "req_s": len(latencies) / wall, "q_s": len(latencies) * batch / wall,
            "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--max-requests", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=32, help="sequences per request")
    ap.add_argument("--length", type=int, default=8, help="rows per sequence")
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--extract-d", type=int, default=32)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "head.npz"
        save_model(random_head(args.d, seed=0), target)
        proc, url = start_server(target, max_batch=max(args.batch, 256))
        try:
            X = np.random.default_rng(0).standard_normal((args.batch, args.length, args.d))
            import json

            body = json.dumps({"inputs": X.tolist()}).encode()
            rows = [asyncio.run(level(url, c, body, args.batch, args.seconds, args.max_requests)) for c in (1, 8, 64)]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        # one extraction over HTTP (server max batch 256, 4 requests in flight) vs the same one in process
        target2 = Path(tmp) / "head2.npz"
        head2 = random_head(args.extract_d, seed=1)
        save_model(head2, target2)
        proc, url = start_server(target2, max_batch=256)
        try:
            remote = oracle_from_url(url, KEY, concurrency=4)
            t0 = time.perf_counter()
            res = extract_exact(remote, seed=0)
            t_http = time.perf_counter() - t0
            usage = remote.fn.usage()["queries"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        local = Oracle(head2, args.extract_d)
        t0 = time.perf_counter()
        res_local = extract_exact(local, seed=0)
        t_local = time.perf_counter() - t0
        same = all(np.array_equal(a, res_local.model.arrays()[k]) for k, a in res.model.arrays().items())
    load = table(["clients", "requests", "errors", "seconds", "requests/s", "queries/s", "p50 ms", "p95 ms"],
                 [[r["clients"], r["requests"], r["errors"], r["seconds"], r["req_s"], r["q_s"], r["p50_ms"],
                   r["p95_ms"]] for r in rows])
    ext = table(["extraction", "d", "queries (incl. check)", "server usage", "seconds", "queries/s",
                 "bit-identical to in-process"],
                [["exact over HTTP", args.extract_d, remote.queries, usage, t_http, remote.queries / t_http, same],
                 ["exact in process", args.extract_d, local.queries, "-", t_local, local.queries / t_local, "-"]])
    body = (f"Load: each request carries {args.batch} sequences of {args.length} rows, d = {args.d} "
            f"(JSON body {len(body) / 1024:.0f} KiB); one uvicorn worker, clients are asyncio tasks sharing one "
            f"httpx.AsyncClient in another process; each level stops after {args.seconds:g} s.\n\n{load}\n\n{ext}")
    print(body)
    if not args.no_docs:
        write_section("Served API: load on loopback and one extraction over HTTP", body + """

The machine's 2 cores are shared with other jobs during the measurement, so the numbers are a floor. JSON
encoding of float64 inputs (shortest round-trip repr, so answers are bit-exact) dominates the cost per query;
the extraction over HTTP sends the learner's batches split to the server's max batch with 4 requests in flight.""",
                      "python benchmarks/service_load.py")


if __name__ == "__main__":
    main()
