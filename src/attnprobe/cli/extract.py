"""``attnprobe extract``: load an oracle, run a learner, write OUT.npz and OUT.json."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from attnprobe.cli import answer_chain, hf, remote
from attnprobe.cli.common import (assumed_precision, check_outcome, hf_inputs, nonneg_int, plan_outputs,
                                  positive_float, positive_int, print_summary, refuse_memory, track)
from attnprobe.errors import AttnprobeError, ConfigError, InputNormError, RecoveryError, SeparationError
from attnprobe.learners.core import registry
from attnprobe.models import PRECISIONS
from attnprobe.oracles import Oracle, oracle_from_file, oracle_from_spec
from attnprobe.progress import Progress


#: head learners hold W (d x d float64) and about as much again in probes and work arrays
HEAD_BYTES_PER_D2 = 4 * 8


def _given_options(args) -> dict:
    """The learner options given on the command line (every registered option is an ``args`` attribute)."""
    return {name: getattr(args, name, None) for name in registry.options()}


def _refuse_foreign_options(learner, args) -> None:
    """An option of other learners given to this one is refused, never silently ignored."""
    for name, (option, users) in registry.options().items():
        value = getattr(args, name, None)
        if value is None or value is False or name in learner.option_names:
            continue
        if name == "probes":
            raise ConfigError(f"--method {learner.name} has a single probe design; drop --probes {value}",
                              param="probes")
        raise ConfigError(f"--method {learner.name} does not use {option.flag} (it is for --method "
                          f"{' / '.join(sorted(users))}); drop {option.flag}", param=name)


def _refuse_dtype_without_model(args) -> None:
    """``--dtype`` sets the precision a saved model or Hugging Face module computes in; a callable, a URL or a log
    answers in its own, so it would be ignored: refused."""
    if args.dtype != "float64" and not (args.target or args.hf_dir):
        source = "--oracle" if args.oracle else "--url" if args.url else "--replay" if args.replay else "the oracle"
        raise ConfigError(f"--dtype {args.dtype} sets the precision a --target or --hf-dir model computes in; "
                          f"{source} answers in its own: declare it with --answer-precision {args.dtype}, or cast "
                          f"its answers with --cast {args.dtype}", param="dtype")


def _oracle_from_args(args, chain, learner) -> Oracle:
    _refuse_dtype_without_model(args)
    # the answers' precision: as declared, else a saved model's or HF module's --dtype, else read from the answers
    precision = args.answer_precision or (None if (args.target or args.hf_dir) and not args.replay else "auto")
    oracle = remote.source_oracle(args, budget=args.budget, precision=precision, chain=chain)
    oracle = oracle if oracle is not None else _plain_oracle_from_args(args, chain, precision, learner)
    oracle.max_input_norm = args.max_input_norm
    oracle.declare_positions(getattr(args, "positions", None))
    return oracle


def _plain_oracle_from_args(args, chain, precision, learner) -> Oracle:
    kw = {"budget": args.budget, "outputs": args.outputs, "chain": chain, "precision": precision}
    if args.target and args.oracle:
        raise ConfigError("give either --oracle MODULE:ATTR or --target FILE.npz, not both", param="oracle")
    kw["log"] = remote.open_log(args, chain)  # built with the Oracle; a log of another oracle is refused here
    if args.hf_dir:
        return hf.oracle_from_args(args, kw)
    if args.target:  # a saved model's precision is its --dtype unless --answer-precision says otherwise
        oracle = oracle_from_file(args.target, dtype=args.dtype, **kw)
        if args.d is not None and args.d != oracle.d:
            raise ConfigError(f"--d {args.d} contradicts --target {args.target}, whose model has d = {oracle.d}; "
                              "drop --d", param="d")
        return oracle
    if args.oracle:
        if args.d is not None and learner.recovers == "head" and not args.estimate:  # an estimate holds nothing
            refuse_memory(HEAD_BYTES_PER_D2 * args.d**2, f"extracting a d = {args.d} head", "d")
        return oracle_from_spec(args.oracle, args.d, **kw)
    raise ConfigError("say what to extract: --oracle MODULE:ATTR --d D, --target FILE.npz or --hf-dir DIR --layer L",
                      param="oracle")


def run(args) -> int:
    """Everything that can be refused is refused before the first query: options, output paths, memory."""
    if args.method is None and args.hf_dir and args.row is None:  # the folder's family says which learner
        args.method = "block" if getattr(args, "block", None) is not None else hf.default_method(args.hf_dir)
    if args.method is None:  # a rank bound makes the low-rank sketch the natural choice
        args.method = "lowrank" if getattr(args, "rank", None) else "exact"
    if args.method not in {e.name for e in registry.learners()}:
        raise ConfigError(f"unknown --method {args.method!r}; choose one of "
                          f"{', '.join(e.name for e in registry.learners())}", param="method")
    learner = registry.learner(args.method)
    _refuse_foreign_options(learner, args)
    hf.refuse_stray(args)
    if args.hf_dir and getattr(args, "block", None) is not None:
        hf.block_defaults(args, learner)  # the folder and L checked first; H from its config
    elif args.hf_dir and args.estimate:
        hf.estimate_defaults(args, learner)  # H and the KV groups from its config, as the run reads them
    # a learner of yes/no answers only implies --membership
    chain = answer_chain.chain_from_args(args, membership=not learner.capabilities.value_answers)
    if chain.membership and not learner.capabilities.membership_answers:
        raise ConfigError(f"--membership makes the answers 0/1, which --method {args.method} cannot use; "
                          "use --method membership", param="membership")
    options = learner.resolve(_given_options(args))
    if not learner.ready(options):
        helps = {o.name: o.help for o in learner.options}
        flags = " or ".join(f"--{n.replace('_', '-')} ({helps[n]})" if n in helps else "--" + n.replace("_", "-")
                            for n in learner.needs_one_of)
        raise ConfigError(f"--method {learner.name} needs {flags}", param=learner.needs_one_of[0])
    if args.estimate:
        return _print_estimate(args, _estimate_oracle(args, chain, learner))
    if args.price_per_1k is not None:
        raise ConfigError("--price-per-1k prices an estimate; add --estimate", param="price_per_1k")
    if args.out is None:
        raise ConfigError("extract needs --out OUT.npz (or --estimate to print the queries a run would need)",
                          param="out")
    inputs = [args.target, getattr(args, "log", None), Path(args.hf_dir) / "model.safetensors" if args.hf_dir else None]
    inputs += [options[o.name] for o in learner.options if o.input_file]
    if args.oracle and ":" in args.oracle:
        inputs.append(Path(args.oracle.split(":", 1)[0].replace(".", "/") + ".py"))
    if args.hf_dir:  # a folder that is no model folder is named as such first
        from attnprobe.oracles.hf_folder import check_model_dir

        check_model_dir(args.hf_dir)
    files, folders = hf_inputs(args.hf_dir)  # its files, and the folders they live in through symlinks
    plan_outputs(args.out, inputs + files, folders=folders)
    oracle = _oracle_from_args(args, chain, learner)
    if options.get("hidden"):  # the recovered first layer alone holds d·m floats; a smooth activation's first
        m = options["hidden"]  # derivatives, K·C ≥ 1.3m directions at n ≥ 1.25m points, ≥ 1.6m² (learner.plan)
        smooth = options.get("activation") not in (None, "relu")
        refuse_memory(8.0 * max(m * oracle.d, 1.6 * m * m if smooth else 0),
                      f"an FFN of --hidden {m} units at d = {oracle.d}", "hidden")
    track(args, oracle)
    progress = Progress(f"extract ({args.method})", enabled=not args.quiet)
    try:
        res = _run_with_retry(learner, oracle, args, progress, options)
    except AttnprobeError as exc:
        raise _clipping_cause(oracle, args, learner, exc) or exc
    finally:
        progress.close()
    res.details["oracle"] = remote.describe(oracle)
    if getattr(oracle, "positions_source", None):  # the victim answered every row (declared or already read)
        if oracle.positions in ("causal", "bidirectional"):
            res.details["positions"] = oracle.positions  # the saved model answers every row too
    if res.passed is False:
        res.notes.append(assumed_precision(oracle))
    failure = check_outcome(res, args.keep_failed)
    if failure is not None and not args.keep_failed:
        failure = _clipping_cause(oracle, args, learner) or failure
    paths = res.save(args.out) if failure is None or args.keep_failed else None
    print_summary(res, paths)
    if failure is not None:
        raise failure
    return 0


#: a separation misfit at most this many times its tolerance is marginal: another seed's probes may pass (a
#: float32 DistilBERT layer, d = 64, 8 heads, folder seed 1: 69× with seed 0, passed with seeds 1, 2, 3), while a
#: layer that is not a sum of heads misses by far more (a float32 softmax read as float64: 3.7e3×; an extra
#: attended row, add_bias_kv: 4e10×)
MARGINAL_MISFIT = 1e3


def _run_with_retry(learner, oracle, args, progress, options):
    """Run the learner; when the heads did not separate by a marginal misfit (≤ :data:`MARGINAL_MISFIT` × the
    tolerance: an unlucky probe, not a wrong model), run it once more with a fresh seed and say so. The first
    run's queries are counted in the result (phase ``"first seed"``)."""
    before = oracle.queries
    try:
        return learner.fn(oracle, seed=args.seed, progress=progress, **options)
    except SeparationError as exc:
        if exc.misfit is None or not exc.misfit <= MARGINAL_MISFIT * exc.tolerance:
            raise
        first, seed, spent = exc, args.seed + 1, oracle.queries - before
    try:
        res = learner.fn(oracle, seed=seed, progress=progress, **options)
    except AttnprobeError as exc:
        raise type(exc)(f"{exc} (retried once with seed {seed} after a marginal misfit with seed {args.seed}: "
                        f"{first.misfit:.1e} > {first.tolerance:.1e})") from exc
    res.queries += spent
    res.queries_by_phase = {"first seed": spent, **res.queries_by_phase}
    res.notes.append(f"retried once with seed {seed}: with seed {args.seed} the heads did not separate by a marginal "
                     f"misfit ({first.misfit:.1e} > {first.tolerance:.1e}); the first run's {spent} queries are "
                     "counted (phase 'first seed')")
    return res


