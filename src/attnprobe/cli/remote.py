"""What ``extract`` adds for remote oracles and the query log: ``--url``/``--api-key``, ``--log``/``--replay``.

The summary JSON gets ``details.oracle``: the defences between the model and the answers (``defense``, the answer
chain's spec), the answers' precision (declared or detected, with its evidence),
``queries_total`` (every answer the run used, the functional check included), ``queries_from_log`` (answered
from the log: not asked, not charged to any budget) and ``queries_asked`` (sent to the oracle and paid for);
``rows`` (output rows answered: N per sequence for an every-position oracle), ``rows_reused`` (last-position
queries answered by rows already seen: not asked) and ``positions`` (``last``, ``causal``, ``bidirectional`` or
``positional``, with ``positions_source``: declared or read from the answers).
"""

from __future__ import annotations

from pathlib import Path

from attnprobe.errors import ConfigError
from attnprobe.models import PRECISIONS

PRECISION_CHOICES = ("auto", *PRECISIONS)
#: the options of ``--url`` and their defaults (None on the command line: "not given")
URL_OPTIONS = {"concurrency": 4, "timeout": 60.0, "retries": 6, "wire": "auto"}


def add_arguments(parser) -> None:
    g = parser.add_argument_group("served models and the query log")
    g.add_argument("--url", help="an attnprobe prediction API (attnprobe serve) to query; d is read from /v1/info")
    g.add_argument("--api-key", metavar="KEY", help="the API key for --url (better: ATTNPROBE_API_KEY in the "
                                                    "environment, which keeps it out of the process list); "
                                                    "without one, requests go without a key")
    g.add_argument("--concurrency", type=int, help="--url: requests in flight (default 4)")
    g.add_argument("--timeout", type=float, help="--url: seconds per request (default 60)")
    g.add_argument("--retries", type=int,
                   help="--url: retries of a request on 429/5xx/connection errors, with backoff (default 6)")
    g.add_argument("--wire", choices=("auto", "npy", "json"),
                   help="--url: body format (default auto: binary .npy when the server offers it, else JSON)")
    g.add_argument("--log", metavar="FILE.sqlite", help="store every query and answer; a rerun with the same log "
                                                       "asks only for what the log lacks")
    g.add_argument("--replay", action="store_true", help="answer only from --log (offline rerun of a learner)")


def identity(args, chain, source: str | None = None) -> str:
    """The oracle's identity recorded in the log: its source (``source`` for a URL: the server's own account of
    itself) plus every option of its answer ``chain``."""
    from attnprobe.oracles.querylog import file_identity, identity_of

    if source is not None:
        pass
    elif args.target:
        source = f"{file_identity(args.target)} dtype={args.dtype}"
    elif getattr(args, "hf_dir", None):
        from attnprobe.cli.hf import identity as hf_identity

        source = hf_identity(args)
    elif args.oracle:
        source = f"callable {args.oracle}"
    else:
        source = f"url {args.url.rstrip('/')}"
    return identity_of(source, **chain.identity_options())


def open_log(args, chain, source: str | None = None):
    """The query log ``--log`` for this run's oracle (None without ``--log``); a log of another oracle is refused
    here, before any query. It is given to the Oracle when the Oracle is built, and closed when the run ends."""
    if not getattr(args, "log", None):
        return None
    from attnprobe.cli.common import writable_folder
    from attnprobe.oracles.querylog import QueryLog

    folder = Path(args.log).parent
    if not folder.is_dir():  # refused before any query is paid for (SQLite creates no folders)
        raise ConfigError(f"--log: the folder {folder} does not exist; create it or give another path", param="log")
    writable_folder(folder, "--log")
    args.query_log = QueryLog(args.log, identity=identity(args, chain, source), defences=chain.spec)
    return args.query_log


