"""The contract every learner built on the skeleton keeps (in the spirit of scikit-learn's parametrize_with_checks):
exact query accounting, phases summing to the total, a budget that cannot cover the plan refused before the first
query, a wrong model failing the check, seeds reproducing bit for bit."""

import numpy as np
import pytest

from attnprobe.errors import BudgetExceededError
from attnprobe.learners import extract_exact
from attnprobe.learners.lowrank import extract_lowrank
from attnprobe.learners.membership import extract_membership, extract_membership_paper
from attnprobe.learners.nuclear import extract_nuclear
from attnprobe.learners.robust import extract_robust, extract_robust_paper
from attnprobe.learners.transformer import extract_transformer
from attnprobe.models import AttentionHead
from attnprobe.oracles import Oracle
from attnprobe.oracles.wrappers import AdversarialNoise, Membership
from attnprobe.targets import random_head, random_transformer
from attnprobe.targets.theorem_heads import margin, theorem_head

D = 6


def head_oracle(budget=None):
    return Oracle(random_head(D, seed=3), D, budget=budget)


def noisy_oracle(budget=None):
    return Oracle(AdversarialNoise(random_head(D, seed=3), 1e-6), D, budget=budget)


THEOREM, THEOREM4 = theorem_head(D, 0), theorem_head(4, 0)


def theorem_oracle(budget=None):
    return Oracle(THEOREM, D, budget=budget)


def membership_oracle(budget=None):
    return Oracle(Membership(random_head(D, seed=3, bias=False)), D, budget=budget)


def lowrank_oracle(budget=None):
    return Oracle(random_head(D, rank=2, seed=3), D, budget=budget)


#: learner name -> (oracle factory, learner call); learners join this table as they move onto the skeleton
LEARNERS = {
    "exact": (head_oracle, lambda o, seed=0: extract_exact(o, seed=seed)),
    "exact-basis": (head_oracle, lambda o, seed=0: extract_exact(o, probes="basis", seed=seed)),
    "lowrank": (lowrank_oracle, lambda o, seed=0: extract_lowrank(o, rank=2, seed=seed)),
    "lowrank-detected": (lowrank_oracle, lambda o, seed=0: extract_lowrank(o, seed=seed)),
    "nuclear": (lowrank_oracle, lambda o, seed=0: extract_nuclear(o, rank=2, seed=seed)),
    "robust": (noisy_oracle, lambda o, seed=0: extract_robust(o, queries=2 * AttentionHead.unknowns(D), seed=seed)),
    "membership": (membership_oracle, lambda o, seed=0: extract_membership(o, seed=seed)),
    # App. B at d = 4 with 10⁶ sign samples (far below Thm B.1's k, but enough for the sign check to pass)
    "membership-paper": (lambda budget=None: Oracle(Membership(THEOREM4), 4, budget=budget),
                         lambda o, seed=0: extract_membership_paper(o, w_bound=2.0, margin=margin(THEOREM4),
                                                                    samples=10**6, seed=seed)),
    "transformer": (lambda budget=None: Oracle(random_transformer(D, 2 * D, seed=3), D, budget=budget),
                    lambda o, seed=0: extract_transformer(o, seed=seed)),
    "robust-paper": (theorem_oracle, lambda o, seed=0: extract_robust_paper(o, w_bound=2.0, margin=margin(THEOREM),
                                                                            tolerance=0.0, seed=seed)),
}


@pytest.mark.parametrize("name", LEARNERS)
def test_phases_sum_to_the_queries_and_the_check_is_counted_apart(name):
    make, learn = LEARNERS[name]
    oracle = make()
    res = learn(oracle)
    assert sum(res.queries_by_phase.values()) == res.queries
    assert "check" not in res.queries_by_phase and "unphased" not in res.queries_by_phase
    assert oracle.queries == res.queries + res.check.queries
    assert oracle.queries_by_phase["check"] == res.check.queries
    assert res.check.passed and res.passed and res.check.error <= res.check.tolerance


@pytest.mark.parametrize("name", LEARNERS)
def test_a_budget_below_the_plan_is_refused_before_the_first_query(name):
    make, learn = LEARNERS[name]
    oracle = make(budget=5)
    with pytest.raises(BudgetExceededError):
        learn(oracle)
    assert oracle.queries == 0


@pytest.mark.parametrize("name", LEARNERS)
def test_seeds_reproduce_bit_for_bit(name):
    make, learn = LEARNERS[name]
    a, b = learn(make(), seed=11), learn(make(), seed=11)
    for key, arr in a.model.arrays().items():
        np.testing.assert_array_equal(arr, b.model.arrays()[key])
    assert a.queries_by_phase == b.queries_by_phase and a.check.error == b.check.error


def test_a_wrong_model_fails_the_check_the_same_way():
    """A head whose answers come from another head: the check must say FAILED, never "passed"."""
    from attnprobe.learners.skeleton import Run

    truth, other = random_head(D, seed=3), random_head(D, seed=4)
    run = Run(Oracle(truth, D), "wrong", seed=0)
    res = run.finish(AttentionHead(other.W, other.v, other.u, other.c), unknowns=1)
    assert res.passed is False and res.check.error > res.check.tolerance
    assert any("FAILED" in n for n in res.notes)
