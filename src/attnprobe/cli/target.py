"""``attnprobe target``: save a ready-made target model to a file."""

from __future__ import annotations

from attnprobe.cli.common import nonneg_int, plan_outputs, positive_float, positive_int, refuse_memory
from attnprobe.errors import ConfigError
from attnprobe.models import save_model

#: a random target of width d holds W and its factors K, Q: about 3·8·d² bytes
TARGET_BYTES_PER_D2 = 3 * 8


def _refuse_options(args) -> None:
    """Options that cannot describe the model asked for are refused before anything is written."""
    from attnprobe.errors import ConfigError

    if args.zero_v and args.kind != "random":
        raise ConfigError(f"--zero-v is for target random; drop it for target {args.kind}", param="zero_v")
    if args.zero_v > args.d:
        raise ConfigError(f"--zero-v {args.zero_v} asks for more zero entries of v than its d = {args.d} entries; "
                          f"give at most {args.d}", param="zero_v")
    multihead_tf = args.kind == "transformer" and args.heads is not None
    if args.outputs is not None and args.kind not in ("relu", "smooth-ffn", "gated-ffn") and not multihead_tf:
        raise ConfigError(f"--outputs is for target relu, smooth-ffn, gated-ffn and transformer --heads; drop it for "
                          f"target {args.kind}", param="outputs")
    if args.m is not None and args.kind not in ("relu", "transformer", "smooth-ffn", "gated-ffn"):
        raise ConfigError(f"--m (hidden units) is for target relu, transformer, smooth-ffn and gated-ffn; drop it for "
                          f"target {args.kind}", param="m")
    if args.heads is not None and args.kind not in ("multihead", "transformer"):
        raise ConfigError(f"--heads is for target multihead and transformer; drop it for target {args.kind}",
                          param="heads")
    if args.activation is not None and args.kind not in ("smooth-ffn", "gated-ffn"):
        raise ConfigError(f"--activation is for target smooth-ffn and gated-ffn; drop it for target {args.kind}",
                          param="activation")
    gated = ("swiglu", "geglu", "geglu_tanh")
    if args.kind == "gated-ffn" and args.activation not in (None, *gated):
        raise ConfigError(f"--activation {args.activation} is a plain activation; target gated-ffn takes "
                          f"{', '.join(gated)}", param="activation")
    if args.kind == "smooth-ffn" and args.activation in gated:
        raise ConfigError(f"--activation {args.activation} is gated; use target gated-ffn for it", param="activation")
    if args.residual and not multihead_tf:
        raise ConfigError("--residual is for target transformer --heads; drop it or give --heads", param="residual")


def run(args) -> int:
    _refuse_options(args)
    path, _ = plan_outputs(args.out, folders=[args.model_dir])
    if args.kind == "hf-attention":
        from attnprobe.cli.hf import write_target

        return write_target(args)
    if args.model_dir is not None:
        raise ConfigError("--model-dir goes with target hf-attention", param="model_dir")
    row = 0 if args.row is None else args.row
    if args.kind not in ("minilm", "minilm-layer", "minilm-ffn"):
        refuse_memory(TARGET_BYTES_PER_D2 * args.d * max(args.d, args.m or 0), f"a random target of width {args.d}",
                      "d")
    if args.kind == "random":
        from attnprobe.targets import random_head

        model = random_head(args.d, seed=args.seed, scale=args.scale, rank=args.rank, bias=not args.no_bias,
                            zero_v=args.zero_v)
    elif args.kind == "transformer" and args.heads is not None:
        from attnprobe.targets import random_multihead_transformer

        model = random_multihead_transformer(args.d, args.heads, args.d if args.m is None else args.m,
                                             outputs=1 if args.outputs is None else args.outputs, bias=not args.no_bias,
                                             residual=args.residual, head_dim=args.head_dim, seed=args.seed,
                                             scale=args.scale)
    elif args.kind in ("transformer", "relu"):
        from attnprobe.targets import random_relu_net, random_transformer

        m = args.d if args.m is None else args.m
        model = (random_transformer(args.d, m, seed=args.seed, scale=args.scale, rank=args.rank)
                 if args.kind == "transformer" else
                 random_relu_net(args.d, m, seed=args.seed, bias=args.relu_bias, outputs=args.outputs))
    elif args.kind == "multihead":
        return _multihead(args)
    elif args.kind == "smooth-ffn":
        from attnprobe.targets import random_smooth_ffn

        model = random_smooth_ffn(args.d, 4 * args.d if args.m is None else args.m, args.outputs,
                                  activation=args.activation or "gelu", bias=not args.no_bias, seed=args.seed)
    elif args.kind == "gated-ffn":
        from attnprobe.models.gated_ffn import GATED_FAMILIES
        from attnprobe.targets import random_gated_ffn

        model = random_gated_ffn(args.d, 2 * args.d if args.m is None else args.m, args.outputs,
                                 activation=GATED_FAMILIES[args.activation or "swiglu"], bias=not args.no_bias,
                                 seed=args.seed)
    elif args.kind == "minilm-ffn":
        from attnprobe.targets import minilm_ffn

        model = minilm_ffn(args.layer)
    elif args.kind == "minilm-layer":
        from attnprobe.targets import minilm_layer

        model = minilm_layer(args.layer, row)
    else:
        from attnprobe.targets import minilm_head

        model = minilm_head(args.layer, args.head, row)
    save_model(model, path)
    print(f"wrote {model.kind} (d = {model.d}) to {path}")
    return 0


