"""What the hardened query log and served API cost: queries a resumed or replayed run asks, and request latency
of the served API with bodies read as they arrive.

    python benchmarks/hardening_costs.py            # prints two tables (markdown)
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from attnprobe.learners import extract_exact
from attnprobe.oracles import Oracle
from attnprobe.oracles.querylog import QueryLog
from attnprobe.targets.random_heads import random_head


def log_costs(widths=(8, 16, 32)) -> list[str]:
    rows = ["| d | run | queries asked | answered from the log | log check | check (afresh) | seconds |",
            "|---|---|---|---|---|---|---|"]
    for d in widths:
        head = random_head(d, seed=d)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "q.sqlite"
            for run in ("first", "resumed", "replay"):
                log = QueryLog(path, readonly=True) if run == "replay" else QueryLog(path, identity="bench", d=d)
                o = Oracle(head, d, log=log)
                t0 = time.perf_counter()
                res = extract_exact(o, seed=0)
                seconds = time.perf_counter() - t0
                asked = o.queries - o.from_log
                rows.append(f"| {d} | {run} | {asked} | {o.from_log} | {res.queries_by_phase.get('log check', 0)} | "
                            f"{res.check.queries if run != 'replay' else 'from the log'} | {seconds:.2f} |")
                log.close()
    return rows


def api_latency(batches=(8, 128, 1024), N=4, d=32, repeats=15) -> list[str]:
    import httpx

    from attnprobe.service import KeyStore, ServiceOptions, build_app
    from attnprobe.service.server import BackgroundServer

    head = random_head(d, seed=1)
    rows = ["| B | N | d | body bytes | median ms (Content-Length) | median ms (chunked) | sequences/s |",
            "|---|---|---|---|---|---|---|"]
    app = build_app(head, ServiceOptions(d=d, max_batch=max(batches), max_length=N), KeyStore(["k"]))
    with BackgroundServer(app) as srv, httpx.Client(base_url=srv.url, headers={"Authorization": "Bearer k"},
                                                    timeout=60) as client:
        for B in batches:
            X = np.random.default_rng(B).standard_normal((B, N, d))
            body = ('{"inputs": ' + str(X.tolist()) + "}").encode()
            times = {"plain": [], "chunked": []}
            for _ in range(repeats):
                for kind in times:
                    content = body if kind == "plain" else iter([body[i:i + 65536]
                                                                for i in range(0, len(body), 65536)])
                    t0 = time.perf_counter()
                    r = client.post("/v1/query", content=content, headers={"Content-Type": "application/json"})
                    times[kind].append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text
            plain, chunked = statistics.median(times["plain"]), statistics.median(times["chunked"])
            rows.append(f"| {B} | {N} | {d} | {len(body)} | {1e3 * plain:.1f} | {1e3 * chunked:.1f} | "
                        f"{B / plain:.0f} |")
    return rows


if __name__ == "__main__":
    import os

    print(f"load: {os.getloadavg()}")
    print("\n".join(log_costs()))
    print()
    print("\n".join(api_latency()))
