"""What a block task (``audit --tasks blocks``) adds to an audit task: the recovered block measured against the true
one as a function (a block's weights are fixed by its answers only up to gauges: docs/block.md, "What the answers
can fix"), and the task's query log, from which a block killed mid-way takes back the answers it paid for."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnprobe.oracles import Oracle


#: fresh sequences per length 1 … 64 on which a recovered block is measured against the true one
TRUTH_PER_LENGTH = 2


def block_errors(truth, model, seed: int) -> tuple[dict[str, float], dict]:
    """A recovered block against the true one, as the block learner's check measures it against the oracle
    (:func:`~attnprobe.learners.block.learner.every_position_check`: per length 1 … 64 the largest error at any
    position over the largest entry of the block's own part ``y − x``, the worst length's), on fresh sequences of
    its own: ``{"function": error}`` and the length where it is worst."""
    from attnprobe.learners.block.learner import CHECK_LENGTHS, every_position_check

    oracle = Oracle(truth.every_position, truth.d, outputs=truth.d, precision="float64", name="the true block")
    chk = every_position_check(oracle, model, np.random.default_rng([seed, 1]), CHECK_LENGTHS, TRUTH_PER_LENGTH)
    return {"function": chk.error}, {"worst_length": chk.extra["worst_length"]}


def query_log(task, chain) -> tuple[object | None, str | None]:
    """The task's query log (None without ``task.log``) and, when it cannot be written where the task runs (a Ray
    node without that folder, a full disk), None and why: the task then runs without one and its record says so. A
    log of another oracle is refused (a :class:`ConfigError`: the task fails naming it)."""
    if task.log is None:
        return None, None
    from attnprobe.oracles.querylog import QueryLog, file_identity, identity_of

    spec = task.head
    identity = identity_of(f"hf {file_identity(Path(spec.source) / 'model.safetensors')}", block=spec.layer,
                           dtype="float64")
    try:
        Path(task.log).parent.mkdir(parents=True, exist_ok=True)
        return QueryLog(task.log, identity=identity, defences=chain.spec), None
    except OSError as exc:
        return None, f"no query log: cannot write {task.log} here ({exc.strerror or exc})"
