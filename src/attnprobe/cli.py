"""Command line: ``attnprobe extract | verify | demo | target``.

Errors from :mod:`attnprobe.errors` become one readable line and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from attnprobe.errors import AttnprobeError, ConfigError
from attnprobe.learners import PROBES, extract_exact
from attnprobe.models import PRECISIONS, AttentionHead, load_model, save_model
from attnprobe.oracles import Oracle, oracle_from_file, oracle_from_spec
from attnprobe.progress import Progress


# --------------------------------------------------------------------------------------------- methods
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

    return extract_ffn(oracle, seed=args.seed, progress=progress, sign_time_limit=args.sign_time_limit)


#: ``--method`` name -> runner(oracle, args, progress) -> Extraction
METHODS = {"exact": _run_exact, "lowrank": _run_lowrank, "nuclear": _run_nuclear, "robust": _run_robust,
           "membership": _run_membership, "transformer": _run_transformer, "ffn": _run_ffn}
#: methods whose probe design --probes chooses (the others have one design and refuse the option)
TAKES_PROBES = {"exact", "robust", "membership", "transformer"}


# --------------------------------------------------------------------------------------------- helpers
def relative_errors(true_model, result_model) -> dict[str, float]:
    """Per-parameter relative error ‖x̂ − x‖/‖x‖ (absolute error where ‖x‖ = 0)."""
    t, r = true_model.arrays(), result_model.arrays()
    out = {}
    for name in t:
        if name not in r:
            continue
        a, b = np.asarray(r[name], float), np.asarray(t[name], float)
        if a.shape != b.shape:
            raise ConfigError(f"parameter {name} has shape {a.shape} in the result but {b.shape} in the target")
        n = np.linalg.norm(b)
        out[name] = float(np.linalg.norm(a - b) / n) if n > 0 else float(np.linalg.norm(a))
    return out


def _oracle_from_args(args) -> Oracle:
    oracle = _plain_oracle_from_args(args)
    wrapped = dict(noise=args.noise, decimals=args.round, digits=args.round_digits, cast=args.cast,
                   membership=args.membership or args.method == "membership", seed=args.noise_seed)
    if any(v for k, v in wrapped.items() if k != "seed") or args.round == 0:
        from attnprobe.oracles.wrappers import wrap_oracle

        wrap_oracle(oracle, **wrapped)
    return oracle


def _plain_oracle_from_args(args) -> Oracle:
    kw = {"budget": args.budget}
    if args.answer_precision:
        kw["precision"] = args.answer_precision
    if args.target and args.oracle:
        raise ConfigError("give either --oracle MODULE:ATTR or --target FILE.npz, not both")
    if args.target:
        return oracle_from_file(args.target, dtype=args.dtype, **kw)
    if args.oracle:
        return oracle_from_spec(args.oracle, args.d, **kw)
    raise ConfigError("say what to extract: --oracle MODULE:ATTR --d D, or --target FILE.npz")


def _print_summary(res, out=None) -> None:
    s = res.summary()
    chk = s["check"] or {}
    print(f"method {s['method']}  d={s['d']}  queries {s['queries']} for {s['unknowns']} unknowns "
          f"({s['queries_per_unknown']:.4f} per unknown)  {s['seconds']:.2f} s")
    if chk:
        print(f"functional check: relative error {chk['relative_error']:.3e} on {chk['queries']} fresh sequences "
              f"of lengths {chk['lengths']}")
    for note in s["notes"]:
        print(f"note: {note}")
    if out:
        print(f"wrote {out[0]} and {out[1]}")


# --------------------------------------------------------------------------------------------- commands
def cmd_extract(args) -> int:
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
    _print_summary(res, paths)
    return 0


def _ffn_errors(true_model, result) -> dict[str, float]:
    """Transformer / ReLU-network results: W and v compare entrywise, the FFN neurons only up to permutation and
    positive scale (Sec. 4.1), so they are matched first."""
    from attnprobe.models import neuron_errors

    out = {}
    if true_model.kind == "one_layer_transformer" and result.kind == true_model.kind:
        for name, a, b in (("W", result.W, true_model.W), ("v", result.v, true_model.v)):
            n = np.linalg.norm(b)
            out[name] = float(np.linalg.norm(a - b) / n) if n > 0 else float(np.linalg.norm(a))
    ne = neuron_errors(true_model.A, true_model.w_o, result.A, result.w_o)
    out["neuron_direction"], out["neuron_weight"] = ne["direction_error"], ne["weight_error"]
    return out


def cmd_verify(args) -> int:
    true_model = load_model(args.target)
    result = load_model(args.result)
    if true_model.kind in ("one_layer_transformer", "relu_net"):
        errs = _ffn_errors(true_model, result)
    else:
        errs = relative_errors(true_model, result)
    width = max(map(len, errs))
    for name, e in errs.items():
        print(f"{name:<{width}}  relative error {e:.3e}")
    if args.json:
        Path(args.json).write_text(json.dumps(errs, indent=2) + "\n")
    return 0


def cmd_demo(args) -> int:
    from attnprobe.targets import minilm_head

    truth = minilm_head(args.layer, args.head, args.row, dtype=args.dtype)
    d = truth.d
    print(f"target: MiniLM-L6 layer {args.layer} head {args.head}, output row {args.row}, d = {d}, "
          f"answers computed in {args.dtype}")
    oracle = Oracle(truth, d, precision=args.dtype, name="minilm")
    progress = Progress("extract", enabled=not args.quiet)
    try:
        res = extract_exact(oracle, probes=args.probes, seed=args.seed, progress=progress)
    finally:
        progress.close()
    unknowns = AttentionHead.unknowns(d)
    rank = np.linalg.matrix_rank(res.model.W, tol=1e-4 * np.linalg.norm(res.model.W, 2))
    print(f"recovered W ({d}x{d}, numerical rank {rank}), v, u ({d}) and c = {res.model.c:.6f} "
          f"with {args.probes} probes")
    print(f"queries: {res.queries}  (unknowns d²+2d+1 = {unknowns}; paper's bound d²+d = {d * d + d} for the "
          f"bias-free model; calibration {res.details.get('calibration_queries', 0)}, "
          f"re-measured probes {res.details.get('retry_queries', 0)})")
    for name, e in relative_errors(truth, res.model).items():
        print(f"  {name}: relative error {e:.3e}")
    print(f"functional check: relative error {res.check['relative_error']:.3e} on {res.check['queries']} fresh "
          f"sequences (lengths {res.check['lengths']}), {res.seconds:.2f} s")
    if args.out:
        _print_summary(res, res.save(args.out))
    return 0


def cmd_target(args) -> int:
    if args.kind == "random":
        from attnprobe.targets import random_head

        model = random_head(args.d, seed=args.seed, scale=args.scale, rank=args.rank, bias=not args.no_bias,
                            zero_v=args.zero_v)
    elif args.kind in ("transformer", "relu"):
        from attnprobe.targets import random_relu_net, random_transformer

        m = args.m or args.d
        model = (random_transformer(args.d, m, seed=args.seed, scale=args.scale, rank=args.rank)
                 if args.kind == "transformer" else random_relu_net(args.d, m, seed=args.seed))
    else:
        from attnprobe.targets import minilm_head

        model = minilm_head(args.layer, args.head, args.row)
    path = save_model(model, args.out)
    print(f"wrote {model.kind} (d = {model.d}) to {path}")
    return 0


# --------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnprobe", description="Recover attention weights from black-box queries.")
    sub = p.add_subparsers(dest="command", required=True)

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
    e.set_defaults(func=cmd_extract)

    v = sub.add_parser("verify", help="compare a result with the true model")
    v.add_argument("--target", required=True, metavar="TRUE.npz")
    v.add_argument("--result", required=True, metavar="OUT.npz")
    v.add_argument("--json", metavar="FILE", help="also write the errors as JSON")
    v.set_defaults(func=cmd_verify)

    dm = sub.add_parser("demo", help="extract a real MiniLM-L6 head answered in float32")
    dm.add_argument("--layer", type=int, default=0)
    dm.add_argument("--head", type=int, default=0)
    dm.add_argument("--row", type=int, default=0, help="row of the attention output projection")
    dm.add_argument("--dtype", choices=PRECISIONS, default="float32")
    dm.add_argument("--probes", choices=PROBES, default="orthogonal")
    dm.add_argument("--seed", type=int, default=0)
    dm.add_argument("--out", metavar="OUT.npz")
    dm.add_argument("--quiet", action="store_true")
    dm.set_defaults(func=cmd_demo)

    t = sub.add_parser("target", help="save a ready-made target model to a file")
    t.add_argument("kind", choices=["random", "minilm", "transformer", "relu"])
    t.add_argument("--d", type=int, default=16)
    t.add_argument("--m", type=int, help="transformer/relu: hidden width of the FFN (default d)")
    t.add_argument("--rank", type=int)
    t.add_argument("--scale", type=float, default=1.0, help="RMS attention logit on unit inputs")
    t.add_argument("--zero-v", type=int, default=0, help="number of zero entries of v")
    t.add_argument("--no-bias", action="store_true")
    t.add_argument("--layer", type=int, default=0)
    t.add_argument("--head", type=int, default=0)
    t.add_argument("--row", type=int, default=0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", required=True)
    t.set_defaults(func=cmd_target)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except AttnprobeError as exc:
        print(f"attnprobe: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnprobe: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
