"""Attack a served attention layer over HTTP: write one output row of a Hugging Face layer as a model file, serve
it with ``attnprobe serve`` on 127.0.0.1, and extract it with ``attnprobe extract --url``.

    python examples/attack_served_layer.py                    # MiniLM-L6 layer 0, output row 0 (slow over HTTP)
    python examples/attack_served_layer.py --model-dir DIR --layer 1 --row 3

The same three steps from the shell:

    attnprobe target hf-attention --model-dir DIR --layer L --row R --out layer.npz
    ATTNPROBE_API_KEY=secret attnprobe serve --target layer.npz --port 8000 &
    ATTNPROBE_API_KEY=secret attnprobe extract --url http://127.0.0.1:8000 --method multihead --heads H --out got.npz
"""

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnprobe.cli import main as attnprobe
from attnprobe.targets.hf import hf_checkpoint, minilm_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, timeout: float = 60.0) -> None:
    import httpx

    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"the server at {url} did not come up in {timeout:.0f} s")


def run(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", help="a Hugging Face model folder (default: the installed MiniLM-L6)")
    p.add_argument("--layer", default="0")
    p.add_argument("--row", default="0")
    p.add_argument("--work", help="folder for the served file, its log and the result (default: a new temporary "
                                  "folder)")
    args = p.parse_args(argv)
    folder = args.model_dir or str(minilm_dir())
    ckpt = hf_checkpoint(folder)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="attnprobe-served-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"working in {work}")
    layer_file, result = work / "layer.npz", work / "got.npz"

    code = attnprobe(["target", "hf-attention", "--model-dir", folder, "--layer", args.layer, "--row", args.row,
                      "--out", str(layer_file)])
    if code:
        return code
    key, port = secrets.token_hex(16), free_port()
    env = {**os.environ, "ATTNPROBE_API_KEY": key}  # the key stays out of the process list
    server_log = open(work / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "attnprobe", "serve", "--target", str(layer_file),
                               "--port", str(port), "--quiet"], env=env, stdout=server_log, stderr=server_log)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url, server)
        except RuntimeError:
            print((work / "server.log").read_text(), file=sys.stderr)
            raise
        os.environ["ATTNPROBE_API_KEY"] = key
        code = attnprobe(["extract", "--url", url, "--method", "multihead", "--heads", str(ckpt.heads_per_layer),
                          "--rank", str(ckpt.head_dim), "--out", str(result)])  # a progress bar on a terminal
    finally:
        server.terminate()
        server.wait(timeout=30)
        server_log.close()
    if code:
        return code
    code = attnprobe(["verify", "--target", str(layer_file), "--result", str(result)])
    summary = json.loads(result.with_suffix(".json").read_text())
    print(f"over HTTP: {summary['queries']} queries, check passed = {summary['check']['passed']}")
    return code


if __name__ == "__main__":
    sys.exit(run())
