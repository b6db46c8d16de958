"""The contract every registered learner keeps (in the spirit of scikit-learn's parametrize_with_checks): exact
query accounting, phases summing to the total, a budget that cannot cover the plan refused before the first
query, a correct result passing the check and a wrong model failing it, seeds reproducing bit for bit.

Every learner in :mod:`attnprobe.learners.core.registry` is covered: with its defaults on the standard oracle of what
it recovers and reads (:func:`standard_oracle`), plus the cases below for probe variants and options that need
a particular oracle. :func:`check_contract` runs every check on one learner (a newly registered one included)."""

import numpy as np
import pytest

from attnprobe.errors import BudgetExceededError, ConfigError
from attnprobe.learners.core import registry
from attnprobe.models import AttentionHead
from attnprobe.oracles import Oracle
from attnprobe.oracles.wrappers import AdversarialNoise, Membership
from attnprobe.targets import (random_head, random_multihead, random_relu_net, random_rope_attention,
                               random_transformer)
from attnprobe.targets.theorem_heads import margin, theorem_head

D = 6
THEOREM, THEOREM4 = theorem_head(D, 0), theorem_head(4, 0)


def standard_oracle(entry: registry.Learner, budget=None) -> Oracle:
    """The oracle a learner is checked on by default: a random instance of what it recovers, answering as its
    capabilities read (yes/no answers of a bias-free head; noisy answers for a noise-tolerant learner)."""
    if entry.recovers == "multi_head":
        return Oracle(random_multihead(D, 2, seed=3), D, budget=budget)
    if entry.recovers == "transformer":
        return Oracle(random_transformer(D, 2 * D, seed=3), D, budget=budget)
    if entry.recovers == "positional":  # RoPE heads need d_h above the learner's 11 offsets
        return Oracle(random_rope_attention(32, 2, 1, seed=3), 32, budget=budget)
    if entry.recovers == "relu_net":
        return Oracle(random_relu_net(D, 2 * D, seed=3), D, budget=budget)
    if not entry.capabilities.value_answers:
        return Oracle(Membership(random_head(D, seed=3, bias=False)), D, budget=budget)
    if entry.capabilities.noisy_answers:
        return Oracle(AdversarialNoise(random_head(D, seed=3), 1e-6), D, budget=budget)
    return Oracle(random_head(D, seed=3), D, budget=budget)


def block_oracle(budget=None):
    """A LLaMA-shaped pre-norm block (RMSNorm weights not 1), every position: RoPE heads need d_h above the
    positional learner's 11 offsets."""
    from attnprobe.targets.block import random_llama_block

    return Oracle(random_llama_block(32, 2, 1, 64, seed=3).every_position, 32, outputs=32, precision="float64",
                  budget=budget)


def lowrank_oracle(budget=None):
    return Oracle(random_head(D, rank=2, seed=3), D, budget=budget)


#: case -> (learner, oracle factory or None for the standard oracle, options): probe variants and options that
#: need a particular oracle; every registered learner also gets a case of its defaults on its standard oracle
SPECIAL = {
    "exact-basis": ("exact", None, {"probes": "basis"}),
    "lowrank": ("lowrank", lowrank_oracle, {"rank": 2}),
    "lowrank-detected": ("lowrank", lowrank_oracle, {}),
    "nuclear": ("nuclear", lowrank_oracle, {"rank": 2}),
    "robust": ("robust", None, {"queries": 2 * AttentionHead.unknowns(D)}),
    # App. B at d = 4 with 10⁶ sign samples (far below Thm B.1's k, but enough for the sign check to pass)
    "membership-paper": ("membership", lambda budget=None: Oracle(Membership(THEOREM4), 4, budget=budget),
                         {"probes": "paper", "w_bound": 2.0, "margin": margin(THEOREM4), "samples": 10**6}),
    "block": ("block", block_oracle, {"heads": 2, "hidden": 64}),
    "robust-paper": ("robust", lambda budget=None: Oracle(THEOREM, D, budget=budget),
                     {"probes": "paper", "w_bound": 2.0, "margin": margin(THEOREM), "tolerance": 0.0}),
}


def cases() -> dict:
    out = {e.name: (e.name, None, {}) for e in registry.learners()}
    out.update(SPECIAL)
    return out


