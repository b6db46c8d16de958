"""Smooth FFNs ``y = W2 σ(W1 x + b1) + b2`` (GELU, tanh-GELU, SiLU) from vector answers.

Modules, one phase each: :mod:`.derivatives` (finite-difference derivatives of the answers), :mod:`.decompose`
(the hidden width and the neurons' fixed factors by simultaneous diagonalisation), :mod:`.neurons` (each neuron's
first layer and the activation), :mod:`.polish` (second layer by least squares, Gauss–Newton on the answers) and
:mod:`.learner` (the driver :func:`extract_smooth_ffn`).

Registers the learner ``ffn``: ReLU networks (:mod:`attnprobe.learners.ffn`) or smooth FFNs, the activation given
or read from the answers (:mod:`.dispatch`).
"""

from attnprobe.learners.core.registry import NO_BIAS, Capabilities, Option, register
from attnprobe.learners.ffn import SIGN_TIME, ffn_estimate
from attnprobe.learners.smooth_ffn.dispatch import CHOICES, extract_ffn_any, ffn_any_estimate
from attnprobe.learners.smooth_ffn.gated_learner import extract_gated_ffn
from attnprobe.learners.smooth_ffn.learner import extract_smooth_ffn


def _ffn(oracle, *, seed, progress, no_bias, sign_time_limit, hidden, activation):
    """ReLU (critical points, here) or smooth (:mod:`attnprobe.learners.smooth_ffn`), as given or detected."""
    return extract_ffn_any(oracle, seed=seed, progress=progress, activation=activation, hidden=hidden,
                           bias=not no_bias, sign_time_limit=sign_time_limit)


def _estimate(s):
    """The ReLU learner's estimate, or the smooth learner's for a smooth activation."""
    return ffn_any_estimate(s, ffn_estimate)


register("ffn", _ffn, recovers="relu_net", capabilities=Capabilities(fine_answers=True, vector_answers=True),
         help="Sec. 4.1: a ReLU network from length-1 queries (critical points); smooth FFNs (GELU, tanh-GELU, "
              "SiLU) and gated FFNs (SwiGLU, GeGLU) from derivatives of the answers (attnprobe.learners.smooth_ffn), "
              "the activation detected or given", estimate=_estimate,
         options=[NO_BIAS, SIGN_TIME,
                  Option("hidden", int, "hidden width if known (ReLU: neurons no answer shows are then reported as "
                         "unidentifiable; smooth: skips the width search)", low=1, metavar="M"),
                  Option("activation", str, "the FFN's activation (default: read from the answers)",
                         choices=CHOICES)])

__all__ = ["extract_smooth_ffn", "extract_gated_ffn", "extract_ffn_any"]
