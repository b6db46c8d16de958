"""Research: the logit start at LLaMA-3-8B's head shape from row spaces (docs/positional.md, "The logit start at
LLaMA-3-8B's head shape: row spaces, then linear"): a random-init float32 ``LlamaAttention`` (seed 0, d_h = 128,
H = d/128, G = max(1, H/4), base 5e5 declared) answering every row, the value maps of ``rope_8b_rows_route.py
maps`` (saved under /tmp/rope8b), against the float64 module.

    spaces   anchor_row_spaces: the query row spaces (``--families`` anchor families of ``--anchors`` anchors,
             ``--slots`` probes, ``--sequences`` per family) or the key row spaces (``--side key``); the largest
             principal angle (sine) of every head's / group's space against the truth's; saved
             /tmp/rope8b/spaces-<side>_<d>.npz
    maps     subspace_logits: absolute logits of ``--sequences`` zero-led sequences (``--lead`` zeros, ``--tokens``
             tokens), the reduced matrices at subspace_logits.OFFSETS, the gauge (``--tol``; ``--refine``
             alternating rounds on the matrices), the start's function error at lengths 2 / 17 / 64 / 256 and
             over every length; ``--truth-spaces`` takes the truth's row
             spaces (to tell the spaces' error from the rest); saved /tmp/rope8b/logits-anchor_<d>.npz (the row
             polish of ``rope_8b_rows_route.py polish --logits anchor`` starts there)

    PYTHONPATH=src python benchmarks/research/rope_8b_anchor_start.py spaces --d 256 --side query
    PYTHONPATH=src python benchmarks/research/rope_8b_anchor_start.py spaces --d 256 --side key
    PYTHONPATH=src python benchmarks/research/rope_8b_anchor_start.py maps --d 256
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from research.rope_8b_rows_route import (ALL, matched_truth_logits, path, peak_gb, saved_maps, setup,  # noqa: E402
                                         start_model)

from attnprobe.learners.positional import anchor_row_spaces as ars  # noqa: E402
from attnprobe.learners.positional import subspace_logits as sl  # noqa: E402
from attnprobe.learners.positional.row_logits import BlockTokens  # noqa: E402
from attnprobe.models.compare import function_error_over_lengths  # noqa: E402
from attnprobe.models.positional import rotation_matrix  # noqa: E402


def largest_angle(B: np.ndarray, W: np.ndarray) -> float:
    """The sine of the largest principal angle between the rows of ``B`` (orthonormal) and ``W``'s row space."""
    s = np.linalg.svd(B @ np.linalg.qr(W.T)[0], compute_uv=False)
    return float(math.sqrt(max(0.0, 1.0 - s.min() ** 2)))


def spaces(args, truth, fn, oracle, rng):
    v, V, G, Cb, Gh, theta = saved_maps(args.d, oracle)
    H, dh, d = Gh.shape
    per = H // G
    Wq, Wk = matched_truth_logits(truth, V)
    fams = []
    for _ in range(args.families):
        anchors = rng.standard_normal((args.anchors, d))
        probes = BlockTokens.random(args.sequences, args.slots, d, rng)
        fams.append((probes, ars.anchor_logits(oracle, Cb, Gh, v["c"], anchors, probes, args.sequences,
                                                   side=args.side)))
    probes = ars.joined([p for p, _ in fams])
    t0 = time.perf_counter()
    out, angles = [], []
    for q in range(H if args.side == "query" else G):
        Ys = [Y[:, :, q] if args.side == "query" else Y[:, :, q * per:(q + 1) * per].reshape(*Y.shape[:2], -1)
              for _, Y in fams]
        B = ars.column_subspace(probes, Ys, dh, rng, intercept=args.side == "key", rounds=args.rounds,
                                cg_steps=args.cg_steps)
        out.append(B)
        angles.append(largest_angle(B, Wq[q] if args.side == "query" else Wk[q]))
        print(f"  {args.side} {q}: largest angle {angles[-1]:.2e} ({time.perf_counter() - t0:.0f} s)", flush=True)
    np.savez(path(args.d, f"spaces-{args.side}"), B=np.stack(out))
    return {"error": max(angles), "what": f"{args.side} row spaces, largest angle", "learner": time.perf_counter() - t0}


