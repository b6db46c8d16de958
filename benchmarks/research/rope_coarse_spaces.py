"""Research: how accurate the heads' value maps must be for the coarse RoPE route's logit stage, LLaMA d = 128,
8/2 heads, d_h = 16, float32 answers (a random-init ``LlamaAttention``, seed 0).

The coarse start (``learners/positional/coarse.py``) reads each head's log-weights ``ℓ = log α_hj/α_h0`` by solving
the weights in each head's coordinates (``log_weights``: ``Cb⁺`` then ``(G_h X)⁺``). Here the value maps are the
truth's ``V_h = W_O,h W_V,g(h)``, perturbed by a random matrix of relative Frobenius size ``pert`` (then split as the
route splits them), so each row isolates the logit stage: the log-weights' error against the true logits
(``s (W_Q,h z)ᵀ R(δ) (W_K,g x)``) at the route's offsets, and the start's function error per length (the logit maps
from ``logit_maps`` without its alternating least squares, ``rounds=0``: at d = 128 its dense normal equations,
2048 unknowns per half-step, take over ten minutes). Pokes nothing private; not shipped.

    PYTHONPATH=src python benchmarks/research/rope_coarse_spaces.py
    PYTHONPATH=src python benchmarks/research/rope_coarse_spaces.py --extra 16 256 --pert 1e-4
    PYTHONPATH=src python benchmarks/research/rope_coarse_spaces.py --directions

``--extra``: ``logit_maps``' sequences beyond ``d`` per regression of its stage (a) (more also adds key sets), one row
each. ``--directions``: the pair probe's head directions at three random queries (largest error over heads against
the truth ``V_h z``), float64 and float32 answers, per Chebyshev step (of the token norm), nodes and degree: whether
their error at d = 128 is the fit's truncation (falls with the step) or the answers' rounding.
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import numpy as np

from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.positional import coarse
from attnprobe.learners.positional.heads import head_directions, match
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention, rope_frequencies, rotation_matrix
from attnprobe.oracles.torch_adapter import oracle_from_torch
from attnprobe.targets.positional_modules import positional_victim, reference_model

D, H, G = 128, 8, 2
LENGTHS = (2, 17, 256)
PERTS = (0.0, 1e-4, 1e-3, 5e-3)


def perturbed_spaces(truth, pert: float, rng):
    """The truth's value maps, each moved by ``pert`` (relative Frobenius), split as the route splits them."""
    dh = D // H
    Cb = truth.Wo
    Gm = np.stack([truth.Wv[truth.group(h)] for h in range(H)])
    V = np.stack([Cb[:, h * dh:(h + 1) * dh] @ Gm[h] for h in range(H)])
    M = V.sum(axis=0)
    V = V + pert * np.linalg.norm(V, axis=(1, 2), keepdims=True) * rng.standard_normal(V.shape) / D
    return coarse.split_value_maps(V, M) if pert else (Cb, Gm)


def logit_rows(perts, extras) -> None:
    kw = dict(d=D, heads=H, kv_heads=G, seed=0)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    dh = D // H
    theta = rope_frequencies(dh, 10000.0)
    offs = np.array(coarse.LOGIT_OFFSETS)
    print(f"cond(W_O) = {np.linalg.cond(truth.Wo):.0f}")
    print("| V_h moved (relative) | extra | log-weights: median error | 90th percentile | not positive | start: "
          "function error at N = " + ", ".join(map(str, LENGTHS)) + " | logit sequences | s |")
    print("|---|---|---|---|---|---|---|---|")
    for pert in perts:
        for extra in extras:
            rng = np.random.default_rng(1)
            oracle = oracle_from_torch(positional_victim("llama", dtype="float32", **kw), D, precision="float32")
            Cb, Gm = perturbed_spaces(truth, pert, rng)
            toks = rng.standard_normal((200, len(offs) + 1, D)) * 0.86
            ell = coarse.log_weights(oracle, Cb, Gm, np.zeros(D), toks, np.tile(offs, (200, 1)), int(-offs.min()))
            true = np.empty_like(ell)
            for h in range(H):
                q = truth.scale * toks[:, -1] @ truth.Wq[h].T
                for j, o in enumerate(list(offs) + [0]):
                    k = toks[:, j] @ truth.Wk[truth.group(h)].T @ rotation_matrix(float(o), theta, dh).T
                    true[:, h, j] = np.sum(q * k, axis=1)
            err = np.abs(ell - true)
            t0 = time.perf_counter()
            Wq, Wk, count = coarse.logit_maps(oracle, rng, Cb, Gm, np.zeros(D), theta, 0.86, rounds=0, extra=extra)
            start = PositionalAttention(Wq, Wk, Gm, Cb, position="rope", inv_freq=theta, layout="half", scale=1.0)
            fn = [function_error_over_lengths(start, truth, np.random.default_rng(5), (n,)) for n in LENGTHS]
            print(f"| {pert:.0e} | {extra} | {np.nanmedian(err):.1e} | {np.nanpercentile(err, 90):.1e} | "
                  f"{np.mean(np.isnan(ell)):.1%} | " + " / ".join(f"{e:.1e}" for e in fn) +
                  f" | {count} | {time.perf_counter() - t0:.0f} |", flush=True)


def direction_rows() -> None:
    kw = dict(d=D, heads=H, kv_heads=G, seed=0)
    V = reference_model(positional_victim("llama", dtype="float64", **kw)).value_maps()
    print("| answers | step (of the token norm) | nodes | degree | largest direction error at 3 queries |")
    print("|---|---|---|---|---|")
    for prec in ("float64", "float32"):
        oracle = oracle_from_torch(positional_victim("llama", dtype=prec, **kw), D, precision=prec)
        for step, nodes, degree in ((0.3, 16, 15), (0.15, 16, 15), (0.08, 16, 15), (0.3, 32, 31), (0.5, 32, 31)):
            errs = []
            for seed in range(3):
                rng = np.random.default_rng(seed)
                z = rng.standard_normal(D)
                E = random_orthogonal(D, rng)[: 2 * H + 8]
                W, _, _ = head_directions(oracle, z, E, settings=coarse.SETTINGS, rank=H, noise=0.0, rng=rng,
                                          eta=step * math.sqrt(D), jacobian=functools.partial(
                                              coarse.pair_derivative, nodes=nodes, degree=degree))
                true = np.stack([V[h] @ z for h in range(H)], 1)
                true /= np.linalg.norm(true, axis=0)
                errs.append(np.max(np.linalg.norm(match(true, W) - true, axis=0)))
            print(f"| {prec} | {step} | {nodes} | {degree} | " + " · ".join(f"{e:.1e}" for e in errs) + " |",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pert", type=float, nargs="+", default=list(PERTS), help="relative moves of the value maps")
    ap.add_argument("--extra", type=int, nargs="+", default=[16], help="logit_maps' extra sequences per regression")
    ap.add_argument("--directions", action="store_true", help="the pair probe's head directions instead")
    args = ap.parse_args()
    if args.directions:
        direction_rows()
    else:
        logit_rows(args.pert, args.extra)


if __name__ == "__main__":
    main()
