"""Whole blocks: the block learner's stages measured against the truth (docs/block.md, "The learner"), on random
LLaMA-shaped pre-norm blocks (numpy ``TransformerBlock``: RMSNorm weights 1 + N(0, 0.3²), RoPE GQA attention and
SwiGLU at weights N(0, 1/fan-in), ε = 1e-6, float64), queried as every-position oracles.

1. the sublayer oracles built through the norm's inverse: ``√ε`` and ``M' = M diag(w1)``, the FFN oracle
   ``v ↦ F(w2 ⊙ v)`` (rows of rms 0.4) and the attention oracle (the query driven out, the true FFN's share solved
   away);
2. the RoPE learner on the true attention with its own query scales against every query at one rms (as the norm
   forces), before and after the attention polish (learners/block/polish.py; d = 32 only);
3. the gated FFN learner (SwiGLU, width given) through the block's FFN oracle, and on the true FFN with relative
   noise 1e-10 and 1e-12 added (``--only ffn``: d = 64; ``--only ffn128``: d = 128; minutes each);
4. the per-head logit refit (``learners/block/refine.py``) after the RoPE learner at a fixed query rms, on the true
   attention and through the block with the true FFN (``--only refit``; d = 32, a minute; ``--only refit128``:
   d = 128, the true attention, ~10 minutes under load);
5. ``extract_block`` end to end (``--e2e`` after the stages, or ``--only e2e``: d = 32, minutes), the function
   against the block at every length 1 … 64; ``--only e2e128``: the issue's d = 128 LLaMA layer (8/2 heads, SwiGLU
   256), with the learned FFN and attention against the truth and the peak memory (~30 minutes on a busy machine;
   in parts of under 20 minutes: ``--ffn-out PATH``, then ``--ffn PATH --att-out PATH2`` (the RoPE learner and the
   logit refit), then ``--ffn PATH --att PATH2`` (the polish and the check));
6. the RoPE learner's logit matrices ``M(δ)`` at a fixed query rms against the truth, head by head (``--only
   sketches``: d = 128, on the true attention and through the block with the true FFN; ~5 minutes);
7. the served block (``--only served``): a transformers ``LlamaDecoderLayer`` (d = 32, 2/1 heads, SwiGLU 64, norm
   weights not 1) served by ``serve --hf-dir DIR --block 1`` (real uvicorn on 127.0.0.1) and attacked by
   ``extract --url --method block``, against ``extract --hf-dir DIR --block 1`` in process (minutes).

    python benchmarks/block_learner.py [--only oracles|ffn|ffn128|refit|refit128|e2e|e2e128|sketches|served] [--e2e]
           [--write]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from attnprobe.errors import AttnprobeError
from attnprobe.learners.block.learner import extract_block
from attnprobe.learners.block.polish import polish_data, polish_sequences, polish_through_block
from attnprobe.learners.block.refine import refit_data, refit_logits
from attnprobe.learners.block.sublayers import (AttentionThroughBlock, FFNThroughBlock, ffn_scale, linear_part,
                                                sqrt_eps)
from attnprobe.learners.positional.rope import extract_positional
from attnprobe.learners.smooth_ffn.gated_learner import extract_gated_ffn
from attnprobe.models.block import fold_norm_weights
from attnprobe.oracles import Oracle
from attnprobe.reports import Table
from attnprobe.targets.block import random_llama_block
from attnprobe.targets.block_folders import llama_block_folder
from sections import publish

DOC = "block"
SHAPES = ((32, 2, 1, 64), (64, 4, 2, 128), (128, 8, 2, 256))


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def sublayer_oracles(shape):
    d, H, G, m = shape
    blk = random_llama_block(d, H, G, m)
    f = fold_norm_weights(blk)
    o = Oracle(blk.every_position, d, outputs=d, precision="float64")
    K0 = linear_part(o.answer_rows, d)
    s, _ = sqrt_eps(o.answer_rows, K0, np.random.default_rng(0), heads=H)
    M = f.attention.every_position(np.eye(d)[:, None, :])[:, 0].T
    asked = o.queries
    ffn = FFNThroughBlock(o.answer_rows, s * (K0 - np.eye(d)), s * s)
    V = np.random.default_rng(1).standard_normal((256, 1, d)) * 0.4
    true = f.mlp(V[:, 0])
    ffn_err = np.abs(ffn(V) - true).max(axis=1) / np.abs(true).max()
    truth = f.ffn
    att = AttentionThroughBlock(o.answer_rows, truth, blk.eps, d)
    Z = np.random.default_rng(2).standard_normal((16, 33, d)) * 0.5
    Z[:, -1] *= att.query_rms * math.sqrt(d) / np.linalg.norm(Z[:, -1], axis=1, keepdims=True)
    return (f"d {d}, {H}/{G} heads, SwiGLU {m}", asked, f"{abs(s / math.sqrt(blk.eps) - 1):.1e}",
            f"{rel(s * (K0 - np.eye(d)), M):.1e}", f"{np.median(ffn_err):.1e} / {ffn_err.max():.1e}",
            f"{rel(att(Z), f.attention.every_position(Z)[:, -1]):.1e}")


def rope_fixed_query(shape, polish: bool):
    d, H, G, m = shape
    blk = random_llama_block(d, H, G, m)
    f = fold_norm_weights(blk)
    Zt = np.random.default_rng(3).standard_normal((8, 64, d)) * 0.5
    want = f.attention.every_position(Zt)
    rows = []
    for label, q in (("its own query scales", None), ("every query at rms 1 − 5e-9", 1 - 5e-9)):
        o = Oracle(lambda X: f.attention.every_position(X)[:, -1], d, outputs=d, precision="float64")
        res = extract_positional(o, heads=H, check=False, query_rms=q)
        err = rel(res.model.every_position(Zt), want)
        polished = "—"
        if q is not None and polish:
            t = time.perf_counter()
            data = polish_data(o, q, np.random.default_rng(7), polish_sequences(d, H, d // H))
            model, _ = polish_through_block(res.model, data)
            polished = f"{rel(model.every_position(Zt), want):.1e} ({time.perf_counter() - t:.0f} s)"
        rows.append((f"d {d}, {H}/{G} heads", label, o.queries, f"{err:.1e}", polished))
    return rows


def gated_through_block(shape, noise: float | None):
    """The gated learner (SwiGLU, width given) on ``v ↦ F(w2 ⊙ v)``: through the block (``noise`` None) or the true
    FFN with ``noise × (the row's largest answer)`` added; function error on 256 fresh rows of rms 0.4."""
    d, H, G, m = shape
    blk = random_llama_block(d, H, G, m)
    f = fold_norm_weights(blk)
    if noise is None:
        o = Oracle(blk.every_position, d, outputs=d, precision="float64")
        K0 = linear_part(o.answer_rows, d)
        s, _ = sqrt_eps(o.answer_rows, K0, np.random.default_rng(0), heads=H)
        fn, label = FFNThroughBlock(o.answer_rows, s * (K0 - np.eye(d)), s * s), "the block's FFN oracle"
    else:
        rng = np.random.default_rng(1)

        def fn(V):
            y = f.mlp(V[:, 0])
            return y + noise * rng.standard_normal(y.shape) * np.abs(y).max(axis=1, keepdims=True)
        label = f"the true FFN + relative noise {noise:.0e}"
    t = time.perf_counter()
    res = extract_gated_ffn(Oracle(fn, d, outputs=d, precision="float64"), activation="swiglu", hidden=m,
                            bias=False, scale=ffn_scale(d), check=False)
    V = np.random.default_rng(9).standard_normal((256, d)) * 0.4
    return (f"d {d}, SwiGLU {m}", label, res.queries, f"{rel(res.model.forward(V), f.mlp(V)):.1e}",
            f"{time.perf_counter() - t:.0f}")


def logit_refit(shape, through_block: bool):
    """The RoPE learner at the attention oracle's fixed query rms, then :func:`refit_logits` (8d sequences): on the
    true attention's last row (query rms 1 − 5e-9) or through the block with the true FFN (``through_block``)."""
    d, H, G, m = shape
    blk = random_llama_block(d, H, G, m)
    f = fold_norm_weights(blk)
    if through_block:
        truth = f.ffn
        fn = AttentionThroughBlock(Oracle(blk.every_position, d, outputs=d, precision="float64").answer_rows, truth,
                                   blk.eps, d)
        q, label = fn.query_rms, "through the block (true FFN)"
    else:
        fn, q, label = (lambda X: f.attention.every_position(X)[:, -1]), 1 - 5e-9, "the true attention"
    o = Oracle(fn, d, outputs=d, precision="float64")
    Zt = np.random.default_rng(3).standard_normal((8, 64, d)) * 0.5
    want = f.attention.every_position(Zt)
    t = time.perf_counter()
    res = extract_positional(o, heads=H, check=False, query_rms=q)
    before, asked = rel(res.model.every_position(Zt), want), o.queries
    data = refit_data(o, q, res.model.Wq.shape[1], np.random.default_rng(1), 8 * d)
    model, hist = refit_logits(res.model, data)
    return (f"d {d}, {H}/{G} heads", label, asked, f"{before:.1e}", o.queries - asked,
            f"{rel(model.every_position(Zt), want):.1e}", max(len(h) - 1 for h in hist),
            f"{time.perf_counter() - t:.0f}")


def errors_over_lengths(model, blk) -> list[float]:
    """The largest error at every position of 4 Gaussian sequences of each length 1 … 64, relative to the largest
    of the block's own part ``y − x`` (the residual stream taken out)."""
    rng = np.random.default_rng(5)
    errs = []
    for N in range(1, 65):
        X = rng.standard_normal((4, N, blk.d))
        y = blk.every_position(X)
        errs.append(np.abs(model.every_position(X) - y).max() / np.abs(y - X).max())
    return errs


def end_to_end(shape):
    d, H, G, m = shape
    blk = random_llama_block(d, H, G, m)
    o = Oracle(blk.every_position, d, outputs=d, precision="float64")
    t = time.perf_counter()
    res = extract_block(o, heads=H, hidden=m)
    errs = errors_over_lengths(res.model, blk)
    return (f"d {d}, {H}/{G} heads, SwiGLU {m}", res.queries, res.unknowns, f"{res.check.error:.1e}",
            "passed" if res.passed else "failed", f"{max(errs):.1e} (N = {int(np.argmax(errs)) + 1})",
            f"{time.perf_counter() - t:.0f}")



def _linear_and_eps(shape):
    """The block's oracle, its linear part ``K0``, ``√ε`` and the random generator after them, read as
    :func:`extract_block` reads them (its run's generator is ``default_rng(seed = 0)``; the parts' common start)."""
    from attnprobe.learners.block.learner import EPS_TOKENS

    d, H, G, m = shape
    o = Oracle(random_llama_block(d, H, G, m).every_position, d, outputs=d, precision="float64")
    K0 = linear_part(o.answer_rows, d)
    rng = np.random.default_rng(0)
    s, _ = sqrt_eps(o.answer_rows, K0, rng, tokens=EPS_TOKENS, heads=H)
    return o, K0, s, rng


def _save_part(model, path, queries: int, t0: float, label: str) -> None:
    """Save a part's sublayer to ``path`` with its queries, seconds and the process's peak memory in ``path.json``."""
    import json
    import resource

    from attnprobe.models import save_model

    save_model(model, path)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    info = {"queries": queries, "seconds": time.perf_counter() - t0, "peak_gb": peak}
    with open(f"{path}.json", "w") as fh:
        json.dump(info, fh)
    print(f"the {label}: {info}")


def ffn_stage(shape, path):
    """The FFN stage of :func:`extract_block` alone, as it runs there (the linear part, ε, the gated learner through
    the block's FFN oracle, width given, activation read), the FFN saved to ``path`` with its queries, seconds and
    peak memory beside it (``path`` + ``.json``): the first part of a d = 128 run split in parts."""
    d, m = shape[0], shape[3]
    o, K0, s, _ = _linear_and_eps(shape)
    before, t = o.queries, time.perf_counter()
    fn = FFNThroughBlock(o.answer_rows, s * (K0 - np.eye(d)), s * s)
    res = extract_gated_ffn(Oracle(fn, d, outputs=d, precision="float64"), seed=0, hidden=m, bias=False,
                            scale=ffn_scale(d), check=False)
    _save_part(res.model, path, o.queries - before, t, "FFN stage")


def attention_stage(shape, ffn_path, path):
    """The attention stages of :func:`extract_block` (the RoPE learner at the attention oracle's query rms, the logit
    refit on the sequences it draws there) on the FFN saved by :func:`ffn_stage`, the attention saved to ``path``
    with its queries, seconds and peak memory beside it: the second part of a d = 128 run split in three."""
    from attnprobe.learners.block.learner import REFIT_PER_D
    from attnprobe.models import load_model

    d, H = shape[0], shape[1]
    o, K0, s, rng = _linear_and_eps(shape)
    before, t = o.queries, time.perf_counter()
    att_fn = AttentionThroughBlock(o.answer_rows, load_model(ffn_path), s * s, d, value_map=s * (K0 - np.eye(d)))
    att_o = Oracle(att_fn, d, outputs=d, precision="float64")
    att = extract_positional(att_o, heads=H, seed=0, check=False, query_rms=att_fn.query_rms)
    data = refit_data(att_o, att_fn.query_rms, att.model.Wq.shape[1], rng, REFIT_PER_D * d)
    _save_part(refit_logits(att.model, data)[0], path, o.queries - before, t, "attention stages")


def end_to_end_parts(shape, ffn_path=None, att_path=None):
    """:func:`end_to_end` with the learned sublayers against the truth (the FFN on 256 fresh rows of rms 0.6, the
    attention on 8 sequences of length 64 of rms 0.5: relative to the largest answer) and the process's peak
    memory; with ``ffn_path`` (:func:`ffn_stage`'s file) the FFN stage is that run's (its queries and seconds
    added, the larger peak memory kept)."""
    import json
    import resource

    from attnprobe.models import load_model

    d, H, G, m = shape
    blk = random_llama_block(d, H, G, m)
    f = fold_norm_weights(blk)
    o = Oracle(blk.every_position, d, outputs=d, precision="float64")
    before = {"queries": 0, "seconds": 0.0, "peak_gb": 0.0}
    ffn = attention = None
    for path in (ffn_path, att_path):
        if path is not None:
            with open(f"{path}.json") as fh:
                part = json.load(fh)
            before = {k: max(v, part[k]) if k == "peak_gb" else v + part[k] for k, v in before.items()}
    if ffn_path is not None:
        ffn = load_model(ffn_path)
    if att_path is not None:
        attention = load_model(att_path)
    t = time.perf_counter()
    try:
        res = extract_block(o, heads=H, hidden=m, ffn=ffn, attention=attention)
    except AttnprobeError as e:  # a refusal is a measurement too: where it stopped, after how many queries
        peak = max(before["peak_gb"], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
        return (f"d {d}, {H}/{G} heads, SwiGLU {m}", o.queries + before["queries"], "—", "—", "—", "—",
                f"refused: {type(e).__name__}: {e}", "—", f"{time.perf_counter() - t + before['seconds']:.0f}",
                f"{peak:.1f}")
    seconds = time.perf_counter() - t + before["seconds"]
    errs = errors_over_lengths(res.model, blk)
    V = np.random.default_rng(9).standard_normal((256, d)) * 0.6
    Z = np.random.default_rng(3).standard_normal((8, 64, d)) * 0.5
    ffn_err = rel(res.model.mlp(V), f.mlp(V))
    att_err = rel(res.model.attention.every_position(Z), f.attention.every_position(Z))
    peak = max(before["peak_gb"], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    return (f"d {d}, {H}/{G} heads, SwiGLU {m}", res.queries + before["queries"], res.unknowns, f"{ffn_err:.1e}",
            f"{att_err:.1e}",
            f"{res.check.error:.1e}", "passed" if res.passed else "failed",
            f"{max(errs):.1e} (N = {int(np.argmax(errs)) + 1})", f"{seconds:.0f}", f"{peak:.1f}")


def logit_matrices(shape, through_block: bool):
    """The RoPE learner at the attention oracle's fixed query rms (``T/√(T² + ε)``), each head's logit matrices
    ``M(δ) = Uᵀ B(δ) V`` (in the bases of its learned query and key spaces, every offset) against the true head's
    in the same bases (the nearest true head at δ = −1), the conditioning of ``M(−1)`` and the moduli of the
    eigenvalues of ``M(−2) M(−1)⁻¹`` (1 for a rotation); answers from the true attention's last row or through the
    block with the true FFN. The rotation fit is watched, not changed: a refusal is reported."""
    import attnprobe.learners.positional.rope as rope

    d, H, G, m = shape
    blk = random_llama_block(d, H, G, m)
    f = fold_norm_weights(blk)
    A = f.attention
    if through_block:
        fn = AttentionThroughBlock(Oracle(blk.every_position, d, outputs=d, precision="float64").answer_rows, f.ffn,
                                   blk.eps, d)
        q, label = fn.query_rms, "through the block (true FFN)"
    else:
        q, label = AttentionThroughBlock(None, None, blk.eps, d).query_rms, "the true attention"

        def fn(X):
            return A.every_position(X)[:, -1]
    seen, factor = [], rope.factor_rotary

    def watched(Mk, U, V, first, second):
        seen.append((Mk, U, V))
        return factor(Mk, U, V, first, second)

    o = Oracle(fn, d, outputs=d, precision="float64")
    t = time.perf_counter()
    rope.factor_rotary = watched
    try:
        res = rope.extract_positional(o, heads=H, check=False, query_rms=q)
        Zt = np.random.default_rng(3).standard_normal((8, 64, d)) * 0.5
        outcome = f"{rel(res.model.every_position(Zt), A.every_position(Zt)):.1e}"
    except AttnprobeError as e:
        outcome = f"refused: {e}".split(";")[0]
    finally:
        rope.factor_rotary = factor
    errs, conds, moduli = [], [], []
    for Mk, U, V in seen:
        truth = min(({o_: U.T @ A.logit_matrix(h, o_) @ V for o_ in Mk} for h in range(H)),
                    key=lambda t_: np.linalg.norm(Mk[-1] - t_[-1]))
        errs.append(max(np.linalg.norm(Mk[o_] - truth[o_]) / np.linalg.norm(truth[o_]) for o_ in Mk))
        conds.append(np.linalg.cond(truth[-1]))
        moduli.extend(np.abs(np.linalg.eigvals(Mk[-2] @ np.linalg.inv(Mk[-1]))))
    return (f"d {d}, {H}/{G} heads", label, o.queries, f"{min(errs):.1e} … {max(errs):.1e}",
            f"{min(conds):.1f} … {max(conds):.1f}", f"{min(moduli):.4f} … {max(moduli):.4f}", outcome,
            f"{time.perf_counter() - t:.0f}")


def served_block():
    """``extract --url --method block`` on ``serve --hf-dir DIR --block 1`` against ``extract --hf-dir DIR --block 1``
    in process: queries, check, whether the arrays are the same, and ``load_model(result)`` against the layer at
    every position of 4 sequences of each length 1 … 64."""
    import json
    import tempfile
    import types
    from pathlib import Path

    from attnprobe.cli import build_parser, main as cli
    from attnprobe.cli.serve import build_from_args
    from attnprobe.models.io import load_model
    from attnprobe.oracles.hf_block import oracle_from_hf_block
    from attnprobe.service.server import BackgroundServer

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = llama_block_folder(Path(tmp) / "llama")
        learner = ["--method", "block", "--heads", "2", "--hidden", "64", "--quiet"]
        args = build_parser().parse_args(["serve", "--hf-dir", str(folder), "--block", "1", "--api-key", "k-1",
                                          "--budget", "1000000", "--max-batch", "4096", "--max-length", "1024"])
        app, _ = build_from_args(args)
        runs = {}
        with BackgroundServer(app) as srv:
            t = time.perf_counter()
            code = cli(["extract", "--url", srv.url, "--api-key", "k-1", "--answer-precision", "float64",
                        "--positions", "positional", *learner, "--out", str(Path(tmp) / "http.npz")])
            runs["http"] = (code, time.perf_counter() - t)
        t = time.perf_counter()
        code = cli(["extract", "--hf-dir", str(folder), "--block", "1", *learner,
                    "--out", str(Path(tmp) / "local.npz")])
        runs["local"] = (code, time.perf_counter() - t)
        a, b = np.load(Path(tmp) / "http.npz"), np.load(Path(tmp) / "local.npz")
        same = sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)
        victim = oracle_from_hf_block(folder, 1)
        layer = types.SimpleNamespace(every_position=victim.answer_rows, d=32)
        for name, label in (("http", "served over HTTP (`extract --url`)"), ("local", "in process (`--hf-dir`)")):
            report = json.loads((Path(tmp) / f"{name}.json").read_text())
            errs = errors_over_lengths(load_model(Path(tmp) / f"{name}.npz"), layer)
            rows.append((label, runs[name][0], report["queries"], f"{report['check']['relative_error']:.1e}",
                         "passed" if report["passed"] else "failed", "yes" if same else "NO",
                         f"{max(errs):.1e} (N = {int(np.argmax(errs)) + 1})", f"{runs[name][1]:.0f}"))
    return rows


E2E_HEAD = ["block", "queries", "unknowns", "check error", "check", "largest error over N = 1 … 64 (4 sequences each)",
            "seconds"]
E2E_TEXT = ("`extract_block` end to end (the FFN learned, then the attention, its logit refit and its polish; errors "
            "relative to the block's own part y − x, every position):")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--e2e", action="store_true", help="also run extract_block end to end at d = 32 (minutes)")
    ap.add_argument("--only", choices=("oracles", "ffn", "ffn128", "refit", "refit128", "e2e", "e2e128", "sketches",
                                       "served"),
                    help="only the sublayer oracles' table (a minute), or only the gated learner through the block "
                         "(d = 64 or 128; minutes)")
    ap.add_argument("--ffn-out", metavar="PATH", help="--only e2e128: run the FFN stage alone and save the FFN "
                                                      "to PATH (the first half of a split run)")
    ap.add_argument("--ffn", metavar="PATH", help="--only e2e128: the FFN saved by --ffn-out (the second half)")
    ap.add_argument("--att-out", metavar="PATH", help="--only e2e128 --ffn PATH: run the attention stages alone and "
                                                      "save the attention to PATH (the second part of three)")
    ap.add_argument("--att", metavar="PATH", help="--only e2e128: the attention saved by --att-out (the last part)")
    ap.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks/block.md")
    args = ap.parse_args()
    if args.only in ("refit", "refit128"):
        t = Table(["attention", "answers", "queries (RoPE learner)", "function error", "queries (refit)",
                   "after the refit", "Gauss–Newton steps", "seconds"])
        cases = ((SHAPES[0], False), (SHAPES[0], True)) if args.only == "refit" else ((SHAPES[2], False),)
        for shape, through in cases:
            t.add(*logit_refit(shape, through))
            print(t.markdown(), flush=True)
        body = ("The RoPE learner with every query at the attention oracle's rms, then the per-head logit refit "
                "(function error over 8 sequences of length 64, relative to the largest answer):\n\n" + t.markdown())
        width = "32" if args.only == "refit" else "128"
        publish("Attention logit refit at a fixed query rms, d = " + width, body, doc=DOC, write=args.write)
        return
    if args.only == "sketches":
        t = Table(["attention", "answers", "queries", "M(δ) rel. error, worst offset (heads: best … worst)",
                   "cond M(−1)", "eigenvalue moduli of M(−2) M(−1)⁻¹", "function error", "seconds"])
        for through in (False, True):
            t.add(*logit_matrices(SHAPES[2], through))
            print(t.markdown(), flush=True)
        body = ("The RoPE learner with every query at the attention oracle's rms (its logits stage's keys at rms "
                "TARGET_LOGIT/med, at most 1/2): each head's logit matrices against the truth in the learned "
                "bases, every offset; function error over 8 sequences of length 64, relative to the largest "
                "answer:\n\n" + t.markdown())
        publish("Logit matrices at a fixed query rms, d = 128", body, doc=DOC, write=args.write)
        return
    if args.only == "served":
        t = Table(["LLaMA layer 1 (d 32, 2/1 heads, SwiGLU 64)", "exit code", "queries", "check error", "check",
                   "the same arrays", "load_model(result): largest error over N = 1 … 64 (4 sequences each)",
                   "seconds"])
        for row in served_block():
            t.add(*row)
        body = ("`extract --method block --heads 2 --hidden 64` on a transformers LLaMA layer (norm weights not 1), "
                "served by `serve --hf-dir DIR --block 1` (uvicorn on 127.0.0.1) and in process; errors relative to "
                "the layer's own part y − x, every position:\n\n" + t.markdown())
        publish("The served block over HTTP, d = 32", body, doc=DOC, write=args.write)
        return
    if args.only == "e2e128":
        t = Table(["block", "queries", "unknowns", "FFN error", "attention error", "check error", "check",
                   "largest error over N = 1 … 64 (4 sequences each)", "seconds", "peak memory (GB)"])
        if args.ffn_out:
            ffn_stage(SHAPES[2], args.ffn_out)
            return
        if args.att_out:
            attention_stage(SHAPES[2], args.ffn, args.att_out)
            return
        t.add(*end_to_end_parts(SHAPES[2], args.ffn, args.att))
        body = E2E_TEXT + ("\n\nRun in parts (each under 20 minutes on a shared machine): `--ffn-out PATH` runs "
                           "the FFN stage as `extract_block` does and saves the FFN, " + (
                               "`--ffn PATH --att-out PATH2` the attention stages (the RoPE learner and the logit "
                               "refit) on it, `--ffn PATH --att PATH2` runs `extract_block(..., ffn=…, "
                               "attention=…)` (the polish and the check); queries and seconds are the parts' sums, "
                               "the peak memory the largest's." if args.att else
                               "`--ffn PATH` runs `extract_block(..., ffn=the saved FFN)`; queries and seconds are "
                               "the two halves' sums, the peak memory the larger's.") if args.ffn else "") + (
            "\n\n" + t.markdown())
        publish("extract_block end to end, d = 128", body, doc=DOC, write=args.write)
        return
    if args.only == "e2e":
        t = Table(E2E_HEAD)
        t.add(*end_to_end(SHAPES[0]))
        body = E2E_TEXT + "\n\n" + t.markdown()
        publish("extract_block end to end, d = 32", body, doc=DOC, write=args.write)
        return
    if args.only in ("ffn", "ffn128"):
        t = Table(["FFN", "answers from", "queries", "function error", "seconds"])
        if args.only == "ffn":
            for noise in (None, 1e-10, 1e-12):
                t.add(*gated_through_block(SHAPES[1], noise))
                print(t.markdown(), flush=True)
        else:
            t.add(*gated_through_block(SHAPES[2], None))
        body = ("The gated FFN learner (SwiGLU, width given, inputs of standard deviation ffn_scale(d) per coordinate) "
                "through the block's FFN oracle, and "
                "on the true FFN with noise (function error on 256 fresh rows of rms 0.4, relative to the largest "
                "answer):"
                "\n\n" + t.markdown())
        publish("Gated FFN learner through the block, d = " + ("64" if args.only == "ffn" else "128"), body, doc=DOC,
                write=args.write)
        return
    t1 = Table(["block", "queries (linear part, ε)", "√ε rel. error", "M' rel. error",
                "FFN oracle: median / worst row of 256", "attention oracle (N = 33)"])
    for shape in SHAPES:
        t1.add(*sublayer_oracles(shape))
        print(t1.markdown(), flush=True)
    t2 = Table(["attention", "queries asked", "queries", "function error", "after the attention polish (its time)"])
    for shape in SHAPES[:2] if args.only is None else ():
        for row in rope_fixed_query(shape, polish=shape == SHAPES[0]):
            t2.add(*row)
        print(t2.markdown(), flush=True)
    body = ("The sublayer oracles through the norm's inverse, against the truth (relative to the largest answer):\n\n"
            + t1.markdown())
    if args.only is None:
        body += ("\n\nThe RoPE learner on the true attention (last rows; function error over 8 sequences of length 64, "
              "relative to the largest answer):\n\n" + t2.markdown())
    if args.e2e and args.only is None:
        t3 = Table(E2E_HEAD)
        t3.add(*end_to_end(SHAPES[0]))
        body += "\n\n" + E2E_TEXT + "\n\n" + t3.markdown()
    publish("Block learner stages (random LLaMA-shaped blocks; float64)", body, doc=DOC, write=args.write)


if __name__ == "__main__":
    main()