def maps(args, truth, fn, oracle, rng):
    from attnprobe.learners.positional.absolute_logits import absolute_logit_samples

    v, V, G, Cb, Gh, theta = saved_maps(args.d, oracle)
    H, dh, d = Gh.shape
    if args.truth_spaces:
        Wq, Wk = matched_truth_logits(truth, V)
        U = np.stack([np.linalg.qr(w.T)[0].T for w in Wq])
        K = np.stack([np.linalg.qr(w.T)[0].T for w in Wk])
    else:
        U, K = np.load(path(args.d, "spaces-query"))["B"], np.load(path(args.d, "spaces-key"))["B"]
    data = absolute_logit_samples(oracle, Cb, Gh, v["c"], rng, sequences=args.sequences, tokens=args.tokens,
                                  length=args.lead + args.tokens, lead=args.lead)
    t0 = time.perf_counter()
    print(f"  {fn.tokens:,} tokens asked; samples {len(data['ell']):,}", flush=True)
    offsets = tuple(int(x) for x in args.offsets.split(","))
    M = sl.offset_matrices(data, U, K, offsets)
    print(f"  reduced matrices {time.perf_counter() - t0:.0f} s", flush=True)
    Wq_t, Wk_t = matched_truth_logits(truth, V)
    per = H // G
    for o, dl in enumerate(offsets):
        R = rotation_matrix(float(dl), theta, dh)
        off = [np.linalg.norm(M[h, o] - U[h] @ Wq_t[h].T @ R @ Wk_t[h // per] @ K[h // per].T)
               / np.linalg.norm(M[h, o]) for h in range(H)]
        print(f"  reduced matrix at {dl}: {max(off):.1e} off (worst head)", flush=True)
    Wq, Wk = sl.maps_from_subspaces(M, U, K, theta, offsets, tol=args.tol, refine=args.refine)
    learner = time.perf_counter() - t0
    model = start_model(Wq, Wk, Cb, Gh, v["c"], theta)
    np.savez(path(args.d, "logits-anchor"), **model.arrays())
    for n in (2, 17, 64, 256):
        err = function_error_over_lengths(model, truth, np.random.default_rng(5), (n,), per_length=2)
        print(f"  length {n}: {err:.2e}", flush=True)
    err = function_error_over_lengths(model, truth, np.random.default_rng(5), ALL, per_length=args.per_length)
    return {"error": err, "what": "function (anchor start)", "learner": learner}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=("spaces", "maps"))
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--side", default="query", choices=("query", "key"))
    ap.add_argument("--families", type=int, help="spaces: anchor families (default 2 query, 1 key)")
    ap.add_argument("--anchors", type=int, default=80, help="spaces: anchors per family")
    ap.add_argument("--slots", type=int, default=ars.SLOTS, help="spaces: probes per sequence")
    ap.add_argument("--sequences", type=int, help="sequences (spaces: per family, default 300 query / 400 key; "
                    "maps: default 600)")
    ap.add_argument("--rounds", type=int, default=20, help="spaces: alternating rounds")
    ap.add_argument("--cg-steps", type=int, default=ars.CG_STEPS)
    ap.add_argument("--tokens", type=int, default=64, help="maps: tokens per sequence")
    ap.add_argument("--lead", type=int, default=32, help="maps: zeros before them")
    ap.add_argument("--tol", type=float, default=1e-9, help="maps: the gauge's cluster tolerance")
    ap.add_argument("--refine", type=int, default=50, help="maps: alternating rounds on the reduced matrices")
    ap.add_argument("--offsets", default=",".join(map(str, sl.OFFSETS)), help="maps: the reduced matrices' offsets")
    ap.add_argument("--truth-spaces", action="store_true")
    ap.add_argument("--per-length", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.families is None:
        args.families = 2 if args.side == "query" else 1
    if args.sequences is None:
        args.sequences = 600 if args.stage == "maps" else (300 if args.side == "query" else 400)
    import torch

    torch.set_num_threads(1)
    truth, fn, oracle = setup(args.d)
    H, dh = truth.Wq.shape[:2]
    t0 = time.perf_counter()
    with oracle.phase(args.stage, fresh=True):
        out = globals()[args.stage](args, truth, fn, oracle, np.random.default_rng(args.seed + 7))
    total = time.perf_counter() - t0
    print(f"| {args.d} | {H}/{truth.Wk.shape[0]} | {args.stage}{'-' + args.side if args.stage == 'spaces' else ''} "
          f"| {oracle.queries:,} | {fn.tokens:,} | {fn.seconds:.0f} | {out['learner']:.0f} | {peak_gb():.2f} | "
          f"{out['error']:.2e} ({out['what']}) | total {total:.0f} s", flush=True)


if __name__ == "__main__":
    main()
