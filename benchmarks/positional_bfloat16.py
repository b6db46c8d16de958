"""RoPE from bfloat16 answers: the zero-key sweep's value maps, the start and the polish (``learners/positional/
bfloat16.py``).

Random-init ``transformers`` LLaMA attention served in bfloat16 (seed 0), whole output rows at the last position;
every error is against the float64 module of the same weights (largest relative error over lengths up to 256).
The route as ``extract --method positional`` runs it: the start (values, the sweep's value maps, the logit maps),
its check, the polish hook on the route's fresh sequences, then the verdict (the check held to the route's claim,
else refused naming bfloat16).

    PYTHONPATH=src python benchmarks/positional_bfloat16.py --d 32 --heads 2 --kv-heads 1 --write

``--rows``: the every-row route (``bfloat16_rows.py``) as ``extract --hf-dir DIR --layer 0 --dtype bfloat16`` runs it
on a ``save_pretrained`` LLaMA folder, against the folder's float64 module (``--init R``: transformers' own init).
``--row-values Q …``: the value maps from every-position rows (``span_sweep.py``: the span of the ``V_h``, the key/value
groups' sub-spans, each group's mixing from the sweep in span coordinates at ``Q`` random queries).
``--per-query``: each random query's fit (four and twelve blocks) against the module's ``V_h z`` and against the
least-squares split with the module's own centres (float64 logits: the floor of any centre fit); ``--value-maps``:
the sweep's value maps through the output spaces (values, walk, ``3·d_h`` random queries), no logit maps.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.positional.bfloat16 import SPACE_QUERIES, extract_bfloat16_positional
from attnprobe.learners.positional.route import claim_verdict
from attnprobe.learners.positional.polish_hook import polish_extraction
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.reports import Table
from attnprobe.targets.positional_modules import folder_reference, positional_victim, reference_model
from sections import command_line, write_section

DOC = "positional-precision"
LENGTHS = (1, 2, 3, 5, 17, 64, 100, 200, 256)


def value_map_error(model, truth) -> float:
    """Largest over heads of ``‖V̂_h − V_h‖/‖V_h‖``, heads matched."""
    V, T = model.value_maps(), truth.value_maps()
    C = np.array([[np.linalg.norm(a - b) / np.linalg.norm(b) for b in T] for a in V])
    rows, cols = linear_sum_assignment(C)
    return float(C[rows, cols].max())


def route_row(d: int, H: int, G: int) -> list:
    kw = dict(d=d, heads=H, kv_heads=G, seed=0)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    oracle = oracle_from_torch(positional_victim("llama", dtype="bfloat16", **kw), d, precision="bfloat16")
    t0 = time.perf_counter()
    try:
        res = extract_bfloat16_positional(oracle, heads=H, seed=0)
    except UnidentifiableError as exc:  # refused before any query (more than two heads, or wide ones)
        return [f"LLaMA d={d} {H}/{G}", "–", oracle.queries, "–", 0, "–", "–", f"refused: {exc}", oracle.queries,
                f"{time.perf_counter() - t0:.0f}"]
    start_queries = res.queries
    start = function_error_over_lengths(res.model, truth, np.random.default_rng(5), LENGTHS)
    vmaps = value_map_error(res.model, truth)
    plan = res.details["polish_plan"]
    polish_extraction(oracle, res, mode="always", sequences=plan["sequences"], rounds=plan["rounds"])
    polished = function_error_over_lengths(res.model, truth, np.random.default_rng(5), LENGTHS)
    try:
        claim_verdict(oracle, res)
        verdict = "kept"
    except UnidentifiableError as exc:
        verdict = f"refused: {str(exc)[:60]}…"
    return [f"LLaMA d={d} {H}/{G}", f"{vmaps:.1e}", start_queries, f"{start:.1e}",
            res.details["polish"].get("sequences", 0), f"{polished:.1e}", f"{res.check.error:.1e}", verdict,
            res.queries, f"{time.perf_counter() - t0:.0f}"]


def module_centres(truth, z: np.ndarray, blocks) -> np.ndarray:
    """The module's ``log S_hm`` (H, len(blocks)) at the query ``z`` (float64 logits, HF rotate-half)."""
    g = truth.H // truth.G
    half = len(truth.inv_freq)
    th = np.arange(max(blocks))[:, None] * np.asarray(truth.inv_freq)[None]
    out = np.empty((truth.H, len(blocks)))
    for h in range(truth.H):
        q, k = truth.Wq[h] @ z, truth.Wk[h // g] @ z
        k1 = k[:half] * np.cos(th) + k[half:] * np.sin(th)
        k2 = k[half:] * np.cos(th) - k[:half] * np.sin(th)
        s = np.cumsum(np.exp(truth.scale * (k1 @ q[:half] + k2 @ q[half:])))
        out[h] = [math.log(s[m - 1]) for m in blocks]
    return out


def matched_errors(U, T) -> np.ndarray:
    C = np.array([[np.linalg.norm(u - t) / np.linalg.norm(t) for t in T] for u in U])
    rows, cols = linear_sum_assignment(C)
    return C[rows, cols]


def per_query_rows(d: int, H: int, G: int, queries: int = 5) -> list:
    """Each query's worst head (``‖û_h − V_h z‖/‖V_h z‖``, heads matched) with four and twelve blocks."""
    from attnprobe.learners.positional.sweep import (BLOCKS, MANY_BLOCKS, QUERY_SCALE, fit_sweep, sweep_answers,
                                                     sweep_shapes)

    kw = dict(d=d, heads=H, kv_heads=G, seed=0)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    oracle = oracle_from_torch(positional_victim("llama", dtype="bfloat16", **kw), d, precision="bfloat16")
    V = truth.value_maps()
    rows = []
    for blocks in (BLOCKS, MANY_BLOCKS):
        rng = np.random.default_rng(1)
        Z = rng.standard_normal((queries, d)) * QUERY_SCALE
        Y = sweep_answers(oracle, Z, blocks)
        fitted, floor, misfits, t0 = [], [], [], time.perf_counter()
        for z, y in zip(Z, Y):
            U, _, misfit = fit_sweep(y, H, rng, blocks=blocks)
            fitted.append(matched_errors(U, V @ z).max())
            misfits.append(misfit)
            F = sweep_shapes(module_centres(truth, z, blocks), blocks)
            floor.append(matched_errors(np.linalg.lstsq(F, y, rcond=None)[0], V @ z).max())
        seconds = (time.perf_counter() - t0) / queries
        rows.append([f"LLaMA d={d} {H}/{G}", len(blocks), Y.shape[1], " ".join(f"{e:.1e}" for e in fitted),
                     " ".join(f"{m:.1e}" for m in misfits), " ".join(f"{e:.1e}" for e in floor), f"{seconds:.1f}"])
    return rows


def value_map_row(d: int, H: int, G: int) -> list:
    """The sweep's value maps through the output spaces at ``SPACE_QUERIES·d_h`` random queries."""
    from attnprobe.learners.positional.coarse import coarse_values
    from attnprobe.learners.positional.sweep import sweep_value_maps

    kw = dict(d=d, heads=H, kv_heads=G, seed=0)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    oracle = oracle_from_torch(positional_victim("llama", dtype="bfloat16", **kw), d, precision="bfloat16")
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    M, c = coarse_values(oracle, rng, math.sqrt(d), repeats=16)
    before = oracle.queries
    V, misfit = sweep_value_maps(oracle, c, H, rng, per=6, M=M, spaces=SPACE_QUERIES)
    errs = matched_errors(V.reshape(H, -1), truth.value_maps().reshape(H, -1))
    return [f"LLaMA d={d} {H}/{G}", f"{SPACE_QUERIES}·d_h", f"{np.median(errs):.1e}", f"{errs.max():.1e}",
            f"{misfit:.1e}", oracle.queries - before, oracle.queries, f"{time.perf_counter() - t0:.0f}"]


class EveryRow:
    """The victim's every row (causal), as a bfloat16 Hugging Face layer serves them (``every_position``)."""

    positions = "causal"

    def __init__(self, victim):
        self.victim, self.dtype, self.__name__ = victim, "bfloat16", type(victim).__name__

    def __call__(self, X):
        return np.asarray(self.victim.every_position(X).float(), dtype=np.float64)


def row_value_map_row(d: int, H: int, G: int, queries: int) -> list:
    """The value maps from every-position rows (``span_sweep.row_value_maps``): values, the span, the groups and
    each group's mixing from the sweep in span coordinates."""
    from attnprobe.learners.positional.coarse import coarse_values
    from attnprobe.learners.positional.span_sweep import row_value_maps
    from attnprobe.oracles.base import Oracle

    kw = dict(d=d, heads=H, kv_heads=G, seed=0)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    oracle = Oracle(EveryRow(positional_victim("llama", dtype="bfloat16", **kw)), d, precision="bfloat16")
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    M, c = coarse_values(oracle, rng, math.sqrt(d), repeats=16)
    V, info = row_value_maps(oracle, H, rng, M=M, c=c, queries=queries)
    errs = matched_errors(V.reshape(H, -1), truth.value_maps().reshape(H, -1))
    return [f"LLaMA d={d} {H}/{G}", queries, f"{np.median(errs):.1e}", f"{errs.max():.1e}",
            f"{info['span_gap']:.1e}", f"{info['mixing_misfit']:.1e}", oracle.queries,
            f"{time.perf_counter() - t0:.0f}"]


def rows_route_row(d: int, H: int, G: int, init: float | None) -> list:
    """The every-row route as ``extract --hf-dir DIR --layer 0 --dtype bfloat16`` runs it, on a ``save_pretrained``
    LLaMA folder (attention weights N(0, 1/d), or the config's ``initializer_range`` ``init``): queries, seconds,
    peak memory, the check and the function error against the folder's float64 module over lengths 1 … 256."""
    import resource
    import tempfile

    from attnprobe.learners.positional.route import extract_any_positional
    from attnprobe.oracles.hf_attention import oracle_from_hf
    from attnprobe.targets.block_folders import llama_block_folder

    folder = tempfile.mkdtemp(prefix="bf16rows_")
    llama_block_folder(folder, d=d, heads=H, kv_heads=G, hidden=2 * d, layers=1, seed=0)
    if init is not None:  # transformers' own random init at initializer_range = init (small logits)
        import torch
        import transformers

        config = transformers.LlamaConfig.from_pretrained(folder)
        config.initializer_range = init
        torch.manual_seed(0)
        transformers.AutoModel.from_config(config).save_pretrained(folder)
    truth = folder_reference(folder)
    oracle = oracle_from_hf(folder, 0, dtype="bfloat16", positional=True, every_position=True)
    t0 = time.perf_counter()
    label = f"LLaMA d={d} {H}/{G}" + (f", init {init:g}" if init is not None else "")
    try:
        res = extract_any_positional(oracle, heads=H, seed=0)
    except UnidentifiableError as exc:
        return [label, "–", "–", f"refused: {exc}", oracle.queries, f"{time.perf_counter() - t0:.0f}",
                round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)]
    err = function_error_over_lengths(res.model, truth, np.random.default_rng(7), tuple(range(1, 257)))
    return [label, f"{res.check.error:.1e}", f"{err:.1e}", "kept", res.queries + res.check.queries,
            f"{time.perf_counter() - t0:.0f}", round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[32])
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/")
    ap.add_argument("--per-query", action="store_true", help="the sweep's fit per random query, 4 and 12 blocks")
    ap.add_argument("--value-maps", action="store_true", help="the sweep's value maps through the output spaces")
    ap.add_argument("--row-values", type=int, nargs="+", metavar="QUERIES",
                    help="the value maps from every-position rows (span_sweep.py) at these sweep query counts")
    ap.add_argument("--rows", action="store_true", help="the every-row route on a save_pretrained LLaMA folder")
    ap.add_argument("--init", nargs="+", default=["none"],
                    help="with --rows: the folder's attention weights: none (N(0, 1/d)) or transformers' "
                         "initializer_range R (a row each)")
    args = ap.parse_args()
    if args.rows:
        table = Table(["module", "check (worst length)", "function error (lengths 1 … 256)", "verdict", "queries",
                       "seconds", "peak MB"])
        for d in args.d:
            for init in args.init:
                table.add(*rows_route_row(d, args.heads, args.kv_heads, None if init == "none" else float(init)))
                print(table.markdown().splitlines()[-1], flush=True)
        print(table.markdown())
        if args.write:
            write_section(f"RoPE bfloat16: the every-row route on a LLaMA folder (d = {', '.join(map(str, args.d))})",
                          table.markdown(), command_line(), doc=DOC)
        return
    if args.row_values:
        table = Table(["module", "sweep queries", "V_h error (median)", "V_h error (worst)", "span gap s_H+1/s_H",
                       "mixing misfit", "queries", "seconds"])
        for d in args.d:
            for q in args.row_values:
                table.add(*row_value_map_row(d, args.heads, args.kv_heads, q))
                print(table.markdown().splitlines()[-1], flush=True)
        print(table.markdown())
        if args.write:
            write_section(f"RoPE bfloat16: the value maps from every-position rows ({args.heads}/{args.kv_heads} "
                          "heads)", table.markdown(), command_line(), doc=DOC)
        return
    if args.per_query or args.value_maps:
        if args.per_query:
            table = Table(["module", "blocks", "sequences a query", "fit: worst head per query",
                           "misfit per query", "module's centres: worst head", "seconds a fit"])
            title = "RoPE bfloat16 sweep: separating the heads at one query"
            for d in args.d:
                for row in per_query_rows(d, args.heads, args.kv_heads):
                    table.add(*row)
        else:
            table = Table(["module", "random queries", "V_h error (median)", "V_h error (worst)", "median misfit",
                           "sweep queries", "queries", "seconds"])
            title = (f"RoPE bfloat16 sweep: the value maps through the output spaces ({args.heads}/{args.kv_heads} "
                     f"heads)")
            for d in args.d:
                table.add(*value_map_row(d, args.heads, args.kv_heads))
        print(table.markdown())
        if args.write:
            write_section(title, table.markdown(), command_line(), doc=DOC)
        return
    table = Table(["module", "sweep: V_h error", "start: queries", "start: function error", "polish: sequences",
                   "polished: function error", "check (worst length)", "verdict", "queries", "seconds"])
    for d in args.d:
        table.add(*route_row(d, args.heads, args.kv_heads))
        print(table.markdown().splitlines()[-1], flush=True)
    print(table.markdown())
    if args.write:
        write_section("RoPE bfloat16 route: the zero-key sweep, the start and the polish", table.markdown(),
                      command_line(), doc=DOC)


if __name__ == "__main__":
    main()
