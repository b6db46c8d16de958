"""Research: the RoPE learner's float64 stages on coarse (float32, bfloat16) answers, LLaMA d = 32, 2/1 heads,
d_h = 16 (a random-init ``LlamaAttention``). Why the learner refuses coarse answers, measured stage by stage: the
pair probe's head output spaces (largest residual of a recovered ``C_h`` outside the nearest true head's column
space, over heads), the whole float64 pipeline with its float64-only tolerances relaxed (the rotation's
eigenvalue moduli 0.1 from 1, static angle 1e-3, α clipped at 1e-12, each head's width d/H given), its function
error at the last position (lengths ≤ 256, relative), the frequencies' relative errors, the base fitted to the
three highest frequencies, and the joint polish (``polish``, frequencies free) from that start on fresh answers.
Pokes the learner's private stages on purpose (research, not shipped).

    PYTHONPATH=src python benchmarks/research/rope_coarse.py > benchmarks/research/rope_coarse.out
"""

from __future__ import annotations

import math
import time

import numpy as np

import attnprobe.learners.positional.rope as rope
import attnprobe.learners.positional.rotation as rotation
from attnprobe.errors import AttnprobeError
from attnprobe.learners.positional.polish import fresh_answers, polish
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.targets.positional_modules import positional_victim, reference_model

D, H, G = 32, 2, 1
LENGTHS = (1, 2, 3, 5, 17, 64, 100, 200, 256)


def subspace_error(Cb, truth, dh):
    worst = 0.0
    for h in range(H):
        C = Cb[:, h * dh:(h + 1) * dh]
        res = []
        for g in range(H):
            T = np.linalg.qr(truth.Wo[:, g * dh:(g + 1) * dh])[0]
            res.append(np.linalg.norm(C - T @ (T.T @ C)) / math.sqrt(dh))
        worst = max(worst, min(res))
    return worst


def main() -> None:
    truth = reference_model(positional_victim("llama", d=D, heads=H, kv_heads=G, seed=0, dtype="float64"))
    dh = D // H
    rope.FINEST = 1.0
    rotation.STATIC_ANGLE = 1e-3
    out_spaces = rope._output_spaces
    rope._output_spaces = lambda dirs, M, head_dim=None: out_spaces(dirs, M, dh)
    weights = rope.attention_weights

    def clipped(Pc, Gm, toks, Y):
        coords = np.einsum("hjk,bk->bhj", Pc, Y)
        A = np.einsum("hjd,bnd->bhjn", Gm, toks)
        return np.maximum(np.einsum("bhnj,bhj->bhn", np.linalg.pinv(A), coords), 1e-12)

    print("| answers | pair-probe step | output spaces off | pipeline | function error ≤ 256 | θ rel. error "
          "(high … low) | base fit | polish (300 seq.): misfit, function error, s |")
    print("|---|---|---|---|---|---|---|---|")
    for precision, step in (("float64", 0.01), ("float32", 0.01), ("float32", 0.1), ("float32", 0.2), ("float32", 0.4),
                            ("bfloat16", 0.2)):
        oracle = oracle_from_torch(positional_victim("llama", d=D, heads=H, kv_heads=G, seed=0, dtype=precision),
                                   D, precision=precision)
        rope.STEP = step
        rng = np.random.default_rng(0)
        M, _ = rope._values(oracle, rng, math.sqrt(D))
        dirs, _ = rope._pair_probe(oracle, M, rng, H, oracle.eps, 1)
        off = subspace_error(out_spaces(dirs, M, dh)[0], truth, dh)
        rope.attention_weights = clipped if precision != "float64" else weights
        rotation_tol = 0.1 if precision != "float64" else 1e-3
        cells = [precision, step, f"{off:.1e}"]
        try:
            rotation.MODULUS = rotation_tol
            res = rope.extract_positional(oracle, heads=H, seed=0, check=False)
        except AttnprobeError as exc:
            print("| " + " | ".join(map(str, cells + [f"refused: {exc}", "–", "–", "–", "–"])) + " |", flush=True)
            continue
        err = function_error_over_lengths(res.model, truth, np.random.default_rng(5), LENGTHS)
        th = np.asarray(res.model.inv_freq) / np.asarray(truth.inv_freq) - 1
        k = np.arange(3)
        slope = np.polyfit(2 * k / dh, np.log(np.asarray(res.model.inv_freq)[:3]), 1)[0]
        t0 = time.perf_counter()
        pol, rep = polish(res.model, fresh_answers(oracle, 300, np.random.default_rng(1)), frequencies=True)
        perr = function_error_over_lengths(pol, truth, np.random.default_rng(5), LENGTHS)
        cells += [f"ran ({res.queries} seq.)", f"{err:.1e}", f"{abs(th[0]):.0e} … {abs(th[-1]):.0e}",
                  f"{math.exp(-slope):.6g}", f"{rep.misfit_before:.1e} → {rep.misfit_after:.1e}, {err:.1e} → "
                  f"{perr:.1e}, {time.perf_counter() - t0:.0f}"]
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)


if __name__ == "__main__":
    main()
