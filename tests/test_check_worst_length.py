"""The functional check's ``worst`` norm: the largest relative error of any length, the error a RoPE route claims
(an error that grows with the length hides in the RMS over every answer: docs/benchmarks/positional-precision.md)."""

from dataclasses import replace

import numpy as np
import pytest

from attnprobe.errors import ConfigError
from attnprobe.learners.core.check import functional_check
from attnprobe.learners.positional.method import CHECK_LENGTHS
from attnprobe.oracles.base import Oracle
from attnprobe.targets import random_rope_attention


def _checks(truth, model):
    out = []
    for norm in ("rms", "worst"):
        oracle = Oracle(truth.with_dtype("float32"), truth.d, precision="float32")
        out.append(functional_check(oracle, model, np.random.default_rng(1), CHECK_LENGTHS, 8, norm=norm))
    return out


def test_one_head_off_passes_the_rms_check_but_fails_the_worst_length():
    truth = random_rope_attention(16, 2, 1, seed=5)
    Wq = np.array(truth.Wq)
    Wq[0] *= 1.0025  # head 0's logits 0.25 % too large: 1e-3 … 2e-3 off where its weights matter
    rms, worst = _checks(truth, replace(truth, Wq=Wq))
    assert rms.passed and rms.error < rms.tolerance  # the RMS over every answer: within float32's tolerance
    assert not worst.passed and worst.verdict == "failed" and worst.tolerance == rms.tolerance
    assert worst.error == max(worst.per_length.values()) > worst.tolerance > worst.extra["rms_error"]
    assert worst.extra["rms_error"] == pytest.approx(rms.error)  # the same answers, read both ways
    assert "largest relative error of a length" in worst.describe()


def test_the_worst_length_check_passes_the_module_itself_and_refuses_an_unknown_norm():
    truth = random_rope_attention(16, 2, 1, seed=5)
    _, worst = _checks(truth, truth)
    assert worst.passed and worst.error < 1e-5  # float32 answers of the model itself: their rounding only
    oracle = Oracle(truth, 16)
    with pytest.raises(ConfigError) as exc:
        functional_check(oracle, truth, np.random.default_rng(0), (1, 2), 2, norm="max")
    assert exc.value.param == "norm"