def _estimate_oracle(args, chain, learner) -> Oracle:
    """The oracle an estimate reads its width and outputs from: built without the query log (no file is created;
    ``--replay`` reads its log) and without a budget; it is never asked a query."""
    import copy

    quiet = copy.copy(args)
    quiet.budget = None
    if not args.replay:
        quiet.log = None
    return _oracle_from_args(quiet, chain, learner)


def _print_estimate(args, oracle) -> int:
    """``--estimate``: the queries the run would ask (and their price), asking none: an undeclared precision is
    taken as float64 (not read from the answers, which would take queries), and the line says so."""
    from attnprobe._validation import check_int
    from attnprobe.learners.core.estimate import duration, estimate_queries

    check_int(getattr(args, "rank", None), "rank", min_value=1, max_value=oracle.d, allow_none=True)  # as a run
    declared = oracle.detector is None
    precision = (oracle.precision or "float64") if declared else "float64"
    entry = registry.learner(args.method)
    try:
        est = estimate_queries(args.method, oracle.d, outputs=oracle.outputs, precision=precision,
                               price_per_1k=args.price_per_1k, positions=_declared_rows(oracle),
                               layout=hf.block_layout(args),
                               **{name: getattr(args, name, None) for name in entry.option_names})
    except ConfigError as exc:
        flag = entry.option(exc.param).flag if exc.param in entry.option_names else None
        raise ConfigError(f"--estimate: {exc} (give {flag})" if flag else str(exc), param=exc.param) from exc
    assumed = (f"answers in {precision}" if declared else
               "answers assumed float64 (not read: --answer-precision declares coarser ones)")
    line = (f"{est.method} at d={est.d}: about {est.queries} queries (expected range {est.low}–{est.high}; "
            f"{est.basis}; {assumed}); {oracle.queries} asked")
    if est.seconds is not None:
        line += f"; expected computing time about {duration(est.seconds)}"
    if est.peak_bytes is not None:
        line += f", peak memory about {est.peak_bytes / 2**30:.1f} GiB"
    if args.budget is not None and est.high > args.budget:
        line += f"; more than --budget {args.budget} may be needed"
    if est.cost is not None and not math.isfinite(est.cost):
        raise ConfigError(f"--price-per-1k {args.price_per_1k:g} makes the cost of {est.queries} queries overflow; "
                          "give the price in a larger unit", param="price_per_1k")
    if est.cost is not None:
        line += f"; cost about {est.cost:.4g} at {args.price_per_1k:g} per 1,000 queries"
    print(line)
    return 0


