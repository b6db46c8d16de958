"""``attnprobe serve``: put a model behind the prediction API (docs/architecture.md, "Served API") to attack it over HTTP."""

from __future__ import annotations

import os
from pathlib import Path

from attnprobe.cli import answer_chain
from attnprobe.cli.common import positive_int
from attnprobe.errors import ConfigError
from attnprobe.models import PRECISIONS
from attnprobe.oracles.http import KEY_ENV


def api_keys(args) -> list[str]:
    keys = list(args.api_key or [])
    if args.api_key_file:
        path = Path(args.api_key_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read --api-key-file {path}: {exc.strerror or exc}") from exc
        keys += [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not keys and os.environ.get(KEY_ENV):
        keys.append(os.environ[KEY_ENV])
    if not keys:
        raise ConfigError(f"give the server at least one key: --api-key KEY, --api-key-file F or {KEY_ENV}")
    return keys


def served_callable(args):
    """The callable to serve and its width: a saved model (``--target``) or ``--oracle MODULE:ATTR``, answering
    through the answer chain of the shared defence flags (``--defense``, ``--cast``, ``--noise``, ...)."""
    from attnprobe.oracles import oracle_from_file, oracle_from_spec

    if bool(args.target) == bool(args.oracle):
        raise ConfigError("say what to serve: either --target FILE.npz or --oracle MODULE:ATTR --d D")
    chain = answer_chain.chain_from_args(args)
    oracle = (oracle_from_file(args.target, dtype=args.dtype, chain=chain) if args.target
              else oracle_from_spec(args.oracle, args.d, chain=chain))
    return oracle.fn, oracle.d, oracle.name


def build_from_args(args):
    from attnprobe.service import KeyStore, ServiceOptions, build_app

    fn, d, name = served_callable(args)
    options = ServiceOptions(d=d, max_batch=args.max_batch, max_length=args.max_length, name=name)
    keys = KeyStore(api_keys(args), budget=args.budget, rate=args.rate, burst=args.max_batch)
    return build_app(fn, options, keys), options


def run(args) -> int:
    from attnprobe.service.server import serve_forever

    app, options = build_from_args(args)
    print(f"serving {options.name} (d={options.d}) on http://{args.host}:{args.port}  "
          f"(POST /v1/query, GET /v1/info, /v1/usage, /healthz, /docs)", flush=True)
    serve_forever(app, args.host, args.port, log_level="warning" if args.quiet else "info")
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve a model as a prediction API (to attack it with extract --url)")
    src = s.add_argument_group("what to serve")
    src.add_argument("--target", metavar="FILE.npz", help="a saved model")
    src.add_argument("--oracle", metavar="MODULE:ATTR", help="a callable (B,N,d)->(B,); the cwd is importable")
    src.add_argument("--d", type=positive_int, help="input width of --oracle")
    src.add_argument("--dtype", choices=PRECISIONS, default="float64",
                     help="precision a --target computes its answers in (default float64)")
    net = s.add_argument_group("server")
    net.add_argument("--host", default="127.0.0.1")
    net.add_argument("--port", type=int, default=8000)
    net.add_argument("--api-key", action="append", metavar="KEY", help="an accepted key (repeatable); "
                     f"or --api-key-file, or {KEY_ENV} from the environment (keeps it out of the process list)")
    net.add_argument("--api-key-file", metavar="F", help="accepted keys, one a line")
    net.add_argument("--budget", type=int, help="queries each key may spend (429 past it)")
    net.add_argument("--rate", type=float, help="queries per second each key may spend (429 above it)")
    net.add_argument("--max-batch", type=int, default=1024, help="largest batch per request (413 above it)")
    net.add_argument("--max-length", type=int, default=512, help="longest sequence per request (413 above it)")
    net.add_argument("--quiet", action="store_true", help="log warnings only")
    answer_chain.add_arguments(s)
    s.set_defaults(func=run)
