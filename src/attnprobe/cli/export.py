"""``attnprobe export``: write a recovered attention layer (or a whole recovered block: ``--method block``) into a
Hugging Face folder of the victim's family."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnprobe.cli.common import hf_inputs, inside
from attnprobe.errors import CheckFailedError, ConfigError

#: sequences and lengths of the check that OUT's sublayer answers like the result
CHECK_SEQUENCES, CHECK_LENGTHS = 16, (1, 2, 5, 9)
#: relative error the check allows: 1e4 × the unit roundoff of the dtype OUT is saved in, at least 1e-8 (the SVD
#: factors of an ill-conditioned W_h lose a few digits) and at most 0.1 (bfloat16)
CHECK_FACTOR, CHECK_FLOOR, CHECK_CEILING = 1e4, 1e-8, 0.1


def run(args) -> int:
    from attnprobe.models import load_model
    from attnprobe.models.rows import AnswerRows
    from attnprobe.models.precision import machine_epsilon
    from attnprobe.oracles.hf_attention import oracle_from_hf
    from attnprobe.targets.hf_export import check_out_folder, export_layer

    if args.layers not in (None, 1):
        raise ConfigError(f"--layers is 1 (a one-layer folder) or left out (every layer of --hf-dir); "
                          f"got {args.layers}", param="layers")
    _, folders = hf_inputs(args.hf_dir)
    for folder in folders:  # the victim's folder is read, never written into
        if inside(Path(args.out), folder):
            raise ConfigError(f"--out {args.out} is the input folder {folder} or lies inside it, whose files it "
                              "would overwrite; write the exported model to another folder", param="out")
    check_out_folder(args.out)  # a file or a folder holding files is refused before any work
    model = load_model(args.result)  # refuses a broken or hostile file before anything is written
    out, dropped = export_layer(args.result, args.hf_dir, args.layer, args.out, layers=args.layers,
                                dtype=args.dtype)
    at = 0 if args.layers == 1 else args.layer
    rng = np.random.default_rng(args.seed)
    worst = 0.0
    kind = getattr(model, "kind", "")
    if kind == "transformer_block":  # the whole layer, every position, against the block's own part y − x
        from attnprobe.oracles.hf_block import oracle_from_hf_block

        oracle = oracle_from_hf_block(out, at, dtype=args.dtype)

        def answers(X):
            return oracle.answer_rows(X), model.every_position(X), X
    else:  # a result that answers every row is compared with the exported layer's every row
        rows = isinstance(model, AnswerRows)
        oracle = oracle_from_hf(out, at, dtype=args.dtype, positional=kind == "positional_attention",
                                every_position=rows)
        answer = oracle.answer_rows if rows else oracle

        def answers(X):
            return answer(X), model(X), 0.0
    for N in CHECK_LENGTHS:  # what transformers loads from OUT answers like the recovered layer
        got, want, base = answers(rng.standard_normal((CHECK_SEQUENCES, N, model.d)))
        worst = max(worst, float(np.abs(got - want).max() / max(np.abs(want - base).max(), 1e-300)))
    # the result's noise beyond the head width is cut off (W_h and V_h have rank d_h): allow 10× its size
    # (the kernel's softmax precision counts: LLaMA-family eager attention and BLOOM compute it in float32)
    tolerance = min(CHECK_CEILING, max(CHECK_FLOOR, CHECK_FACTOR * machine_epsilon(oracle.precision), 10 * dropped))
    what = "block; the layer" if kind == "transformer_block" else "attention; its sublayer"
    if kind not in ("positional_attention", "transformer_block"):
        how = f"the result's parts beyond the head width, at most {dropped:.1e} of each W_h and V_h, were cut off"
    elif getattr(model, "layout", None) == "post":
        how = "a post-norm block: every head's maps as the family stores them, both LayerNorms and the FFN"
    else:
        how = f"heads sharing keys and values written once per KV group, in the RoPE gauge: misfit {dropped:.1e}"
    print(f"wrote {out}: layer {at} holds the recovered {what}, loaded with transformers, answers "
          f"like the result to {worst:.2e} (relative, {CHECK_SEQUENCES * len(CHECK_LENGTHS)} random sequences; {how})")
    if not worst <= tolerance:
        raise CheckFailedError(f"the exported layer answers unlike the result ({worst:.2e} > {tolerance:.1e}); "
                               f"{out} was written but does not hold the recovered layer")
    return 0


def add_parser(sub) -> None:
    e = sub.add_parser("export", help="write a recovered attention layer (or block) into a Hugging Face "
                                      "folder of the victim's family")
    e.add_argument("--result", required=True, metavar="R.npz",
                   help="an extract result (whole-row multi-head, RoPE, or a whole block)")
    e.add_argument("--hf-dir", required=True, metavar="DIR", help="the victim's Hugging Face folder: its family, "
                                                                 "config and every other weight")
    e.add_argument("--layer", required=True, type=int, metavar="L", help="the layer the result was extracted from")
    e.add_argument("--out", required=True, metavar="OUT", help="the folder to write (config.json, model.safetensors)")
    e.add_argument("--layers", type=int, metavar="1", help="1: write a one-layer model (layer 0 = the recovered "
                                                           "attention); default: every layer of DIR")
    e.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default="float64",
                   help="the dtype OUT is saved in (default float64)")
    e.add_argument("--seed", type=int, default=0, help="seed of the check's random sequences")
    e.set_defaults(func=run)
