"""``attnprobe serve``: put a model behind the prediction API (docs/architecture.md, "Served API") to attack it \
over HTTP."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from attnprobe.cli import answer_chain
from attnprobe.cli.common import nonneg_int, positive_float, positive_int
from attnprobe.errors import ConfigError
from attnprobe.models import PRECISIONS
from attnprobe.oracles.http import KEY_ENV


def api_keys(args) -> list[str]:
    keys = list(args.api_key or [])
    if args.api_key_file:
        path = Path(args.api_key_file)
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read --api-key-file {path}: {exc.strerror or exc}",
                              param="api_key_file") from exc
        except UnicodeDecodeError:
            raise ConfigError(f"--api-key-file {path} is not UTF-8 text; write one key a line",
                              param="api_key_file") from None
        keys += [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not keys and os.environ.get(KEY_ENV):
        keys.append(os.environ[KEY_ENV])
    if not keys:
        raise ConfigError(f"give the server at least one key: --api-key KEY, --api-key-file F or {KEY_ENV}",
                          param="api_key")
    for i, key in enumerate(keys):
        if not (key.isascii() and key.isprintable()) or key != key.strip() or " " in key:
            raise ConfigError(f"API key number {i + 1} has characters an HTTP header cannot carry (keys are printable "
                              "ASCII without spaces); choose another key", param="api_key")
    return keys


def port(text: str) -> int:
    """argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535; got {text!r}")
    return value


def answer_outputs(fn, d: int) -> tuple[int | None, bool]:
    """K for a model answering (B, K) (None for one number per sequence) and whether it answers every position
    ((B, N, K)), read from one test query; a model that fails on it is refused before the server starts."""
    import numpy as np

    X = np.random.default_rng(0).standard_normal((1, 1, d)) * 0.1  # length 1: every model answers it
    try:
        y = np.asarray(fn(X), dtype=np.float64)
    except Exception as exc:
        raise ConfigError(f"the model fails on a test query ({type(exc).__name__}: {exc}); fix it before serving "
                          "it", param="oracle") from None
    if y.shape in ((1,), (1, 1)):
        return None, False
    if y.ndim == 2 and y.shape[0] == 1:
        return int(y.shape[1]), False
    if y.ndim == 3 and y.shape[:2] == (1, 1):
        return int(y.shape[2]), True
    raise ConfigError(f"the model answers shape {y.shape} for one sequence of one row; a served model answers one "
                      "number or K numbers per sequence, or K numbers per position", param="oracle")


def served_callable(args):
    """The callable to serve and its width: a saved model (``--target``) or ``--oracle MODULE:ATTR``, answering
    through the answer chain of the shared defence flags (``--defense``, ``--cast``, ``--noise``, ...)."""
    from attnprobe.oracles import oracle_from_file, oracle_from_spec

    if sum(map(bool, (args.target, args.oracle, args.hf_dir))) != 1:
        raise ConfigError("say what to serve: one of --target FILE.npz, --oracle MODULE:ATTR --d D or --hf-dir DIR "
                          "--block L", param="target")
    chain = answer_chain.chain_from_args(args)
    if args.hf_dir:
        from attnprobe.cli.hf import block_source
        from attnprobe.oracles.hf_block import oracle_from_hf_block

        if args.block is None:
            raise ConfigError("serve --hf-dir DIR needs --block L (the whole block to serve)", param="block")
        if args.d is not None:
            raise ConfigError("--hf-dir knows its width; drop --d", param="d")
        block_source(args)
        oracle = oracle_from_hf_block(args.hf_dir, args.block, dtype=args.dtype)
        return chain.apply(oracle.fn), oracle.d, oracle.name, oracle.d, True
    if args.block is not None:
        raise ConfigError("--block goes with --hf-dir DIR", param="block")
    oracle = oracle_from_file(args.target, dtype=args.dtype) if args.target else oracle_from_spec(args.oracle, args.d)
    # asked of the model itself: the chain's noise is not consumed
    outputs, every = answer_outputs(oracle.fn, oracle.d)
    return chain.apply(oracle.fn), oracle.d, oracle.name, outputs, every


def build_from_args(args):
    from attnprobe.service import KeyStore, ServiceOptions, build_app

    fn, d, name, outputs, every = served_callable(args)
    options = ServiceOptions(d=d, max_batch=args.max_batch, max_length=args.max_length, name=name, outputs=outputs,
                             every_position=every)
    keys = KeyStore(api_keys(args), budget=args.budget, rate=args.rate, burst=args.max_batch)
    return build_app(fn, options, keys), options


def run(args) -> int:
    from attnprobe.service.server import serve_forever

    app, options = build_from_args(args)

    def announce(url: str) -> None:
        k = "" if options.outputs is None else f", {options.outputs} outputs"
        print(f"serving {options.name} (d={options.d}{k}) on {url}  (POST /v1/query, GET /v1/info, /v1/usage, "
              "/healthz, /docs)", flush=True)

    serve_forever(app, args.host, args.port, log_level="warning" if args.quiet else "info", announce=announce)
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve a model as a prediction API (to attack it with extract --url)")
    src = s.add_argument_group("what to serve")
    src.add_argument("--target", metavar="FILE.npz", help="a saved model")
    src.add_argument("--oracle", metavar="MODULE:ATTR", help="a callable (B,N,d)->(B,); the cwd is importable")
    src.add_argument("--d", type=positive_int, help="input width of --oracle")
    src.add_argument("--hf-dir", metavar="DIR", help="a Hugging Face model folder whose block --block to serve")
    src.add_argument("--block", type=int, metavar="L",
                     help="--hf-dir: serve whole block L (hidden states in, every position out; docs/block.md)")
    src.add_argument("--dtype", choices=PRECISIONS, default="float64",
                     help="precision a --target or --hf-dir block computes its answers in (default float64)")
    net = s.add_argument_group("server")
    net.add_argument("--host", default="127.0.0.1")
    net.add_argument("--port", type=port, default=8000, help="TCP port (0: any free port; default 8000)")
    net.add_argument("--api-key", action="append", metavar="KEY", help="an accepted key (repeatable); "
                     f"or --api-key-file, or {KEY_ENV} from the environment (keeps it out of the process list)")
    net.add_argument("--api-key-file", metavar="F", help="accepted keys, one a line")
    net.add_argument("--budget", type=nonneg_int, help="queries each key may spend (429 past it)")
    net.add_argument("--rate", type=positive_float, help="queries per second each key may spend (429 above it)")
    net.add_argument("--max-batch", type=positive_int, default=1024, help="largest batch per request (413 above it)")
    net.add_argument("--max-length", type=positive_int, default=512,
                     help="longest sequence per request (413 above it)")
    net.add_argument("--quiet", action="store_true", help="log warnings only")
    answer_chain.add_arguments(s)
    s.set_defaults(func=run)
