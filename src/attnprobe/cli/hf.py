"""Hugging Face model folders on the command line: ``extract --hf-dir DIR --layer L`` (the live torch module as
the victim), ``target hf-attention --model-dir DIR --layer L`` and ``audit --hf-dir DIR``."""

from __future__ import annotations

from attnprobe.errors import ConfigError


def add_source_arguments(group) -> None:
    """``extract``'s options for a Hugging Face victim (``--dtype`` is the precision the module runs in)."""
    group.add_argument("--hf-dir", metavar="DIR",
                       help="a Hugging Face model folder (config.json, model.safetensors) of BERT, RoBERTa, ELECTRA, "
                            "DistilBERT, ALBERT or GPT-2 (--method multihead, the default), or LLaMA, Qwen2, Mistral, "
                            "GPT-NeoX, T5 and BLOOM (--method positional, the default): the attention sublayer of "
                            "layer --layer "
                            "(before residual and norm, last position) is the oracle, run locally in --dtype "
                            "(float64, float32 or bfloat16), offline")
    group.add_argument("--layer", type=int, metavar="L", help="--hf-dir: the attention layer to query")
    group.add_argument("--block", type=int, metavar="L",
                       help="--hf-dir: the whole block L (norms, attention, residuals, FFN) of a BERT, RoBERTa, "
                            "ELECTRA, LLaMA, Qwen2, Mistral or GPT-NeoX model: hidden states in, every position out "
                            "(docs/block.md)")
    group.add_argument("--row", type=int, metavar="R",
                       help="--hf-dir: answer only output R (one number per query); default the whole output row")


def oracle_from_args(args, kw: dict):
    """The oracle of ``extract --hf-dir`` (``kw``: the Oracle options extract collected)."""
    from attnprobe.oracles.hf_attention import DTYPES

    if args.target or args.oracle:
        raise ConfigError("give one oracle: --hf-dir DIR, --oracle MODULE:ATTR or --target FILE.npz", param="hf_dir")
    if getattr(args, "block", None) is not None:
        return block_oracle(args, kw)
    if args.layer is None:
        raise ConfigError("--hf-dir needs --layer L (the attention layer to query)", param="layer")
    from attnprobe.oracles.hf_folder import check_model_dir

    check_model_dir(args.hf_dir)
    from attnprobe.oracles.hf_families import layer_spec
    from attnprobe.targets.hf import hf_checkpoint

    spec = layer_spec(args.hf_dir)
    positional = args.method == "positional"
    if not positional:
        spec.refuse_positional()  # before anything else is read or asked
    hf_checkpoint(args.hf_dir)  # a config.json whose layer count the weights do not hold is refused before torch
    if not 0 <= args.layer < spec.layers:
        raise ConfigError(f"--layer must be in 0..{spec.layers - 1} for {args.hf_dir}; got {args.layer}", param="layer")
    if args.row is not None and not 0 <= args.row < spec.hidden:
        raise ConfigError(f"--row must be an output index in 0..{spec.hidden - 1}; got {args.row}", param="row")
    if args.dtype not in DTYPES:
        raise ConfigError(f"--hf-dir runs the module in {', '.join(DTYPES)}; got --dtype {args.dtype}", param="dtype")
    if args.outputs is not None:
        raise ConfigError("--hf-dir knows its number of outputs; drop --outputs", param="outputs")
    if positional and args.row is not None:
        raise ConfigError("--method positional reads the whole output row; drop --row", param="row")
    if args.row is None and args.method not in ("multihead", "positional"):
        raise ConfigError(f"--method {args.method} reads one number per query but the layer answers its whole "
                          "output row; give --row R (one output row) or use --method multihead", param="row")
    from attnprobe.oracles.hf_attention import oracle_from_hf

    kw = {k: v for k, v in kw.items() if k != "outputs"}
    # a bidirectional layer with position terms (T5) answers every row: its positive offsets are seen only there;
    # so does a causal RoPE layer run in bfloat16 or float16 (the every-row route reads more than two heads there)
    rows = positional and spec.positional and (not spec.causal or args.dtype in ("bfloat16", "float16")
                                               and spec.family.position == "rope")
    oracle = oracle_from_hf(args.hf_dir, args.layer, dtype=args.dtype, row=args.row, positional=positional,
                            every_position=rows, **kw)
    if args.d is not None and args.d != oracle.d:
        raise ConfigError(f"--d {args.d} contradicts --hf-dir {args.hf_dir}, whose layers have d = {oracle.d}; "
                          "drop --d", param="d")
    return oracle


def block_source(args):
    """``--hf-dir DIR --block L`` checked before torch: the folder, a family with whole blocks, L in range, the
    dtype; returns the folder's attention spec (its width, heads)."""
    from attnprobe.oracles.hf_attention import DTYPES
    from attnprobe.oracles.hf_block import block_spec
    from attnprobe.oracles.hf_folder import check_model_dir

    for flag in ("layer", "row"):
        if getattr(args, flag, None) is not None:
            raise ConfigError(f"--block L queries a whole block (every output, every position); drop --{flag}",
                              param=flag)
    check_model_dir(args.hf_dir)
    spec, _, _ = block_spec(args.hf_dir)
    if not 0 <= args.block < spec.layers:
        raise ConfigError(f"--block must be in 0..{spec.layers - 1} for {args.hf_dir}; got {args.block}",
                          param="block")
    if args.dtype not in DTYPES:
        raise ConfigError(f"--hf-dir runs the block in {', '.join(DTYPES)}; got --dtype {args.dtype}", param="dtype")
    return spec


