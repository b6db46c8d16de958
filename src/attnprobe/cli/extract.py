"""``attnprobe extract``: load an oracle, run a learner, write OUT.npz and OUT.json."""

from __future__ import annotations

from pathlib import Path

from attnprobe.cli import answer_chain, hf, remote
from attnprobe.cli.common import (check_outcome, finite_float, nonneg_int, plan_outputs, positive_float, positive_int,
                                  print_summary, refuse_memory, track)
from attnprobe.errors import AttnprobeError, ConfigError, InputNormError
from attnprobe.learners import PROBES, extract_exact
from attnprobe.models import PRECISIONS
from attnprobe.oracles import Oracle, oracle_from_file, oracle_from_spec
from attnprobe.progress import Progress


def _exact_probes(args) -> str:
    """--probes for Thm 4.1 learners: orthogonal by default; ``paper`` means the paper's basis probes."""
    probes = args.probes or "orthogonal"
    return "basis" if probes == "paper" else probes


def _run_exact(oracle, args, progress):
    return extract_exact(oracle, probes=_exact_probes(args), bias=not args.no_bias, seed=args.seed,
                         progress=progress)


def _run_robust(oracle, args, progress):
    from attnprobe.learners.robust import MAX_RETRIES, extract_robust, extract_robust_paper

    if args.probes == "paper":
        tol = args.tolerance if args.tolerance is not None else oracle.noise.tolerance
        return extract_robust_paper(oracle, w_bound=args.w_bound, margin=args.margin, tolerance=tol,
                                    seed=args.seed, progress=progress)
    if args.probes not in (None, "orthogonal"):
        raise ConfigError(f"--method robust takes --probes paper or orthogonal (default); got {args.probes}")
    return extract_robust(oracle, bias=not args.no_bias, tolerance=args.tolerance, queries=args.queries,
                          seed=args.seed, max_scale=args.max_scale, retries=0 if args.no_retries else MAX_RETRIES,
                          progress=progress)


def _run_membership(oracle, args, progress):
    from attnprobe.learners.membership import extract_membership, extract_membership_paper

    if args.probes == "paper":
        return extract_membership_paper(oracle, w_bound=args.w_bound, margin=args.margin,
                                        eps_w=_default(args.eps_w, 0.1), delta=_default(args.delta, 0.05), samples=args.samples, seed=args.seed,
                                        progress=progress)
    if args.probes not in (None, "bisection"):
        raise ConfigError(f"--method membership takes --probes paper or bisection (default); got {args.probes}")
    return extract_membership(oracle, seed=args.seed, progress=progress)


def _run_lowrank(oracle, args, progress):
    from attnprobe.learners.lowrank import extract_lowrank

    return extract_lowrank(oracle, rank=args.rank, oversample=args.oversample, bias=not args.no_bias,
                           seed=args.seed, progress=progress)


def _run_nuclear(oracle, args, progress):
    from attnprobe.learners.nuclear import extract_nuclear

    return extract_nuclear(oracle, rank=args.rank, measurements=args.measurements, solver=args.solver or "auto",
                           solver_time_limit=_default(args.solver_time_limit, SOLVER_TIME_LIMIT),
                           bias=not args.no_bias, seed=args.seed, progress=progress)


def _run_transformer(oracle, args, progress):
    """``regions`` (default): multi-head, biased K-output FFN, residual detected; ``paper``: Sec. 4.1's route
    through TF(X) − TF(−X) (one head, bias-free FFN, one output; implied by --probes)."""
    route = args.transformer_route or ("paper" if args.probes else "regions")
    if route == "paper":
        from attnprobe.learners.transformer import extract_transformer

        return extract_transformer(oracle, probes=_exact_probes(args), seed=args.seed, progress=progress,
                                   sign_time_limit=_default(args.sign_time_limit, SIGN_TIME_LIMIT))
    if args.probes:
        raise ConfigError(f"--probes chooses the probes of --transformer-route paper; drop --probes {args.probes} "
                          "or use --transformer-route paper")
    from attnprobe.learners.transformer_multihead import extract_transformer_multihead

    return extract_transformer_multihead(oracle, seed=args.seed, progress=progress,
                                         sign_time_limit=_default(args.sign_time_limit, SIGN_TIME_LIMIT))