CASES = cases()
#: learners whose runs take minutes (the whole-block learner: ~4 min per run at d = 32 on a busy 2-core machine)
SLOW = {"block"}


def params():
    return [pytest.param(c, marks=pytest.mark.slow) if CASES[c][0] in SLOW else c for c in CASES]


def _make(case, budget=None):
    name, factory, options = CASES[case] if isinstance(case, str) else case
    entry = registry.learner(name)
    oracle = factory(budget=budget) if factory else standard_oracle(entry, budget)
    return oracle, lambda o, seed=0: entry(o, seed=seed, **options)


def check_accounting(case) -> None:
    oracle, learn = _make(case)
    res = learn(oracle)
    assert sum(res.queries_by_phase.values()) == res.queries
    assert "check" not in res.queries_by_phase and "unphased" not in res.queries_by_phase
    assert oracle.queries == res.queries + res.check.queries
    assert oracle.queries_by_phase["check"] == res.check.queries
    assert res.check.passed and res.passed and res.check.error <= res.check.tolerance
    assert res.model.kind == registry.learner(CASES[case][0] if isinstance(case, str) else case[0]).kind


def check_budget(case) -> None:
    oracle, learn = _make(case, budget=5)
    with pytest.raises(BudgetExceededError):
        learn(oracle)
    assert oracle.queries == 0


def check_seeds(case) -> None:
    (o1, learn), (o2, _) = _make(case), _make(case)
    a, b = learn(o1, seed=11), learn(o2, seed=11)
    for key, arr in a.model.arrays().items():
        np.testing.assert_array_equal(arr, b.model.arrays()[key])
    assert a.queries_by_phase == b.queries_by_phase and a.check.error == b.check.error


def check_contract(case) -> None:
    """Every check of this module on one case (a name in :data:`CASES` or a ``(learner, factory, options)``)."""
    check_accounting(case)
    check_budget(case)
    check_seeds(case)


def test_every_registered_learner_has_a_case():
    assert {name for name, _, _ in CASES.values()} == {e.name for e in registry.learners()}
    assert {"exact", "lowrank", "nuclear", "robust", "membership", "transformer", "ffn", "multihead"} <= set(CASES)


@pytest.mark.parametrize("case", params())
def test_phases_sum_to_the_queries_and_the_check_is_counted_apart(case):
    check_accounting(case)


@pytest.mark.parametrize("case", CASES)  # refused before any run: quick for every learner
def test_a_budget_below_the_plan_is_refused_before_the_first_query(case):
    check_budget(case)


@pytest.mark.parametrize("method", ["auto", "vector"])
def test_the_answer_shape_probe_is_inside_the_multihead_plan(method):
    """The multi-head dispatch asks one query to tell scalar from vector answers: a budget one short of that query,
    the cheaper learner's values stage and the check is refused having asked nothing; one more and it asks."""
    from attnprobe.learners.core.check import check_queries
    from attnprobe.learners.multihead import extract_multihead
    from attnprobe.learners.multihead.vector import planned_values

    least = 1 + planned_values(D) + check_queries()
    oracle = Oracle(random_multihead(D, 2, seed=3), D, budget=least - 1)
    with pytest.raises(BudgetExceededError, match=f"at least {least} queries"):
        extract_multihead(oracle, method=method)
    assert oracle.queries == 0
    oracle = Oracle(random_multihead(D, 2, seed=3), D, budget=least)
    # past the probe the answers are scalars: the generic learner's larger plan is refused, or the vector method
    # says it needs K ≥ 2 outputs; either way the probe was the one query asked
    with pytest.raises(BudgetExceededError if method == "auto" else ConfigError):
        extract_multihead(oracle, method=method)
    assert oracle.queries == 1


@pytest.mark.parametrize("case", params())
def test_seeds_reproduce_bit_for_bit(case):
    check_seeds(case)


def test_a_wrong_model_fails_the_check_the_same_way():
    """A head whose answers come from another head: the check must say FAILED, never "passed"."""
    from attnprobe.learners.core.skeleton import Run

    truth, other = random_head(D, seed=3), random_head(D, seed=4)
    run = Run(Oracle(truth, D), "wrong", seed=0)
    res = run.finish(AttentionHead(other.W, other.v, other.u, other.c), unknowns=1)
    assert res.passed is False and res.check.error > res.check.tolerance
    assert any("FAILED" in n for n in res.notes)
