"""RoPE from coarse answers: how close each averaged stage of ``learners/positional/coarse.py`` comes.

Random-init ``transformers`` LLaMA attention (seed 0), whole output rows at the last position, answers served in
float32 or bfloat16; every error is against the float64 module of the same weights.

- **head directions**: the pair probe's ``D`` at one query, four settings, ``2H + 8`` key directions; Jennrich's
  directions against the truth ``V_h z`` (largest over heads of ``‖ŵ − w‖`` for unit columns), with ``D`` from the
  float64 learner's Richardson steps (``heads.pair_jacobian``) and from the coarse Chebyshev fit
  (``coarse.pair_derivative``, 16 nodes up to 0.3 of the token norm, degree 15).
- **output spaces** (``--spaces``): each head's ``C_h`` from the coarse walk (residual of the truth ``W_O,h``'s
  projection, Frobenius over the ``d_h`` orthonormal columns), and the start's function error (the logit maps of
  ``coarse.logit_maps``), largest over lengths up to 256.

    PYTHONPATH=src python benchmarks/positional_coarse_start.py --write
    PYTHONPATH=src python benchmarks/positional_coarse_start.py --spaces --write
    PYTHONPATH=src python benchmarks/positional_coarse_start.py --route --d 16 32 --write
    PYTHONPATH=src python benchmarks/positional_coarse_start.py --route --family qwen2 --d 16 32 --write
    PYTHONPATH=src python benchmarks/positional_coarse_start.py --route --family qwen2 --wide 128 8 2 --write

- **the float32 route** (``--route``): ``extract --method positional`` as routed on float32 answers (the coarse
  start: value maps at 6d random queries, logit maps from reliability-weighted log-weights; then the polish hook),
  the start's and the returned model's function error (largest over lengths up to 256) and the check (its error:
  the worst length's largest relative error, what it passes on; and the RMS over every answer beside it).
  ``--family qwen2``: Qwen2's attention (q/k/v biases, N(0, 0.5²)), read from the answers as RoPE with q/k biases
  (learners/positional/coarse_bias.py). ``--wide D H G``: one run with the route's defaults (polish ``auto``) at
  that shape, the function error at every length 1 … 256, the seconds and the peak memory.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from attnprobe.errors import RecoveryError
from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.positional.coarse import (COARSE_STEP, SETTINGS, coarse_output_spaces, coarse_start,
                                                  coarse_values)
from attnprobe.learners.positional.heads import STEP, head_directions, match
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.reports import Table
from attnprobe.targets.positional_modules import positional_victim, reference_model
from sections import command_line, write_section

DOC = "positional-precision"
LENGTHS = (1, 2, 3, 5, 17, 64, 256)


def direction_error(oracle, truth, H, coarse: bool) -> str:
    from attnprobe.learners.positional.coarse import pair_derivative

    d = oracle.d
    rng = np.random.default_rng(0)
    z = rng.standard_normal(d)
    E = random_orthogonal(d, rng)[: min(d, 2 * H + 8)]
    kw = dict(settings=SETTINGS, rank=H, noise=0.0, rng=rng)
    try:
        if coarse:
            W, _, _ = head_directions(oracle, z, E, eta=COARSE_STEP * math.sqrt(d), jacobian=pair_derivative, **kw)
        else:
            W, _, _ = head_directions(oracle, z, E, eta=STEP * math.sqrt(d), **kw)
    except RecoveryError:
        return "heads not separated (complex eigenvalues)"
    V = truth.value_maps()
    true = np.stack([V[h] @ z for h in range(H)], 1)
    true /= np.linalg.norm(true, axis=0)
    try:
        return f"{np.max(np.linalg.norm(match(true, W) - true, axis=0)):.1e}"
    except RecoveryError:
        return "no match (|cos| < 0.5)"


def directions_table() -> Table:
    table = Table(["module", "answers", "D from", "queries", "largest direction error"])
    for d, H, G, precs in ((32, 2, 1, ("float32", "bfloat16")), (128, 8, 2, ("float32",))):
        kw = dict(d=d, heads=H, kv_heads=G, seed=0)
        truth = reference_model(positional_victim("llama", dtype="float64", **kw))
        for prec in precs:
            for coarse in (False, True):
                oracle = oracle_from_torch(positional_victim("llama", dtype=prec, **kw), d, precision=prec)
                err = direction_error(oracle, truth, H, coarse)
                table.add(f"LLaMA d={d} {H}/{G}", prec, "Chebyshev fit, 16 nodes" if coarse else
                          "Richardson, 3 steps", oracle.queries, err)
                print(table.markdown().splitlines()[-1], flush=True)
    return table


def spaces_table(walks) -> Table:
    table = Table(["module", "answers", "walk", "queries (values + walk)", "largest output-space error",
                   "start: queries", "start: function error"])
    d, H, G = 32, 2, 1
    kw = dict(d=d, heads=H, kv_heads=G, seed=0)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    dh = d // H
    To = truth.Wo.reshape(d, H, dh)
    for prec in ("float32",):
        for walk in walks:
            oracle = oracle_from_torch(positional_victim("llama", dtype=prec, **kw), d, precision=prec)
            rng = np.random.default_rng(0)
            M, _ = coarse_values(oracle, rng, math.sqrt(d))
            Cb, _ = coarse_output_spaces(oracle, M, rng, H, walk)
            spaces = oracle.queries
            err = max(min(np.linalg.norm(Cb[:, h * dh:(h + 1) * dh] - To[:, g] @ np.linalg.lstsq(
                To[:, g], Cb[:, h * dh:(h + 1) * dh], rcond=None)[0]) for g in range(H)) for h in range(H))
            oracle = oracle_from_torch(positional_victim("llama", dtype=prec, **kw), d, precision=prec)
            start, _ = coarse_start(oracle, H, np.random.default_rng(0), base=10000.0, walk=walk)
            fn = function_error_over_lengths(start, truth, np.random.default_rng(5), LENGTHS)
            table.add(f"LLaMA d={d} {H}/{G}", prec, walk, spaces, f"{err:.1e}", oracle.queries, f"{fn:.1e}")
            print(table.markdown().splitlines()[-1], flush=True)
    return table


def route_table(dims, family: str = "llama") -> Table:
    import time

    from attnprobe.learners.positional.route import extract_any_positional

    table = Table(["module", "answers", "start: queries", "start: function error", "polish: sequences",
                   "polished: function error", "check: worst length", "check: RMS", "passed", "queries",
                   "seconds"])
    for d in dims:
        H, G = 2, 1
        kw = dict(d=d, heads=H, kv_heads=G, seed=0)
        truth = reference_model(positional_victim(family, dtype="float64", **kw))
        oracle = oracle_from_torch(positional_victim(family, dtype="float32", **kw), d, precision="float32")
        t0 = time.perf_counter()
        res = extract_any_positional(oracle, heads=H, seed=0, polish="never")
        start = function_error_over_lengths(res.model, truth, np.random.default_rng(5), LENGTHS)
        oracle = oracle_from_torch(positional_victim(family, dtype="float32", **kw), d, precision="float32")
        res = extract_any_positional(oracle, heads=H, seed=0)
        fn = function_error_over_lengths(res.model, truth, np.random.default_rng(5), LENGTHS)
        polish = res.details.get("polish", {})
        name = {"llama": "LLaMA", "qwen2": "Qwen2 (q/k/v biases)"}[family]
        table.add(f"{name} d={d} {H}/{G}", "float32", res.queries_by_phase.get("coarse start"), f"{start:.1e}",
                  polish.get("sequences", 0), f"{fn:.1e}", f"{res.check.error:.1e}",
                  f"{res.check.extra.get('rms_error', res.check.error):.1e}", res.check.passed, res.queries,
                  f"{time.perf_counter() - t0:.0f}")
        print(table.markdown().splitlines()[-1], flush=True)
    return table


def wide_route_table(family: str, d: int, H: int, G: int) -> Table:
    """One run of the route a user gets (``extract_any_positional`` with its defaults: polish ``auto``) on the
    float32 module, its function error against the float64 module at every length 1 … 256 (2 sequences each), the
    seconds of the route alone and the process's peak resident memory (one row per process: ``ru_maxrss``)."""
    import resource
    import time

    from attnprobe.learners.positional.route import extract_any_positional

    table = Table(["module", "answers", "head probe", "start: check (worst length)", "polish: sequences × rounds "
                   "(planned × CG steps)", "check: worst length", "passed", "function error, every N ≤ 256",
                   "at N = 2 / 17 / 256", "queries", "seconds", "peak memory (GiB)"])
    kw = dict(d=d, heads=H, kv_heads=G, seed=0)
    truth = reference_model(positional_victim(family, dtype="float64", **kw))
    oracle = oracle_from_torch(positional_victim(family, dtype="float32", **kw), d, precision="float32")
    t0 = time.perf_counter()
    res = extract_any_positional(oracle, heads=H, seed=0)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    fn = function_error_over_lengths(res.model, truth, np.random.default_rng(5), range(1, 257), per_length=2)
    at = " / ".join(f"{function_error_over_lengths(res.model, truth, np.random.default_rng(6), (n,)):.1e}"
                    for n in (2, 17, 256))
    p = res.details.get("polish", {})
    plan = (f"{p['sequences']} × {p['rounds']} ({p['planned_rounds']} × {p['cg_steps']}), kept {p['kept']}"
            if p.get("ran") else "not run")
    name = {"llama": "LLaMA", "qwen2": "Qwen2 (q/k/v biases)"}[family]
    table.add(f"{name} d={d} {H}/{G}", "float32", res.details.get("head_probe"),
              f"{p['check_before']:.1e}" if p.get("ran") else "—", plan, f"{res.check.error:.1e}", res.check.passed,
              f"{fn:.1e}", at, res.queries + res.check.queries, f"{seconds:.0f}", f"{peak:.1f}")
    print(table.markdown().splitlines()[-1], flush=True)
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", action="store_true", help="output spaces and the start's function error (d = 32)")
    ap.add_argument("--walk", type=int, nargs="+", default=[1], help="--spaces: walk lengths (one row each)")
    ap.add_argument("--route", action="store_true", help="the float32 route end to end (start and polish)")
    ap.add_argument("--d", type=int, nargs="+", default=[16, 32], help="--route: widths (2 heads, 1 KV group)")
    ap.add_argument("--family", default="llama", choices=("llama", "qwen2"), help="--route: the module's family")
    ap.add_argument("--wide", type=int, nargs=3, metavar=("D", "H", "G"),
                    help="--route: one run with the defaults at this width, heads and KV groups (d = 128: 128 8 2)")
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/")
    args = ap.parse_args()
    if args.route and args.wide:
        d, H, G = args.wide
        table = wide_route_table(args.family, d, H, G)
        print(table.markdown())
        if args.write:
            write_section(f"RoPE float32 route with its defaults at d = {d}, {H}/{G} heads ("
                          + ("Qwen2: q/k biases" if args.family == "qwen2" else "LLaMA") + ")", table.markdown(),
                          command_line(), doc=DOC)
        return
    table = (route_table(args.d, args.family) if args.route else spaces_table(args.walk) if args.spaces else
             directions_table())
    print(table.markdown())
    if args.write:
        title = ("RoPE float32 route: the coarse start and the polish" + (
            " (Qwen2: q/k biases)" if args.family == "qwen2" else "") if args.route else
                 "RoPE coarse start: output spaces and the start (d = 32)" if args.spaces else
                 "RoPE coarse start: the pair probe's head directions from coarse answers")
        write_section(title, table.markdown(), command_line(), doc=DOC)


if __name__ == "__main__":
    main()