def block_defaults(args, learner) -> None:
    """``--hf-dir DIR --block L``: the folder and L checked before the learner's options; a learner that takes the
    number of heads and was not given ``--heads`` gets the folder's (its config.json names it), and for a
    post-norm (BERT) folder the FFN's width (``--hidden``), which the post-norm route's neurons stage needs."""
    from attnprobe.oracles.hf_block import post_norm_width

    heads = block_source(args).heads
    width = post_norm_width(args.hf_dir)
    _fill_options(args, learner, heads=heads, **({"hidden": width} if width else {}))


def block_layout(args) -> str | None:
    """The layout (``pre``, ``post``, ``parallel``) of ``--hf-dir DIR --block L``'s block, as its family declares
    it; None for any other target (an estimate's setting then has no layout)."""
    if getattr(args, "hf_dir", None) is None or getattr(args, "block", None) is None:
        return None
    from attnprobe.oracles.hf_block import block_spec

    return block_spec(args.hf_dir)[2]


def estimate_defaults(args, learner) -> None:
    """``extract --estimate --hf-dir DIR --layer L``: a learner that takes the number of heads (or of key/value
    groups) and was not given it gets the folder's, as the run reads them from the folder's oracle."""
    if args.layer is None:
        return
    from attnprobe.oracles.hf_families import layer_spec
    from attnprobe.oracles.hf_folder import check_model_dir

    check_model_dir(args.hf_dir)
    spec = layer_spec(args.hf_dir)
    _fill_options(args, learner, heads=spec.heads, kv_heads=spec.kv_heads)


def _fill_options(args, learner, **folder) -> None:
    """Each option of ``folder`` (name → the folder's value) that ``learner`` takes and ``args`` leaves unset."""
    names = {o.name for o in learner.options}
    for name, value in folder.items():
        if name in names and getattr(args, name, None) is None:
            setattr(args, name, value)


def block_oracle(args, kw: dict):
    """The oracle of ``extract --hf-dir DIR --block L``: every position of the whole block."""
    d = block_source(args).hidden
    if getattr(args, "outputs", None) is not None:
        raise ConfigError("--hf-dir knows its number of outputs; drop --outputs", param="outputs")
    if args.d is not None and args.d != d:
        raise ConfigError(f"--d {args.d} contradicts --hf-dir {args.hf_dir}, whose blocks have d = {d}; drop --d",
                          param="d")
    from attnprobe.oracles.hf_block import oracle_from_hf_block

    kw = {k: v for k, v in kw.items() if k != "outputs"}
    return oracle_from_hf_block(args.hf_dir, args.block, dtype=args.dtype, **kw)


def default_method(hf_dir) -> str:
    """``extract --hf-dir`` without ``--method``: ``positional`` for a family whose logits depend on position,
    else ``multihead`` (the whole output row)."""
    from attnprobe.oracles.hf_families import layer_spec

    return "positional" if layer_spec(hf_dir).positional else "multihead"


def refuse_stray(args) -> None:
    """``--layer``/``--row``/``--block`` without ``--hf-dir`` would be ignored: refuse them."""
    if getattr(args, "hf_dir", None) is None:
        for flag in ("layer", "row", "block"):
            if getattr(args, flag, None) is not None:
                raise ConfigError(f"--{flag} goes with --hf-dir DIR", param=flag)


def identity(args) -> str:
    """The oracle's source as the query log records it."""
    from attnprobe.oracles.querylog import file_identity

    where = (f"block={args.block}" if getattr(args, "block", None) is not None
             else f"layer={args.layer} row={args.row}")
    return f"hf {file_identity(str(args.hf_dir) + '/model.safetensors')} {where} dtype={args.dtype}"


def audit_source(hf_dir) -> tuple[str, int]:
    """``audit --hf-dir DIR``: the folder (any family of the table; a positional one is refused) and its heads per
    layer (read from ``config.json``)."""
    from attnprobe.targets.hf import hf_checkpoint

    ckpt = hf_checkpoint(hf_dir)
    ckpt.spec.refuse_positional()
    return ckpt.folder, ckpt.heads_per_layer


def write_target(args) -> int:
    """``target hf-attention``: layer ``--layer`` of ``--model-dir`` as a ``multi_head`` model file, the whole
    output row (vector layout) or one output ``--row``."""
    from attnprobe.models import save_model
    from attnprobe.targets.hf import hf_checkpoint, hf_layer_arrays, hf_layer_row, save_layer_arrays

    if args.model_dir is None:
        raise ConfigError("target hf-attention needs --model-dir DIR (a Hugging Face model folder)", param="model_dir")
    ckpt = hf_checkpoint(args.model_dir)
    ckpt.spec.refuse_positional()
    if not 0 <= args.layer < ckpt.layers:
        raise ConfigError(f"--layer must be in 0..{ckpt.layers - 1} for {args.model_dir}; got {args.layer}",
                          param="layer")
    if args.row is not None:
        path = save_model(hf_layer_row(args.model_dir, args.layer, args.row), args.out)
        what = f"output row {args.row}"
    else:
        arrays = hf_layer_arrays(args.model_dir, args.layer)
        path = save_layer_arrays(arrays, args.out)
        what = f"the whole output row (K = {arrays['c'].shape[0]})"
    print(f"wrote multi_head (d = {ckpt.hidden}, H = {ckpt.heads_per_layer}) layer {args.layer}, {what}, to {path}")
    return 0
