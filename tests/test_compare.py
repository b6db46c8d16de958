"""models.compare.parameter_errors: one comparison of a result with the truth, dispatched on the model's kind."""

import numpy as np
import pytest

from attnprobe.errors import ConfigError
from attnprobe.models import AttentionHead, MultiHeadAttention
from attnprobe.models.compare import parameter_errors
from attnprobe.targets import random_head, random_multihead, random_relu_net, random_transformer


def test_a_head_compares_every_array():
    truth = random_head(5, seed=0)
    off = AttentionHead(truth.W * 1.01, truth.v, truth.u, truth.c)
    errs = parameter_errors(truth, off)
    assert set(errs) == {"W", "v", "u", "c"}
    assert errs["W"] == pytest.approx(0.01) and errs["v"] == errs["u"] == errs["c"] == 0.0


def test_yes_no_answers_compare_the_direction_of_v():
    truth = random_head(5, seed=0, bias=False)
    unit = AttentionHead(truth.W, truth.v / np.linalg.norm(truth.v) * 1.02)
    errs = parameter_errors(truth, unit, v_scale_free=True)
    assert set(errs) == {"W", "v"} and errs["W"] == 0.0 and errs["v"] == pytest.approx(0.02)
    scale = 1.02 / np.linalg.norm(truth.v)  # compared as values, the scale is wrong
    assert parameter_errors(truth, unit)["v"] == pytest.approx(abs(scale - 1))


def test_a_layer_matches_heads_up_to_permutation():
    truth = random_multihead(6, 3, seed=1)
    order = [2, 0, 1]
    got = MultiHeadAttention(truth.W[order] * np.array([1, 1, 1.1])[:, None, None], truth.v[order], truth.u[order],
                             truth.c)
    errs = parameter_errors(truth, got)
    assert errs["W[1]"] == pytest.approx(0.1) and errs["W[0]"] == errs["W[2]"] == 0.0  # true head 1 is got's 2
    assert errs["head1<-2"] == pytest.approx(0.1) and errs["head0<-1"] == errs["head2<-0"] == 0.0
    assert errs["W"] == errs["worst_head"] == pytest.approx(0.1) and errs["heads_found"] == errs["heads_true"] == 3


def test_networks_compare_neurons_up_to_permutation_and_scale():
    tf = random_transformer(5, 7, seed=2)
    errs = parameter_errors(tf, tf)
    assert errs["W"] == errs["v"] == 0.0 and errs["neuron_direction"] < 1e-12 and errs["neuron_weight"] < 1e-12
    net = random_relu_net(5, 7, seed=2)
    assert set(parameter_errors(net, net)) == {"neuron_direction", "neuron_weight"}


@pytest.mark.parametrize("result, says", [
    (random_relu_net(5, 7, seed=2), "cannot be compared"),
    (random_head(4, seed=0), "d = 4 but the truth has d = 5"),
])
def test_incomparable_models_are_refused(result, says):
    with pytest.raises(ConfigError, match=says):
        parameter_errors(random_head(5, seed=0), result)


def test_function_error_over_lengths_scores_the_truth_0_its_output_bias_1_and_the_worst_length():
    """The positional tests' one error formula: 0 for the truth, 1 for a model answering only the output bias, and the
    largest over the lengths (a model wrong only at length 5 is caught), at the last row or at every row."""
    from attnprobe.models.compare import function_error_over_lengths
    from attnprobe.targets.positional_modules import positional_victim, reference_model

    truth = reference_model(positional_victim("llama", d=16, heads=2, kv_heads=1, seed=0))

    class OnlyBias:
        def __call__(self, X):
            return np.broadcast_to(truth.output_bias(), truth(X).shape)

        def every_position(self, X):
            return np.broadcast_to(truth.output_bias(), truth.every_position(X).shape)

    class WrongAtFive:
        def __call__(self, X):
            return truth(X) + (X.shape[1] == 5)

    lengths = (1, 5, 9)
    for rows in (False, True):
        assert function_error_over_lengths(truth, truth, np.random.default_rng(0), lengths, rows=rows) == 0
        assert function_error_over_lengths(OnlyBias(), truth, np.random.default_rng(0), lengths, rows=rows) == 1
    assert function_error_over_lengths(WrongAtFive(), truth, np.random.default_rng(0), lengths) > 0
    assert function_error_over_lengths(WrongAtFive(), truth, np.random.default_rng(0), (1, 9)) == 0