def _multihead(args) -> int:
    """A random multi-head layer; with ``--orthogonal`` its head subspaces go to OUT_subspaces.npz too."""
    import numpy as np

    from attnprobe.errors import ConfigError
    from attnprobe.targets import random_multihead, random_orthogonal_multihead

    if args.heads is None:
        raise ConfigError("give the number of heads with --heads H", param="heads")
    kw = dict(seed=args.seed, bias=not args.no_bias, scale=args.scale)
    if args.orthogonal:
        model, E = random_orthogonal_multihead(args.d, args.heads, args.head_dim, **kw)
    else:
        model, E = random_multihead(args.d, args.heads, args.head_dim, **kw), None
    path = save_model(model, args.out)
    print(f"wrote {model.kind} (d = {model.d}, H = {model.H}) to {path}")
    if E is not None:
        sub = path.with_name(path.stem + "_subspaces.npz")
        np.savez(sub, subspaces=E)
        print(f"wrote its head subspaces (H, d, d_h) = {E.shape} to {sub} (for extract --subspaces)")
    return 0


def add_parser(sub) -> None:
    t = sub.add_parser("target", help="save a ready-made target model to a file")
    t.add_argument("kind", choices=["random", "minilm", "minilm-layer", "transformer", "relu", "multihead",
                                    "hf-attention", "smooth-ffn", "gated-ffn", "minilm-ffn"])
    t.add_argument("--model-dir", metavar="DIR",
                   help="hf-attention: a Hugging Face model folder (config.json, model.safetensors) of a family "
                        "without position terms (BERT, RoBERTa, ELECTRA, DistilBERT, ALBERT, GPT-2)")
    t.add_argument("--d", type=positive_int, default=16)
    t.add_argument("--m", type=positive_int, help="transformer/relu: hidden width of the FFN (default d; smooth-ffn: "
                                                  "4d; gated-ffn: 2d gated units)")
    t.add_argument("--activation", choices=["gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh"],
                   help="smooth-ffn: the activation (default gelu); gated-ffn: swiglu (default), geglu, geglu_tanh; "
                        "their biases go with --no-bias")
    t.add_argument("--rank", type=positive_int)
    t.add_argument("--heads", type=positive_int,
                   help="multihead: number of heads H; transformer: H heads, FFN biases (--no-bias: none), "
                        "--outputs K, --residual (without --heads: the one-head Sec. 4.1 model)")
    t.add_argument("--residual", action="store_true", help="transformer --heads: x_N + a(X) feeds the FFN")
    t.add_argument("--head-dim", type=positive_int, help="multihead: head dimension d_h (default d // H)")
    t.add_argument("--orthogonal", action="store_true",
                   help="multihead: heads in mutually orthogonal subspaces (App. C); also writes OUT_subspaces.npz")
    t.add_argument("--scale", type=positive_float, default=1.0, help="RMS attention logit on unit inputs")
    t.add_argument("--zero-v", type=nonneg_int, default=0, help="number of zero entries of v")
    t.add_argument("--no-bias", action="store_true")
    t.add_argument("--relu-bias", action="store_true", help="relu: hidden biases b and output bias c")
    t.add_argument("--outputs", type=positive_int, metavar="K",
                   help="relu / transformer --heads: K outputs per input (w_o of shape m×K); smooth-ffn: K (default d)")
    t.add_argument("--layer", type=nonneg_int, default=0)
    t.add_argument("--head", type=nonneg_int, default=0)
    t.add_argument("--row", type=nonneg_int,
                   help="output row R read by minilm/minilm-layer (default 0); hf-attention: one output row "
                        "instead of the whole row")
    t.add_argument("--seed", type=nonneg_int, default=0)
    t.add_argument("--out", required=True)
    t.set_defaults(func=run)
