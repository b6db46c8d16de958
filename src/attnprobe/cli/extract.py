"""``attnprobe extract``: load an oracle, run a learner, write OUT.npz and OUT.json."""

from __future__ import annotations

from attnprobe.cli.common import print_summary
from attnprobe.errors import ConfigError
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
        from attnprobe.oracles.wrappers import answer_noise

        tol = args.tolerance if args.tolerance is not None else answer_noise(oracle).tolerance
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
        return extract_membership_paper(oracle, w_bound=args.w_bound, margin=args.margin, eps_w=args.eps_w,
                                        delta=args.delta, samples=args.samples, seed=args.seed,
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

    return extract_nuclear(oracle, rank=args.rank, measurements=args.measurements, solver=args.solver,
                           bias=not args.no_bias, seed=args.seed, progress=progress)


def _run_transformer(oracle, args, progress):
    from attnprobe.learners.transformer import extract_transformer

    return extract_transformer(oracle, probes=_exact_probes(args), seed=args.seed, progress=progress,
                               sign_time_limit=args.sign_time_limit)


def _run_ffn(oracle, args, progress):
    from attnprobe.learners.ffn import extract_ffn

    return extract_ffn(oracle, seed=args.seed, progress=progress, sign_time_limit=args.sign_time_limit,
                       bias=not args.no_bias, hidden=args.hidden)


#: ``--method`` name -> runner(oracle, args, progress) -> Extraction
METHODS = {"exact": _run_exact, "lowrank": _run_lowrank, "nuclear": _run_nuclear, "robust": _run_robust,
           "membership": _run_membership, "transformer": _run_transformer, "ffn": _run_ffn}
#: methods whose probe design --probes chooses (the others have one design and refuse the option)
TAKES_PROBES = {"exact", "robust", "membership", "transformer"}


def _oracle_from_args(args) -> Oracle:
    oracle = _plain_oracle_from_args(args)
    wrapped = dict(noise=args.noise, decimals=args.round, digits=args.round_digits, cast=args.cast,
                   membership=args.membership or args.method == "membership", seed=args.noise_seed)
    if any(v for k, v in wrapped.items() if k != "seed") or args.round == 0:
        from attnprobe.oracles.wrappers import wrap_oracle

        wrap_oracle(oracle, **wrapped)
    return oracle


def _plain_oracle_from_args(args) -> Oracle:
    kw = {"budget": args.budget, "outputs": args.outputs}
    if args.answer_precision:
        kw["precision"] = args.answer_precision
    if args.target and args.oracle:
        raise ConfigError("give either --oracle MODULE:ATTR or --target FILE.npz, not both")
    if args.target:
        return oracle_from_file(args.target, dtype=args.dtype, **kw)
    if args.oracle:
        return oracle_from_spec(args.oracle, args.d, **kw)
    raise ConfigError("say what to extract: --oracle MODULE:ATTR --d D, or --target FILE.npz")


def run(args) -> int:
    oracle = _oracle_from_args(args)
    if args.method is None:  # a rank bound makes the low-rank sketch the natural choice
        args.method = "lowrank" if getattr(args, "rank", None) else "exact"
    if args.method not in METHODS:
        raise ConfigError(f"unknown --method {args.method!r}; choose one of {', '.join(METHODS)}")
    if args.probes and args.method not in TAKES_PROBES:
        raise ConfigError(f"--method {args.method} has a single probe design; drop --probes {args.probes}")
    progress = Progress(f"extract ({args.method})", enabled=not args.quiet)
    try:
        res = METHODS[args.method](oracle, args, progress)
    finally:
        progress.close()
    paths = res.save(args.out)
    print_summary(res, paths)
    return 0



def add_parser(sub) -> None:
    e = sub.add_parser("extract", help="extract a model from an oracle")
    src = e.add_argument_group("what to query")
    src.add_argument("--oracle", metavar="MODULE:ATTR", help="a callable (B,N,d)->(B,); the cwd is importable")
    src.add_argument("--d", type=int, help="input width of --oracle")
    src.add_argument("--target", metavar="FILE.npz", help="a saved model to use as the oracle")
    src.add_argument("--dtype", choices=PRECISIONS, default="float64",
                     help="precision a --target computes its answers in (default float64)")
    src.add_argument("--answer-precision", choices=PRECISIONS,
                     help="precision of the oracle's answers if known (sets the rounding floor)")
    e.add_argument("--method", default=None,
                   help="learner: " + ", ".join(METHODS) + " (default: lowrank when --rank is given, else exact)")
    e.add_argument("--probes", choices=PROBES + ("paper", "bisection"),
                   help="probe design: exact: orthogonal (default), basis (= paper), gaussian; robust: orthogonal "
                        "(default) or paper (Thm 6.1); membership: bisection (default) or paper (App. B)")
    e.add_argument("--no-bias", action="store_true", help="learn the paper's bias-free model (d+d² queries)")
    e.add_argument("--sign-time-limit", type=float, default=5.0, metavar="SEC",
                   help="transformer/ffn: seconds the 0/1 program may spend on neuron orientations (m > d)")
    e.add_argument("--budget", type=int, help="refuse to spend more than this many queries")
    e.add_argument("--outputs", type=int, metavar="K",
                   help="the oracle answers K numbers per sequence (e.g. logits); default: taken from its first answer")
    e.add_argument("--hidden", type=int, metavar="M",
                   help="ffn: hidden width if known (neurons no answer shows are then reported as unidentifiable)")
    lr = e.add_argument_group("low-rank heads (--method lowrank / nuclear)")
    lr.add_argument("--rank", type=int, help="rank bound r of W (head dimension); lowrank detects it when omitted")
    lr.add_argument("--oversample", type=int,
                    help="lowrank: extra sketch directions/probes for noisy answers (default 0 for float64, "
                         "4 for coarser answers)")
    lr.add_argument("--measurements", type=int,
                    help="nuclear: number m of rank-one measurements (default from the measured phase transition)")
    lr.add_argument("--solver", default="auto", help="nuclear: cvxpy solver (default auto = SCS, then CLARABEL)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--out", required=True, metavar="OUT.npz", help="recovered arrays; a JSON summary goes beside")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    imp = e.add_argument_group("imperfect answers (wrap the oracle; Sec. 6, App. B)")
    imp.add_argument("--noise", metavar="KIND:LEVEL",
                     help="add noise: avq:τ (deterministic, |err| ≤ τ), adversarial:τ, gaussian:σ, uniform:σ")
    imp.add_argument("--noise-seed", type=int, default=0)
    imp.add_argument("--round", type=int, metavar="K", help="round answers to K decimals")
    imp.add_argument("--round-digits", type=int, metavar="K", help="round answers to K significant digits")
    imp.add_argument("--cast", choices=[p for p in PRECISIONS if p != "float64"],
                     help="round inputs and answers to this precision (bfloat16 via ml_dtypes)")
    imp.add_argument("--membership", action="store_true",
                     help="answer only 1[f(X) > 0] (App. B; implied by --method membership)")
    rob = e.add_argument_group("robust / membership learners")
    rob.add_argument("--tolerance", type=float, help="the answers' additive error bound τ (default: from --noise)")
    rob.add_argument("--w-bound", type=float, help="known W ≥ 2 with ‖W‖_F ≤ W (--probes paper)")
    rob.add_argument("--margin", type=float, help="known μ ≤ min nonzero |v_i| (--probes paper)")
    rob.add_argument("--queries", type=int, help="robust: queries to plan for (extra ones shrink the error)")
    rob.add_argument("--max-scale", type=float, help="robust: largest probe norm the API accepts")
    rob.add_argument("--no-retries", action="store_true",
                     help="robust: never re-measure a probe (spend exactly --queries; unresolved weights clipped)")
    rob.add_argument("--eps-w", type=float, default=0.1, help="membership --probes paper: target ε_W")
    rob.add_argument("--delta", type=float, default=0.05, help="membership --probes paper: failure probability")
    rob.add_argument("--samples", type=int, help="membership --probes paper: sign samples (overrides Thm B.1's k)")
    e.set_defaults(func=run)