def _replay_oracle(args, kw):
    """``--replay``: the log answers everything. Flags that would name another oracle are refused; the defences
    the log recorded are this run's (they declare the answers' noise; nothing is re-applied to the answers)."""
    from attnprobe.oracles import Oracle
    from attnprobe.oracles.chain import AnswerChain
    from attnprobe.oracles.querylog import QueryLog, ReplayOracle

    if not args.log:
        raise ConfigError("--replay answers from a query log: give --log FILE.sqlite", param="log")
    for flag in ("target", "oracle", "url", "api_key", "hf_dir"):
        if getattr(args, flag, None):
            raise ConfigError(f"--replay answers from the query log alone, which records its own oracle; drop "
                              f"--{flag.replace('_', '-')}", param=flag)
    log = args.query_log = QueryLog(args.log, readonly=True)
    if args.d is not None and args.d != log.d:
        raise ConfigError(f"--d {args.d} does not match the width d = {log.d} recorded in {args.log}", param="d")
    if getattr(args, "outputs", None) is not None and log.outputs is not None and args.outputs != log.outputs:
        raise ConfigError(f"--outputs {args.outputs} does not match the {log.outputs} answer(s) per sequence recorded "
                          f"in {args.log}", param="outputs")
    given = kw.get("chain") or AnswerChain()
    recorded = log.defences()
    if recorded is not None:
        chain = AnswerChain.parse(recorded)
        if not given.empty and given.spec != chain.spec:
            raise ConfigError(f"the defences of this run ({given.spec}) contradict those the log {args.log} recorded "
                              f"({chain.spec}); --replay answers as recorded: give the same defence flags or none",
                              param="replay")
        if chain.membership and getattr(args, "method", None) != "membership":
            raise ConfigError(f"the log {args.log} recorded yes/no answers (membership); replay them with --method "
                              "membership", param="method")
        kw["chain"] = chain  # declared, not re-applied: every answer comes from the log
    if not args.answer_precision and log.precision:
        kw["precision"] = log.precision  # read the answers as the recording run did
    return Oracle(ReplayOracle(log), log.d, name=f"replay of {args.log}", log=log, **kw)


def source_oracle(args, **kw):
    """The oracle for ``--url`` or ``--replay`` (``None`` when neither is given), built with its query log."""
    if args.replay:
        return _replay_oracle(args, kw)
    if args.url:
        if args.target or args.oracle:
            raise ConfigError("give one oracle: --url, --oracle MODULE:ATTR or --target FILE.npz", param="url")
        from attnprobe.oracles.http import HttpOracle, oracle_from_http

        given = {k: v if (v := getattr(args, k, None)) is not None else default for k, default in URL_OPTIONS.items()}
        fn = HttpOracle(args.url, args.api_key, **given, on_retry=_say_retry)
        from attnprobe.oracles.chain import AnswerChain

        return oracle_from_http(fn, args.d, log=open_log(args, kw.get("chain") or AnswerChain(), fn.identity), **kw)
    if args.api_key:
        raise ConfigError("--api-key goes with --url", param="api_key")
    for name in URL_OPTIONS:  # an option of --url given to another oracle would be ignored
        if getattr(args, name, None) is not None:
            raise ConfigError(f"--{name} is an option of --url; drop it (the oracle here is not a URL)", param=name)
    return None


def _say_retry(message: str) -> None:
    """A retry of a request to ``--url``, said on stderr as it happens (a dead server is not silence)."""
    import sys

    print(f"attnprobe: note: {message}", file=sys.stderr, flush=True)


def describe(oracle) -> dict:
    """``details.oracle`` of the summary JSON (see the module docstring)."""
    detector = getattr(oracle, "detector", None)
    chain = getattr(oracle, "chain", None)
    out = {"name": oracle.name, "defense": "none" if chain is None else chain.spec,
           "precision": oracle.precision, "eps": oracle.eps,
           "precision_source": "detected from the answers" if detector is not None else "declared",
           "queries_total": oracle.queries, "queries_from_log": getattr(oracle, "from_log", 0),
           "queries_asked": oracle.queries - getattr(oracle, "from_log", 0),
           "max_input_norm_used": getattr(oracle, "max_input_norm_used", None),
           "max_input_norm": getattr(oracle, "max_input_norm", None),
           "rows": getattr(oracle, "rows", None), "rows_reused": getattr(oracle, "from_rows", 0)}
    if getattr(oracle, "every_position", None) is not None:
        out["positions"] = oracle.positions
        out["positions_source"] = oracle.positions_source
    if detector is not None:
        out["precision_detection"] = detector.describe()
    log = getattr(oracle, "log", None)
    if log is not None:
        out["query_log"] = log.summary()
        out["check_answered_by"] = "the query log (replay)" if log.readonly else "the oracle (never the log)"
    return out
