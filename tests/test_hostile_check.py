"""A result that says "passed" must be right: the functional check's tolerance comes from the answers' rounding
and declared noise (never more than CHECK_CAP of f − c), so a wrong model fails at every precision."""

from __future__ import annotations

import numpy as np
import pytest

from attnprobe import Oracle
from attnprobe.errors import UnidentifiableError
from attnprobe.learners import extract_exact
from attnprobe.learners.core.check import CHECK_CAP, functional_check
from attnprobe.models import AttentionHead
from attnprobe.models.attention import attention_weights
from attnprobe.models.precision import resolve_dtype
from attnprobe.targets import random_head

PRECISIONS = ("float64", "float32", "float16", "bfloat16")


def first_row_query(head: AttentionHead, precision: str):
    """A head that attends with the FIRST row as the query token, in ``precision``: not of the paper's form."""
    dt = resolve_dtype(precision)

    def answer(X):
        Xr = np.asarray(X, dtype=np.float64)[:, ::-1, :].astype(dt)
        a = attention_weights(Xr, head.W.astype(dt), head.u.astype(dt))
        return ((a * (Xr @ head.v.astype(dt))).sum(-1) + dt.type(head.c)).astype(np.float64)

    return answer


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_wrong_model_fails_at_every_precision(precision):
    truth = random_head(6, seed=0)
    res = extract_exact(Oracle(first_row_query(truth, precision), 6, precision=precision), seed=0)
    assert not res.check.passed and res.check.error > res.check.tolerance
    assert res.check.tolerance <= CHECK_CAP


#: (worst, median) relative W error of the exact learner over heads 0-4 at d = 6 (measured here, the same under the
#: Sandybridge kernel: float16 ≤ 0.022, bfloat16 ≤ 0.106 with median 0.027): the check's cap (10 % of f − c) is
#: all that holds a model at float16 and bfloat16, so the parameters themselves need a bound of their own
W_BOUNDS = {"float64": (1e-9, 1e-10), "float32": (1e-4, 1e-5), "float16": (0.06, 0.03), "bfloat16": (0.15, 0.05)}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_correct_model_passes_at_every_precision(precision):
    errors = []
    for seed in range(5):
        truth = random_head(6, seed=seed, dtype=precision)
        res = extract_exact(Oracle(truth, 6, precision=precision), seed=0)
        assert res.check.passed, (seed, res.check.error, res.check.tolerance)
        errors.append(np.linalg.norm(res.model.W - truth.W) / np.linalg.norm(truth.W))
    worst, median = W_BOUNDS[precision]
    assert max(errors) <= worst and np.median(errors) <= median, errors


def test_a_model_off_by_a_percent_fails_on_float32_answers():
    """float32 answers round at 6e-8: a head whose every answer is ~1 % off is no rounding effect, whatever the
    check's cap (a tolerance of 1e4 roundings is 1.2e-3 here)."""
    truth = random_head(6, seed=0, dtype="float32")
    oracle = Oracle(truth, 6, precision="float32")
    off = AttentionHead(1.02 * truth.W, 1.01 * truth.v, truth.u, truth.c)
    chk = functional_check(oracle, off, np.random.default_rng(0))
    assert 3e-3 < chk.error < CHECK_CAP and not chk.passed and chk.tolerance < 3e-3
    assert functional_check(oracle, truth, np.random.default_rng(0)).passed


def test_a_huge_bias_does_not_hide_a_zero_W():
    """c = 1e12: relative to ‖f‖ a model with W = 0 was within 1e-12; on f − c it is 100 % wrong."""
    h = random_head(6, seed=2)
    truth = AttentionHead(h.W, h.v, h.u, 1e12)
    oracle = Oracle(truth, 6)
    wrong = AttentionHead(np.zeros((6, 6)), h.v, np.zeros(6), 1e12)
    chk = functional_check(oracle, wrong, np.random.default_rng(0))
    assert not chk.passed and chk.error > 0.1 and chk.extra["measured_on"] == "f - c"
    assert chk.verdict == "failed"
    # float64 answers of size 1e12 resolve f − c only to ~1e-4: not even the truth can be certified to 1e-6
    right = functional_check(oracle, truth, np.random.default_rng(0))
    assert right.verdict == "uncertified" and not right.passed and right.extra["resolution"] > right.tolerance


def test_ffn_and_transformer_learners_report_a_failed_check():
    from attnprobe.learners.ffn import extract_ffn
    from attnprobe.learners.transformer import extract_transformer

    head = random_head(5, seed=1)
    assert not extract_transformer(Oracle(head, 5), seed=0).check.passed
    # x ↦ xᵀv + c has no kink: no ReLU network is visible, so the FFN learner refuses instead of claiming one
    with pytest.raises(UnidentifiableError, match="affine"):
        extract_ffn(Oracle(head, 5), seed=0)


def test_declared_noise_widens_the_tolerance_but_never_past_the_cap():
    from attnprobe.oracles.chain import AnswerChain

    truth = random_head(6, seed=0)
    quiet = functional_check(Oracle(truth, 6), truth, np.random.default_rng(0))
    noisy_oracle = Oracle(truth, 6, chain=AnswerChain(noise="avq:1e-6"))
    noisy = functional_check(noisy_oracle, truth, np.random.default_rng(0))
    loud = functional_check(Oracle(truth, 6, chain=AnswerChain(noise="avq:10")),
                            AttentionHead(np.zeros((6, 6)), truth.v, truth.u, truth.c),
                            np.random.default_rng(0))
    assert quiet.tolerance < noisy.tolerance < CHECK_CAP and noisy.passed
    assert loud.tolerance == CHECK_CAP


def test_a_wrong_model_cannot_pick_its_own_denominator():
    """A model whose huge c is cancelled by a neuron that is always on agrees with nothing in particular, yet measured
    against its own c its error would look ~1e-12: the check measures f − c against the answers' own mean."""
    from attnprobe.models import ReLUNet
    from attnprobe.targets import random_relu_net

    net = random_relu_net(6, 4, seed=0, bias=True)
    oracle = Oracle(net, 6)
    big = 1e9
    # neuron 5: −big·ReLU(1e-12·aᵀx + 1) = −big − 1e-3·aᵀx on any sane input: the −big cancels c + big, and the
    # model is the net with W's first neuron 5 % off plus a linear term
    A = np.concatenate([net.A * np.r_[1.05, 1, 1, 1], 1e-12 * np.ones((6, 1))], axis=1)
    wrong = ReLUNet(A, np.r_[net.w_o, -big], "float64", np.r_[net.b, 1.0], float(net.c) + big)
    chk = functional_check(oracle, wrong, np.random.default_rng(0), lengths=(1,), per_length=64)
    assert not chk.passed and chk.error > 1e-3
    assert functional_check(oracle, net, np.random.default_rng(0), lengths=(1,), per_length=64).passed
