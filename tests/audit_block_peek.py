"""``peek``: a stand-in block learner for the fast audit tests (tests/test_audit_blocks.py), registered when this
module is imported (so a process-pool or Ray worker that imports it, as the audit's tasks do, has it too): it reads
the block of the oracle's own layer module (what the block learner recovers, without its minute a block), asks a
few paid queries, and is checked like the block learner's result. Import it only inside a test (its fixture
unregisters ``peek`` at the end): imported at collection, ``peek`` would be registered for every other test."""

from __future__ import annotations

from attnprobe.learners.core import registry
from attnprobe.learners.core.skeleton import Run
from attnprobe.learners.multihead.options import HEADS
from attnprobe.models.block import fold_norm_weights


def off(block, error: float):
    """``block`` with its attention's output map ``error`` off (relative)."""
    arrays = dict(block.arrays())
    arrays["attn_Wo"] = arrays["attn_Wo"] * (1 + error)
    return type(block).from_arrays(arrays)


#: the ``peek`` learner's weight error: 0 reads the block exactly; the mutation test sets it
PEEK = {"error": 0.0}


def peek(oracle, *, seed, progress, heads=None):
    """A stand-in block learner for the fast tests: the block of the oracle's own layer module in the learner's
    canonical form (norm weights folded), ``PEEK['error']`` relative error put on W_O, checked like the block
    learner's result (every position of every length 1 … 64)."""
    from attnprobe.learners.block.learner import CHECK_LENGTHS, CHECK_PER_LENGTH, every_position_check
    from attnprobe.oracles.hf_block import block_model
    from attnprobe.oracles.wrappers import declared_attribute

    r = Run(oracle, "peek", seed=seed, check_lengths=CHECK_LENGTHS, check_per_length=CHECK_PER_LENGTH)
    with r.phase("look"):
        oracle.answer_rows(r.rng.standard_normal((3, 4, oracle.d)))  # a few paid queries, as a learner asks
    model = off(fold_norm_weights(block_model(declared_attribute(oracle.fn, "module"))), PEEK["error"])
    return r.finish(model, unknowns=model.attention.Wo.size, details={"eps": model.eps},
                    check_fn=every_position_check)


def register() -> None:
    """(Re-)register ``peek`` (a test unregisters it when it ends)."""
    registry.register("peek", peek, recovers="block", options=[HEADS],
                      capabilities=registry.Capabilities(vector_answers=True, fine_answers=True))


register()