def _declared_rows(oracle) -> str | None:
    """What the oracle's rows are when declared (``--positions``, or by the callable): the estimate of an
    every-position run; None (the last position) when not declared, since reading it would take queries."""
    return oracle.positions if getattr(oracle, "positions_source", None) == "declared" else None


def _clipping_cause(oracle, args, learner, exc=None):
    """When a run of an attention learner failed: the error naming input clipping, with the bound read from the
    answers, if they show it (an attention target answers a length-1 query affinely in its row, so clipping shows
    in the answers; a refusal for a declared bound, ``exc`` an :class:`InputNormError`, stands); before that, when
    the model did not fit the answers (a failed check or a :class:`RecoveryError`), the error naming a layer that
    is not a sum of softmax heads over its input (:func:`~attnprobe.oracles.input_bound.not_affine_cause`)."""
    attention = learner.recovers in ("head", "multi_head") and learner.capabilities.value_answers
    if not attention or args.membership or getattr(args, "replay", False):
        return None
    if isinstance(exc, InputNormError):
        return None
    from attnprobe.oracles.input_bound import diagnose_clipping, not_affine_cause

    fitted = oracle.queries > 0 and (exc is None or isinstance(exc, RecoveryError))
    if fitted:  # answers were asked and the model did not fit them: is the layer a sum of heads at all?
        try:
            cause = not_affine_cause(oracle, seed=args.seed)
        except AttnprobeError:
            cause = None
        if cause is not None:
            return cause
    return diagnose_clipping(oracle, seed=args.seed)