def _run_ffn(oracle, args, progress):
    from attnprobe.learners.ffn import extract_ffn

    return extract_ffn(oracle, seed=args.seed, progress=progress,
                       sign_time_limit=_default(args.sign_time_limit, SIGN_TIME_LIMIT), bias=not args.no_bias,
                       hidden=args.hidden)


def _default(value, default):
    return default if value is None else value


#: nuclear: refuse when the solver is estimated to take longer (learners.nuclear.SOLVER_TIME_LIMIT)
SOLVER_TIME_LIMIT = 300.0
#: seconds the 0/1 orientation program of transformer/ffn may take by default (learners.ffn.SIGN_TIME_LIMIT)
SIGN_TIME_LIMIT = 5.0


def load_subspaces(path) -> list:
    """Head subspace bases from an .npz: an array ``subspaces`` (or ``E``) of shape (H, d, d_h), or one
    (d, d_h) array per head (in file order)."""
    from pathlib import Path

    import numpy as np

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"--subspaces file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:
        raise ConfigError(f"cannot read --subspaces {path} as an .npz file: {exc}") from exc
    for key in ("subspaces", "E"):
        if key in arrays:
            return list(arrays[key])
    if not arrays:
        raise ConfigError(f"--subspaces {path} holds no arrays; save an (H, d, d_h) array named 'subspaces'")
    return list(arrays.values())


def _run_multihead(oracle, args, progress):
    from attnprobe.learners.multihead import extract_multihead

    subspaces = load_subspaces(args.subspaces) if args.subspaces else None
    method = "subspaces" if subspaces is not None else (args.multihead_learner or "auto")
    return extract_multihead(oracle, heads=args.heads, max_heads=args.max_heads, subspaces=subspaces,
                             bias=not args.no_bias, method=method, rank=args.rank, seed=args.seed,
                             progress=progress)


#: ``--method`` name -> runner(oracle, args, progress) -> Extraction
METHODS = {"exact": _run_exact, "lowrank": _run_lowrank, "nuclear": _run_nuclear, "robust": _run_robust,
           "membership": _run_membership, "transformer": _run_transformer, "ffn": _run_ffn,
           "multihead": _run_multihead}
#: library parameter -> the flag that sets it: ``main`` rewrites "the 'rank' parameter" in an error into "--rank"
PARAM_FLAGS = {"rank": "--rank", "oversample": "--oversample", "measurements": "--measurements",
               "solver": "--solver", "probes": "--probes", "seed": "--seed", "budget": "--budget", "d": "--d",
               "tolerance": "--tolerance", "w_bound": "--w-bound", "margin": "--margin", "queries": "--queries",
               "max_scale": "--max-scale", "eps_w": "--eps-w", "delta": "--delta", "samples": "--samples",
               "sign_time_limit": "--sign-time-limit", "hidden": "--hidden", "outputs": "--outputs",
               "heads": "--heads", "max_heads": "--max-heads", "subspaces": "--subspaces"}
#: methods whose probe design --probes chooses (the others have one design and refuse the option)
TAKES_PROBES = {"exact", "robust", "membership", "transformer"}
#: method-specific options (argparse dests) and the methods that use them; giving one to another method is an
#: error rather than silently ignored. A method missing from every set (e.g. added later) is not restricted.
METHOD_OPTIONS = {
    "no_bias": {"exact", "lowrank", "nuclear", "robust", "multihead", "ffn"}, "hidden": {"ffn"},
    "heads": {"multihead"}, "max_heads": {"multihead"}, "subspaces": {"multihead"}, "multihead_learner": {"multihead"},
    "rank": {"lowrank", "nuclear", "multihead"}, "oversample": {"lowrank"},
    "measurements": {"nuclear"}, "solver": {"nuclear"}, "solver_time_limit": {"nuclear"},
    "tolerance": {"robust"}, "queries": {"robust"}, "max_scale": {"robust"}, "no_retries": {"robust"},
    "w_bound": {"robust", "membership"}, "margin": {"robust", "membership"},
    "eps_w": {"membership"}, "delta": {"membership"}, "samples": {"membership"},
    "sign_time_limit": {"transformer", "ffn"}, "transformer_route": {"transformer"},
}
#: head methods hold W (d x d float64) and about as much again in probes and work arrays
HEAD_BYTES_PER_D2 = 4 * 8


