"""``attnprobe audit``: extract every head of a model under each defence and report what an attacker gets."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from attnprobe.errors import AttnprobeError, ConfigError


def parse_range(text: str, count: int, what: str) -> list[int]:
    """``all`` | ``A-B`` | ``A`` | ``A,B,C-D`` -> sorted indices in ``0..count-1``."""
    if text == "all":
        return list(range(count))
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError as exc:
            raise ConfigError(f"--{what} must look like all, 3, 0-5 or 0,2,4; got {text!r}", param=what) from exc
        if a > b:
            raise ConfigError(f"--{what} {text!r}: the range {part.strip()} runs backwards; write {b}-{a}", param=what)
        if not (0 <= a <= b < count):
            raise ConfigError(f"--{what} {text!r} is outside 0..{count - 1} (the model has {count} {what})", param=what)
        out.update(range(a, b + 1))
    return sorted(out)


def chosen_defenses(args):
    """``--defense LIST`` or the shared defence flags (one chain), not both; default: no defence."""
    from attnprobe.audit import parse_defenses
    from attnprobe.cli import answer_chain

    if answer_chain.has_flags(args):
        if args.defense is not None:
            raise ConfigError("give the defences either as --defense LIST or as flags (--cast, --round, ...), "
                              "not both", param="defense")
        return [answer_chain.flags_chain(args)]
    return parse_defenses("none" if args.defense is None else args.defense)


def build_tasks(args):
    from attnprobe.audit import HeadSpec

    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1; got {args.workers}", param="workers")
    if args.budget is not None and args.budget < 1:
        raise ConfigError(f"--budget must be a positive number of queries per head; got {args.budget}", param="budget")
    kind = task_kind(args)
    if kind.name == "blocks":
        return block_tasks(args, kind)
    if args.hf_dir is not None:
        if args.model or args.safetensors or args.heads_per_layer is not None:
            raise ConfigError("--hf-dir reads the checkpoint and its heads per layer from the folder; drop "
                              "--model/--safetensors/--heads-per-layer", param="model")
        from attnprobe.cli.hf import audit_source

        _refuse_positional_folder(args.hf_dir, kind)
        args.safetensors, args.heads_per_layer = audit_source(args.hf_dir)
    if bool(args.model) == bool(args.safetensors):
        raise ConfigError("say what to audit: --model minilm, --hf-dir DIR or --safetensors FILE --heads-per-layer H",
                          param="model")
    if args.model and args.model != "minilm":
        raise ConfigError(f"--model knows only minilm (all-MiniLM-L6-v2); got {args.model!r}; "
                          "for other BERT-family models use --safetensors FILE --heads-per-layer H", param="model")
    if args.safetensors and args.heads_per_layer is None:
        raise ConfigError("--safetensors needs --heads-per-layer H (the model's attention heads per layer)",
                          param="heads_per_layer")
    if args.heads_per_layer is not None and args.heads_per_layer < 1:
        raise ConfigError(f"--heads-per-layer must be at least 1; got {args.heads_per_layer}", param="heads_per_layer")
    source = "minilm" if args.model else args.safetensors
    probe = HeadSpec(source, 0, 0, 0, args.heads_per_layer)
    ckpt = probe.checkpoint()
    row = 0 if args.row is None else args.row
    if not (0 <= row < ckpt.hidden):
        raise ConfigError(f"--row must be in 0..{ckpt.hidden - 1}; got {row}", param="row")
    layers = parse_range(args.layers, ckpt.layers, "layers")
    heads = parse_range(args.heads, ckpt.heads_per_layer, "heads")
    if kind.whole_layer and args.heads != "all":
        raise ConfigError(f"--tasks {kind.name} audits whole layers; drop --heads", param="heads")
    if kind.vector and args.rank is not None:
        raise ConfigError(f"--tasks {kind.name} reads whole output rows, where the multi-head learner needs no head "
                          "dimension; drop --rank (or give --tasks layer-rows)", param="rank")
    if kind.vector and args.row is not None:
        raise ConfigError(f"--tasks {kind.name} reads the whole output row of each layer; drop --row (or give "
                          "--tasks layer-rows for one output row)", param="row")
    specs = [HeadSpec(source, layer, head, None if kind.vector else row, args.heads_per_layer,
                      every_position=kind.name == "layers-every")
             for layer in layers for head in ([None] if kind.whole_layer else heads)]
    return _tasks_per_defense(args, kind, specs, _chosen_learners(args.method, kind, args.rank))


def _refuse_positional_folder(hf_dir, kind) -> None:
    """A folder whose attention depends on position (RoPE: LLaMA, Qwen2, Mistral, GPT-NeoX) and whose whole blocks
    attnprobe reads, asked for head or layer tasks: refused in one line naming ``--tasks blocks``."""
    from attnprobe.oracles.hf_block import BLOCK_FAMILIES
    from attnprobe.oracles.hf_families import layer_spec
    from attnprobe.oracles.hf_folder import check_model_dir

    check_model_dir(hf_dir)
    spec = layer_spec(hf_dir)
    if spec.positional and spec.name in BLOCK_FAMILIES:
        raise ConfigError(f"{spec.folder} is a {spec.name} model, whose attention logits depend on the key's position: "
                          f"--tasks {kind.name} does not read it; --tasks blocks audits its whole blocks (the block "
                          "learner)", param="tasks")


def _tasks_per_defense(args, kind, specs, chosen: list[str]):
    """One task per (defence, spec, learner): of the ``chosen`` learners, those that fit the defence's answers (all
    that fit when none of them does); a defence that no learner of the kind can read is refused."""
    from attnprobe.audit import Task, fitting_learners

    tasks = []
    for d in chosen_defenses(args):
        fits = fitting_learners(d, kind.whole_layer, kind.vector, recovers=kind.learner_kind)
        names = [n for n in chosen if n in fits] or fits
        if not names:
            raise ConfigError(f"no {kind.learners} can read the answers the defence {d.name!r} leaves; "
                              f"drop {d.name} from --defense", param="defense")
        tasks += [Task(spec, name, d, args.seed, args.budget, args.rank) for spec in specs for name in names]
    return tasks


def block_tasks(args, kind):
    """``--tasks blocks``: one task per block ``--layers`` of the folder ``--hf-dir`` (a family whose whole blocks
    attnprobe reads), everything checked before any task runs."""
    from attnprobe.audit import HeadSpec

    if args.hf_dir is None:
        given = "--model minilm" if args.model else "--safetensors" if args.safetensors else None
        raise ConfigError("--tasks blocks reads whole blocks (norms, attention, residuals, FFN) of a Hugging Face "
                          "folder: give --hf-dir DIR (LLaMA, Qwen2, Mistral, GPT-NeoX; a BERT-family folder's "
                          "post-norm blocks are reported as refused)"
                          + (f"; {given} holds attention weights alone" if given else ""), param="tasks")
    for flag, given in (("model", args.model), ("safetensors", args.safetensors),
                        ("heads-per-layer", args.heads_per_layer), ("row", args.row), ("rank", args.rank)):
        if given is not None:
            raise ConfigError(f"--tasks blocks reads each whole block of --hf-dir at every position; drop --{flag}",
                              param=flag.replace("-", "_"))
    if args.heads != "all":
        raise ConfigError("--tasks blocks audits whole blocks; drop --heads", param="heads")
    from attnprobe.oracles.hf_block import block_spec
    from attnprobe.oracles.hf_folder import check_model_dir

    check_model_dir(args.hf_dir)
    spec, _, _ = block_spec(args.hf_dir)  # a family without whole blocks is refused in one line
    layers = parse_range(args.layers, spec.layers, "layers")
    specs = [HeadSpec(str(spec.folder), layer, None, None, spec.heads, block=True) for layer in layers]
    return _tasks_per_defense(args, kind, specs, _chosen_learners(args.method, kind, None, heads=spec.heads))


def task_kind(args):
    """``--tasks`` (``--multihead`` is ``--tasks layer-rows``)."""
    from attnprobe.audit import TASK_KINDS

    if args.multihead:
        if args.tasks not in (None, "layer-rows"):
            raise ConfigError(f"--multihead is --tasks layer-rows; drop one of --multihead and --tasks {args.tasks}",
                              param="multihead")
        return TASK_KINDS["layer-rows"]
    return TASK_KINDS[args.tasks or next(iter(TASK_KINDS))]


def _chosen_learners(method: str, kind, rank: int | None, heads: int | None = None) -> list[str]:
    """``--method``: ``auto`` (every registered learner of the task kind that can run with ``rank`` (and ``heads``,
    known for blocks); each defence keeps those that fit it) or a comma-separated list of learner names."""
    from attnprobe.audit import audit_learners
    from attnprobe.learners.core import registry

    known = audit_learners(kind.whole_layer, kind.vector, recovers=kind.learner_kind)
    given = {"rank": rank, "heads": heads}
    if method == "auto":  # every learner that can run with the options given
        return [n for n in known if registry.learner(n).ready(given)]
    names = [m.strip() for m in method.split(",") if m.strip()]
    unknown = [m for m in names if m not in known]
    if unknown or not names:
        raise ConfigError(f"--method {method!r}: the learners of {kind.extracts} are auto or a comma-separated list of "
                          f"{', '.join(known)}", param="method")
    for entry in map(registry.learner, names):
        if not entry.ready(given):
            hint = "give --rank (the head dimension)" if "rank" in entry.needs_one_of else "an audit gives only --rank"
            raise ConfigError(f"--method {entry.name} runs only with one of {', '.join(entry.needs_one_of)} given; "
                              f"{hint}", param="method")
    return list(dict.fromkeys(names))


@contextlib.contextmanager
def claimed_folder(out: Path):
    """Hold ``out`` for one audit: a second audit writing into the same folder at the same time is refused
    (an advisory lock on ``out/.audit.lock``). The folders it creates are removed again if the audit is refused or
    stopped before it wrote anything. Nothing else in the folder is removed (an earlier audit's head files and the
    user's own files stay: :func:`attnprobe.audit.run_audit`)."""
    import fcntl

    from attnprobe.cli.common import writable_folder

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a folder; give a folder for results.json, report.html "
                          "and heads/", param="out")
    writable_folder(out, "--out")
    # the folders this audit creates (out, missing parents, heads/): removed again if the audit is refused
    made = [p for p in (out / "heads", out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = open(out / ".audit.lock", "a+")
    except OSError as exc:
        _remove_empty(made)
        raise ConfigError(f"--out: cannot use the folder {out} ({exc.strerror or exc}); choose another",
                          param="out") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        pid = lock.read().strip() or "?"
        lock.close()
        raise ConfigError(f"another audit (process {pid}) is writing into {out}; wait for it to finish or give "
                          "another --out folder", param="out") from None
    refused = True
    try:
        try:
            lock.truncate(0)
            lock.write(str(os.getpid()))
            lock.flush()
        except OSError as exc:
            raise ConfigError(f"--out: cannot write in {out} ({exc.strerror or exc}); free some space or choose "
                              "another folder", param="out") from None
        yield
        refused = False
    finally:
        with contextlib.suppress(OSError):
            (out / ".audit.lock").unlink()
        with contextlib.suppress(OSError):  # a pid that could not be written is not flushed again
            lock.close()
        if refused:  # refused or stopped before it wrote anything: no empty folder is left behind
            _remove_empty(made)


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders of ``folders`` that are empty, innermost first."""
    for p in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            p.rmdir()


def _refuse_values(args) -> None:
    """Values every task would fail on are refused before any task runs."""
    if args.rank is not None and args.rank < 1:
        raise ConfigError(f"--rank must be at least 1 (the head dimension); got {args.rank}", param="rank")
    if args.seed < 0:
        raise ConfigError(f"--seed must be an integer >= 0; got {args.seed}", param="seed")
    from attnprobe.learners.core.check import DEFAULT_LENGTHS, check_queries

    floor = check_queries(DEFAULT_LENGTHS, 8)
    if args.budget is not None and 0 < args.budget < floor:
        raise ConfigError(f"--budget {args.budget} is below the {floor} queries of the functional check alone, so "
                          f"no extraction could finish; give at least {floor} (a budget that merely falls short is "
                          "reported as a finding)", param="budget")


#: a failed task's error that is a finding, not a failure of the audit: the attacker's budget fell short, or the
#: learner refused the answers in one line naming why (coarser than it reads; a post-norm block)
REFUSALS = ("BudgetExceededError", "UnidentifiableError")


def run(args) -> int:
    from attnprobe.audit import run_audit

    _refuse_values(args)
    if not str(args.out).strip():
        raise ConfigError("--out names the folder for results.json, report.html and heads/; got ''", param="out")
    from attnprobe.cli.common import inside

    if args.hf_dir is not None and inside(Path(args.out), Path(args.hf_dir)):
        raise ConfigError(f"--out {args.out} is inside the input folder {args.hf_dir}, whose files it could "
                          "overwrite; write the audit outside it", param="out")
    tasks = build_tasks(args)
    engine = "ray" if args.ray is not None else "processes"
    if args.ray:  # a dead address is refused before the --out folder is touched
        from attnprobe.audit.engines import reachable

        reachable(args.ray)
    kind = tasks[0].head.kind.name if tasks else None
    info = {"model": args.model or args.safetensors or args.hf_dir, "method": args.method, "task_kind": kind,
            "seed": args.seed, "row": tasks[0].head.row if tasks else None, "rank": args.rank, "budget": args.budget}
    with claimed_folder(Path(args.out)):
        res = run_audit(tasks, args.out, engine=engine, workers=args.workers, address=args.ray or None,
                        progress=not args.quiet, info=info, resume=not args.fresh)
    failed = sum(1 for r in res.records if r["error"])
    # block tasks keep a query log until they finish (a block killed mid-way resumes from it); others keep none
    logged = "each block's logged until it finished" if kind == "blocks" else "not logged"
    spent = sum(r["queries"] + r.get("check_queries", 0) for r in res.records)
    if res.info.get("resumed"):
        print(f"audit: resumed {res.info['resumed']} finished tasks from {args.out}/finished.jsonl (not run again; "
              "--fresh redoes them)")
    print(f"audit: {len(res.records)}/{len(tasks)} tasks finished ({failed} failed) on {engine} in "
          f"{res.seconds:.1f} s; {spent} queries spent ({logged}); wrote {args.out}/results.json, "
          f"{args.out}/report.html and {args.out}/heads/")
    if res.interrupted:
        how = "SIGTERM" if res.terminated else "SIGINT (Ctrl-C)"
        print(f"attnprobe: interrupted: audit stopped by {how}; the {len(res.records)} finished tasks are kept in "
              f"{args.out}/results.json", file=sys.stderr)
        return 143 if res.terminated else 130
    errors = [str(r["error"]) for r in res.records if r["error"]]
    refused = [e for e in errors if e.startswith(REFUSALS)]
    if refused:
        print(f"audit: {len(refused)} tasks ended without a model, each naming why (refused by the learner, or "
              f"over the budget; see {args.out}/report.html); the first: {refused[0].splitlines()[0]}")
    # findings: the attacker's budget fell short, or the learner refused the answers (a post-norm block, float16)
    findings = len(refused) == len(errors)
    if res.records and failed == len(res.records) and not findings:  # nothing recovered: the audit failed
        first = next(e for e in errors if not e.startswith(REFUSALS))
        raise AttnprobeError(f"every one of the {failed} tasks failed (see {args.out}/results.json); the first: "
                             f"{str(first).rstrip('.')}")
    return 0


def add_parser(sub) -> None:
    from attnprobe.audit import TASK_KINDS, audit_learners
    from attnprobe.audit.defenses import HELP
    from attnprobe.learners.core import registry
    from attnprobe.cli import answer_chain

    a = sub.add_parser("audit", help="extract every head of a model under each defence; write a report")
    src = a.add_argument_group("what to audit")
    src.add_argument("--model", help="a known model: minilm (all-MiniLM-L6-v2, installed weights)")
    src.add_argument("--safetensors", metavar="FILE", help="a BERT-family checkpoint (.safetensors)")
    src.add_argument("--heads-per-layer", type=int, metavar="H", help="attention heads per layer of --safetensors")
    src.add_argument("--hf-dir", metavar="DIR", help="a Hugging Face model folder (config.json, "
                                                     "model.safetensors) of BERT, RoBERTa, ELECTRA, DistilBERT, "
                                                     "ALBERT or GPT-2; with --tasks blocks, of LLaMA, Qwen2, "
                                                     "Mistral, GPT-NeoX (or BERT, RoBERTa, ELECTRA: refused per "
                                                     "block)")
    src.add_argument("--layers", default="all", help="layers (or blocks) to audit: all (default), 0-5, 3 or 0,2,4")
    src.add_argument("--heads", default="all", help="heads to audit in each layer: all (default), 0-3, ...")
    src.add_argument("--row", type=int, help="output row R of the layer that --tasks heads and layer-rows read "
                                             "(default 0)")
    src.add_argument("--tasks", choices=list(TASK_KINDS),
                     help="what one task extracts: " + "; ".join(f"{k.name}{' (default)' if i == 0 else ''}: {k.help}"
                                                                 for i, k in enumerate(TASK_KINDS.values())))
    src.add_argument("--multihead", action="store_true", help="the same as --tasks layer-rows")
    a.add_argument("--method", default="auto",
                   help="learners to attack with: auto (default: every registered learner whose capabilities fit "
                        "each defence; a defence is called strong only when all of them fail) or a comma-separated "
                        "list of " + ", ".join(audit_learners()) + " (" + ", ".join(audit_learners(True)) + " for "
                        "whole layers; a defence none of them fits gets those that do)")
    a.add_argument("--rank", type=int,
                   help="learners that take a rank bound (the head dimension): "
                   + ", ".join(registry.options()["rank"][1]))
    answer_chain.add_arguments(a, defense_help=f"{HELP}; or one defence as the flags below (default none)")
    a.add_argument("--budget", type=int,
                   help="queries an attacker may spend per task (a head, a whole layer or a block)")
    a.add_argument("--seed", type=int, default=0, help="seed of every task (probes and noise)")
    run_on = a.add_argument_group("where to run")
    run_on.add_argument("--workers", type=int, default=1, help="worker processes (or local Ray CPUs)")
    run_on.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="run on Ray: a private local cluster without ADDRESS, else the cluster at ADDRESS "
                             "(HOST:6379 of 'ray start --head', or ray://HOST:10001; attnprobe must be installed "
                             "on every node)")
    a.add_argument("--out", required=True, metavar="DIR", help="results.json, report.html and heads/*.npz")
    a.add_argument("--quiet", action="store_true", help="no progress bar")
    a.add_argument("--fresh", action="store_true", help="redo every task (default: a rerun into the same --out "
                                                        "resumes, skipping the tasks finished.jsonl lists)")
    a.set_defaults(func=run)