def learner_type(option):
    """argparse ``type`` of a learner option: the registry's parsing and constraints."""
    def parse(text: str):
        try:
            return option.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = option.type.__name__
    return parse


def add_learner_options(parser) -> None:
    """One flag per registered learner option (``--`` + its name with dashes), typed by its constraints and
    helped by the learners that use it; every flag defaults to None ("not given")."""
    g = parser.add_argument_group("learner options (each is for the learners named in its help)")
    for name, (option, users) in registry.options().items():
        where = " / ".join(users)
        if option.type is bool:
            g.add_argument(option.flag, action="store_true", help=f"{where}: {option.help}")
            continue
        kw = {"choices": option.choices} if option.choices else {"type": learner_type(option)}
        help_ = option.help if option.help.startswith(users[0] + ": ") else f"{where}: {option.help}"
        g.add_argument(option.flag, metavar=option.metavar, help=help_, **kw)


def add_parser(sub) -> None:
    e = sub.add_parser("extract", help="extract a model from an oracle")
    src = e.add_argument_group("what to query")
    src.add_argument("--oracle", metavar="MODULE:ATTR", help="a callable (B,N,d)->(B,); the cwd is importable")
    src.add_argument("--d", type=positive_int, help="input width of --oracle")
    src.add_argument("--target", metavar="FILE.npz", help="a saved model to use as the oracle")
    src.add_argument("--dtype", choices=PRECISIONS, default="float64",
                     help="precision a --target (or --hf-dir module) computes its answers in (default float64); "
                          "refused with --oracle, --url and --replay (they answer in their own: "
                          "--answer-precision declares it, --cast applies one)")
    hf.add_source_arguments(src)
    src.add_argument("--answer-precision", choices=remote.PRECISION_CHOICES,
                     help="precision of the oracle's answers if known (sets the rounding floor); default auto: "
                          "read from the answers (a --target answers in its --dtype)")
    remote.add_arguments(e)
    e.add_argument("--method", default=None,
                   help="learner: " + ", ".join(f"{x.name} ({x.help})" for x in registry.learners())
                        + " (default: lowrank when --rank is given, else exact)")
    e.add_argument("--budget", type=nonneg_int, help="refuse to spend more than this many queries")
    e.add_argument("--max-input-norm", type=positive_float, metavar="R",
                   help="the oracle accepts input rows of norm at most R: a batch with a longer row is refused "
                        "before it is sent (the largest norm used is in OUT.json details.oracle)")
    e.add_argument("--positions", choices=("auto", "causal", "bidirectional", "positional"), default="auto",
                   help="an oracle answering every position (B, N, K): causal (row i = the answer on X[:i+1]), "
                        "bidirectional (no position terms: row i = the answer with x_i moved last) or positional; "
                        "default auto: read from one probe of 3 sequences")
    e.add_argument("--outputs", type=positive_int, metavar="K",
                   help="the oracle answers K numbers per sequence (e.g. logits); default: taken from its first answer")
    e.add_argument("--seed", type=nonneg_int, default=0)
    e.add_argument("--out", metavar="OUT.npz", help="recovered arrays; a JSON summary goes beside")
    e.add_argument("--estimate", action="store_true",
                   help="print the queries the run would need (exact, lowrank, multihead with --heads and --rank, "
                        "or with --heads and --outputs K for whole output rows, ffn with --hidden) and exit "
                        "without asking any")
    e.add_argument("--price-per-1k", type=positive_float, metavar="PRICE",
                   help="with --estimate: price per 1,000 queries")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.add_argument("--keep-failed", action="store_true",
                   help="write OUT.npz/OUT.json even when the functional check fails (exit code stays 3)")
    add_learner_options(e)
    answer_chain.add_arguments(e)  # --defense, --cast, --clip, --noise, --round, ... (a learner of yes/no answers
    # implies --membership)
    e.set_defaults(func=run)