def _refuse_foreign_options(args) -> None:
    known = set().union(*METHOD_OPTIONS.values())
    if args.method not in known:
        return
    for dest, methods in METHOD_OPTIONS.items():
        value = getattr(args, dest, None)
        if value is not None and value is not False and args.method not in methods:
            flag = "--" + dest.replace("_", "-")
            raise ConfigError(f"--method {args.method} does not use {flag} (it is for --method "
                              f"{' / '.join(sorted(methods))}); drop {flag}")


def _oracle_from_args(args, chain) -> Oracle:
    # the answers' precision: as declared, else a saved model's or HF module's --dtype, else read from the answers
    precision = args.answer_precision or (None if (args.target or args.hf_dir) and not args.replay else "auto")
    oracle = remote.source_oracle(args, budget=args.budget, precision=precision, chain=chain)
    oracle = oracle if oracle is not None else _plain_oracle_from_args(args, chain, precision)
    oracle.max_input_norm = args.max_input_norm
    return oracle


def _plain_oracle_from_args(args, chain, precision) -> Oracle:
    kw = {"budget": args.budget, "outputs": args.outputs, "chain": chain, "precision": precision}
    if args.target and args.oracle:
        raise ConfigError("give either --oracle MODULE:ATTR or --target FILE.npz, not both")
    kw["log"] = remote.open_log(args, chain)  # built with the Oracle; a log of another oracle is refused here
    if args.hf_dir:
        return hf.oracle_from_args(args, kw)
    if args.target:  # a saved model's precision is its --dtype unless --answer-precision says otherwise
        oracle = oracle_from_file(args.target, dtype=args.dtype, **kw)
        if args.d is not None and args.d != oracle.d:
            raise ConfigError(f"--d {args.d} contradicts --target {args.target}, whose model has d = {oracle.d}; "
                              "drop --d")
        return oracle
    if args.oracle:
        if args.d is not None and args.method in (None, *HEAD_METHODS):
            refuse_memory(HEAD_BYTES_PER_D2 * args.d**2, f"extracting a d = {args.d} head")
        return oracle_from_spec(args.oracle, args.d, **kw)
    raise ConfigError("say what to extract: --oracle MODULE:ATTR --d D, --target FILE.npz or --hf-dir DIR --layer L")


def run(args) -> int:
    """Everything that can be refused is refused before the first query: options, output paths, memory."""
    if args.method is None:  # a rank bound makes the low-rank sketch the natural choice
        args.method = "lowrank" if getattr(args, "rank", None) else "exact"
    if args.method not in METHODS:
        raise ConfigError(f"unknown --method {args.method!r}; choose one of {', '.join(METHODS)}")
    if args.probes and args.method not in TAKES_PROBES:
        raise ConfigError(f"--method {args.method} has a single probe design; drop --probes {args.probes}")
    _refuse_foreign_options(args)
    hf.refuse_stray(args)
    chain = answer_chain.chain_from_args(args, membership=args.method == "membership")
    if chain.membership and args.method != "membership":
        raise ConfigError(f"--membership makes the answers 0/1, which --method {args.method} cannot use; "
                          "use --method membership")
    if args.estimate:
        return _print_estimate(args, _oracle_from_args(args, chain))
    if args.price_per_1k is not None:
        raise ConfigError("--price-per-1k prices an estimate; add --estimate")
    if args.out is None:
        raise ConfigError("extract needs --out OUT.npz (or --estimate to print the queries a run would need)")
    inputs = [args.target, getattr(args, "log", None), Path(args.hf_dir) / "model.safetensors" if args.hf_dir else None]
    if args.oracle and ":" in args.oracle:
        inputs.append(Path(args.oracle.split(":", 1)[0].replace(".", "/") + ".py"))
    plan_outputs(args.out, inputs)
    oracle = _oracle_from_args(args, chain)
    track(args, oracle)
    progress = Progress(f"extract ({args.method})", enabled=not args.quiet)
    try:
        res = METHODS[args.method](oracle, args, progress)
    except AttnprobeError as exc:
        raise _clipping_cause(oracle, args, exc) or exc
    finally:
        progress.close()
    res.details["oracle"] = remote.describe(oracle)
    if res.check and not res.check.get("passed", True):
        res.notes.append(remote.assumed_precision(oracle))
    failure = check_outcome(res, args.keep_failed)
    if failure is not None and not args.keep_failed:
        failure = _clipping_cause(oracle, args) or failure
    paths = res.save(args.out) if failure is None or args.keep_failed else None
    print_summary(res, paths)
    if failure is not None:
        raise failure
    return 0


