"""Precision read from the answers (``precision="auto"``): verdicts on known formats, and MiniLM heads answered in
float32 with nothing declared (exact and lowrank pass their own check, lowrank finds rank 32, --rank 32 works)."""

import numpy as np
import pytest

from attnprobe.learners import extract_exact
from attnprobe.learners.head.lowrank import extract_lowrank, lowrank_dof
from attnprobe.models.attention import AttentionHead
from attnprobe.oracles import Oracle
from attnprobe.oracles.precision_detect import PROBE_QUERIES, PrecisionDetector, significant_bits
from attnprobe.oracles.wrappers import Membership, Precision, Rounded
from attnprobe.targets.random_heads import random_head
from conftest import rel


@pytest.mark.parametrize("fmt, bits", [("float64", 53), ("float32", 24), ("float16", 11), ("bfloat16", 8)])
def test_binary_formats_are_recognised(fmt, bits):
    head = random_head(6, seed=3)
    fn = head if fmt == "float64" else Precision(head, fmt, inputs=False)
    o = Oracle(fn, 6, precision="auto")
    o(np.random.default_rng(0).standard_normal((16, 3, 6)))
    assert o.precision == fmt and o.detector.max_bits == bits
    assert o.eps == {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}[fmt]


def test_decimal_rounding_is_read_as_significant_digits():
    head = random_head(6, seed=3)
    o = Oracle(Rounded(head, digits=5), 6, precision="auto")
    o(np.random.default_rng(0).standard_normal((16, 3, 6)))
    assert o.detector.precision == "5 digits" and o.eps == pytest.approx(1e-4)
    assert o.precision == "float64"  # the binary format that bounds the range of the answers


def test_short_fractions_and_integers_prove_nothing():
    d = PrecisionDetector()
    d.observe(np.array([0.5, 0.25, 1.75, 3.0, 0.0, 1.0]))
    assert not d.decided and d.precision == "float64"
    assert list(significant_bits(np.array([0.5, 0.75, 1 / 3]))) == [1, 2, 53]
    o = Oracle(Membership(random_head(4, seed=1)), 4, precision="auto")
    o(np.random.default_rng(0).standard_normal((32, 2, 4)))
    assert o.precision == "float64" and o.eps == 2.0**-52  # 0/1 answers: no coarse precision is assumed


def test_precision_needed_before_any_answer_costs_a_few_probes():
    o = Oracle(Precision(random_head(5, seed=2), "float32"), 5, precision="auto")
    assert o.eps == 2.0**-23 and o.queries == PROBE_QUERIES
    assert o.eps == 2.0**-23 and o.queries == PROBE_QUERIES  # asked once


def test_a_declared_precision_wins():
    o = Oracle(Precision(random_head(5, seed=2), "float32"), 5, precision="float64")
    o(np.random.default_rng(0).standard_normal((16, 2, 5)))
    assert o.precision == "float64" and o.detector is None
    o = Oracle(random_head(5, seed=2), 5, precision="float16")
    assert o.precision == "float16" and o.eps == 2.0**-10 and o.detector is None
    # a cast in the oracle's own answer chain is known, so it wins over "auto" (nothing to read)
    from attnprobe.oracles.chain import AnswerChain

    o = Oracle(random_head(5, seed=2), 5, precision="auto", chain=AnswerChain(cast="bfloat16"))
    assert o.precision == "bfloat16" and o.eps == 2.0**-7 and o.detector is None and o.queries == 0


@pytest.fixture(scope="module")
def minilm_float32():
    minilm = pytest.importorskip("attnprobe.targets.minilm")
    try:
        head = minilm.minilm_head(3, 7, 0)
    except Exception as exc:  # the weights package is an optional extra
        pytest.skip(f"MiniLM weights unavailable: {exc}")
    return head, head.with_dtype("float32")


def test_minilm_float32_lowrank_detects_rank_32_undeclared(minilm_float32):
    truth, f32 = minilm_float32
    oracle = Oracle(f32, 384, precision="auto")
    res = extract_lowrank(oracle, seed=0)
    assert oracle.precision == "float32" and oracle.detector.decided
    # not a knife edge: σ_32/σ_1 = 0.36 for this head's W (rank 32 = d_head), six orders above float32 rounding
    assert res.details["detected_rank"] == 32
    assert res.check.passed
    assert res.queries <= 0.2 * AttentionHead.unknowns(384)
    assert rel(res.model.W, truth.W) <= 1e-3


@pytest.mark.slow
def test_minilm_float32_lowrank_with_rank_32_given_undeclared(minilm_float32):
    truth, f32 = minilm_float32
    oracle = Oracle(f32, 384, precision="auto")
    given = extract_lowrank(oracle, rank=32, seed=0)
    assert oracle.precision == "float32"
    assert given.check.passed and given.details["detected_rank"] == 32
    assert lowrank_dof(384, 32) < given.queries <= 0.2 * AttentionHead.unknowns(384)
    assert rel(given.model.W, truth.W) <= 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("layer, head", [(3, 7), (0, 1)])  # (0, 1): re-measured probes must not spoil W
def test_minilm_float32_exact_passes_its_check_undeclared(minilm_float32, layer, head):
    truth = minilm_float32[0] if (layer, head) == (3, 7) else pytest.importorskip(
        "attnprobe.targets.minilm").minilm_head(layer, head, 0)
    f32 = truth.with_dtype("float32")
    oracle = Oracle(f32, 384, precision="auto")
    res = extract_exact(oracle, seed=0)
    assert oracle.precision == "float32"
    assert res.check.passed and rel(res.model.W, truth.W) <= 1e-4
