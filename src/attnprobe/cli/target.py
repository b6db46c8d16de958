"""``attnprobe target``: save a ready-made target model to a file."""

from __future__ import annotations

from attnprobe.models import save_model


def run(args) -> int:
    if args.kind == "random":
        from attnprobe.targets import random_head

        model = random_head(args.d, seed=args.seed, scale=args.scale, rank=args.rank, bias=not args.no_bias,
                            zero_v=args.zero_v)
    elif args.kind in ("transformer", "relu"):
        from attnprobe.targets import random_relu_net, random_transformer

        m = args.m or args.d
        model = (random_transformer(args.d, m, seed=args.seed, scale=args.scale, rank=args.rank)
                 if args.kind == "transformer" else
                 random_relu_net(args.d, m, seed=args.seed, bias=args.relu_bias, outputs=args.outputs))
    else:
        from attnprobe.targets import minilm_head

        model = minilm_head(args.layer, args.head, args.row)
    path = save_model(model, args.out)
    print(f"wrote {model.kind} (d = {model.d}) to {path}")
    return 0


def add_parser(sub) -> None:
    t = sub.add_parser("target", help="save a ready-made target model to a file")
    t.add_argument("kind", choices=["random", "minilm", "transformer", "relu"])
    t.add_argument("--d", type=int, default=16)
    t.add_argument("--m", type=int, help="transformer/relu: hidden width of the FFN (default d)")
    t.add_argument("--rank", type=int)
    t.add_argument("--scale", type=float, default=1.0, help="RMS attention logit on unit inputs")
    t.add_argument("--zero-v", type=int, default=0, help="number of zero entries of v")
    t.add_argument("--no-bias", action="store_true")
    t.add_argument("--relu-bias", action="store_true", help="relu: hidden biases b and output bias c")
    t.add_argument("--outputs", type=int, metavar="K", help="relu: K outputs per input (w_o of shape m×K)")
    t.add_argument("--layer", type=int, default=0)
    t.add_argument("--head", type=int, default=0)
    t.add_argument("--row", type=int, default=0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", required=True)
    t.set_defaults(func=run)