def _print_estimate(args, oracle) -> int:
    """``--estimate``: the queries the run would ask (and their price), asking none."""
    from attnprobe.learners.estimate import estimate_queries

    try:
        est = estimate_queries(args.method, oracle.d, rank=args.rank, heads=getattr(args, "heads", None),
                               hidden=args.hidden, precision=oracle.precision or "float64", bias=not args.no_bias,
                               price_per_1k=args.price_per_1k)
    except ConfigError as exc:
        flag = {"rank": "--rank", "heads": "--heads", "hidden": "--hidden"}.get(exc.param)
        raise ConfigError(f"--estimate: {exc} (give {flag})" if flag else str(exc)) from exc
    line = (f"{est.method} at d={est.d}: about {est.queries} queries (expected range {est.low}–{est.high}; "
            f"{est.basis}); {oracle.queries} asked")
    if args.budget is not None and est.high > args.budget:
        line += f"; more than --budget {args.budget} may be needed"
    if est.cost is not None:
        line += f"; cost about {est.cost:.4g} at {args.price_per_1k:g} per 1,000 queries"
    print(line)
    return 0


#: methods that recover an attention head (W is d x d)
HEAD_METHODS = ("exact", "lowrank", "nuclear", "robust", "membership")
#: methods whose targets answer a length-1 query affinely in its row (so clipping shows in the answers)
AFFINE_AT_LENGTH_ONE = ("exact", "lowrank", "nuclear", "robust", "multihead")


def _clipping_cause(oracle, args, exc=None):
    """When a run of an attention learner failed: the error naming input clipping, with the bound read from the
    answers, if they show it (a refusal for a declared bound, ``exc`` an :class:`InputNormError`, stands)."""
    if args.method not in AFFINE_AT_LENGTH_ONE or args.membership or getattr(args, "replay", False):
        return None
    if isinstance(exc, InputNormError):
        return None
    from attnprobe.oracles.input_bound import diagnose_clipping

    return diagnose_clipping(oracle, seed=args.seed)



def add_parser(sub) -> None:
    e = sub.add_parser("extract", help="extract a model from an oracle")
    src = e.add_argument_group("what to query")
    src.add_argument("--oracle", metavar="MODULE:ATTR", help="a callable (B,N,d)->(B,); the cwd is importable")
    src.add_argument("--d", type=positive_int, help="input width of --oracle")
    src.add_argument("--target", metavar="FILE.npz", help="a saved model to use as the oracle")
    src.add_argument("--dtype", choices=PRECISIONS, default="float64",
                     help="precision a --target (or --hf-dir module) computes its answers in (default float64)")
    hf.add_source_arguments(src)
    src.add_argument("--answer-precision", choices=remote.PRECISION_CHOICES,
                     help="precision of the oracle's answers if known (sets the rounding floor); default auto: "
                          "read from the answers (a --target answers in its --dtype)")
    remote.add_arguments(e)
    e.add_argument("--method", default=None,
                   help="learner: " + ", ".join(METHODS) + " (default: lowrank when --rank is given, else exact)")
    e.add_argument("--probes", choices=PROBES + ("paper", "bisection"),
                   help="probe design: exact: orthogonal (default), basis (= paper), gaussian; robust: orthogonal "
                        "(default) or paper (Thm 6.1); membership: bisection (default) or paper (App. B)")
    e.add_argument("--no-bias", action="store_true", help="learn the paper's bias-free model (d+d² queries)")
    e.add_argument("--transformer-route", choices=["regions", "paper"],
                   help="transformer: regions (default; multi-head, FFN biases, K outputs, residual detected) or "
                        "paper (Sec. 4.1: one head, bias-free FFN, one output, via TF(X) - TF(-X); implied by --probes)")
    e.add_argument("--sign-time-limit", type=positive_float, metavar="SEC",
                   help="transformer/ffn: seconds the 0/1 program may spend on neuron orientations (m > d; default 5)")
    e.add_argument("--budget", type=nonneg_int, help="refuse to spend more than this many queries")
    e.add_argument("--max-input-norm", type=positive_float, metavar="R",
                   help="the oracle accepts input rows of norm at most R: a batch with a longer row is refused "
                        "before it is sent (the largest norm used is in OUT.json details.oracle)")
    e.add_argument("--outputs", type=positive_int, metavar="K",
                   help="the oracle answers K numbers per sequence (e.g. logits); default: taken from its first answer")
    e.add_argument("--hidden", type=positive_int, metavar="M",
                   help="ffn: hidden width if known (neurons no answer shows are then reported as unidentifiable)")
    lr = e.add_argument_group("low-rank heads (--method lowrank / nuclear)")
    lr.add_argument("--rank", type=positive_int, help="rank bound r of W (head dimension); lowrank detects it when omitted")
    lr.add_argument("--oversample", type=nonneg_int,
                    help="lowrank: extra sketch directions/probes for noisy answers (default 0 for float64, "
                         "4 for coarser answers)")
    lr.add_argument("--measurements", type=positive_int,
                    help="nuclear: number m of rank-one measurements (default from the measured phase transition)")
    lr.add_argument("--solver-time-limit", type=positive_float, metavar="SEC",
                    help="nuclear: refuse up front when the solver is estimated to take longer (default 300)")
    lr.add_argument("--solver", help="nuclear: cvxpy solver (default auto = SCS, then CLARABEL)")
    mh = e.add_argument_group("multi-head layers (--method multihead; Sec. 7, App. C)")
    heads = mh.add_mutually_exclusive_group()
    heads.add_argument("--heads", type=positive_int, metavar="H", help="number of heads (detected when omitted)")
    heads.add_argument("--max-heads", type=positive_int, metavar="H0", help="upper bound on the number of heads")
    mh.add_argument("--subspaces", metavar="FILE.npz",
                    help="known mutually orthogonal head subspaces: an (H, d, d_h) array 'subspaces' (Prop. C.2)")
    mh.add_argument("--multihead-learner", choices=["auto", "orthogonal", "generic"],
                    help="orthogonal: heads in unknown orthogonal subspaces (App. C Hessians); generic: overlapping "
                         "heads; auto (default): generic when available")
    e.add_argument("--seed", type=nonneg_int, default=0)
    e.add_argument("--out", metavar="OUT.npz", help="recovered arrays; a JSON summary goes beside")
    e.add_argument("--estimate", action="store_true",
                   help="print the queries the run would need (exact, lowrank, multihead with --heads and --rank, "
                        "ffn with --hidden) and exit without asking any")
    e.add_argument("--price-per-1k", type=positive_float, metavar="PRICE", help="with --estimate: price per 1,000 queries")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.add_argument("--keep-failed", action="store_true",
                   help="write OUT.npz/OUT.json even when the functional check fails (exit code stays 3)")
    answer_chain.add_arguments(e)  # --defense, --cast, --clip, --noise, --round, ... (--method membership implies
    # --membership)
    rob = e.add_argument_group("robust / membership learners")
    rob.add_argument("--tolerance", type=finite_float, help="the answers' additive error bound τ (default: from --noise)")
    rob.add_argument("--w-bound", type=finite_float, help="known W ≥ 2 with ‖W‖_F ≤ W (--probes paper)")
    rob.add_argument("--margin", type=finite_float, help="known μ ≤ min nonzero |v_i| (--probes paper)")
    rob.add_argument("--queries", type=positive_int, help="robust: queries to plan for (extra ones shrink the error)")
    rob.add_argument("--max-scale", type=positive_float, help="robust: largest probe norm the API accepts")
    rob.add_argument("--no-retries", action="store_true",
                     help="robust: never re-measure a probe (spend exactly --queries; unresolved weights clipped)")
    rob.add_argument("--eps-w", type=positive_float, help="membership --probes paper: target ε_W (default 0.1)")
    rob.add_argument("--delta", type=positive_float, help="membership --probes paper: failure probability (default 0.05)")
    rob.add_argument("--samples", type=positive_int, help="membership --probes paper: sign samples (overrides Thm B.1's k)")
    e.set_defaults(func=run)
