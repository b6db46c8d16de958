"""Two-layer ReLU networks from value queries (the ``A_FFN`` of Sec. 4.1, extended to biases and K outputs).

Modules, one phase each: :mod:`.answers` (the oracle seen in input or lifted space), :mod:`.kinks` (critical
points along a line), :mod:`.regions` (gradients of the linear regions and their jumps), :mod:`.orientation`
(which side of its hyperplane each neuron is active on), :mod:`.fit` (assembly and least-squares polish),
:mod:`.repair` and :mod:`.more_lines` (coarse answers: a line tested against the first line's neurons, then whole
further lines), and :mod:`.learner` (the driver :func:`extract_ffn` and its :class:`FFNOptions`).

Identifiability: the function fixes only the hyperplanes with their jumps and the linear part, so dead neurons
(``a_k = 0``, or ``w_k = 0`` in every output) are invisible, neurons with the same hyperplane and orientation
merge into one, and a neuron is recovered up to positive rescaling and permutation.

The learner ``ffn`` (ReLU or smooth, as given or read from the answers) is registered by
:mod:`attnprobe.learners.smooth_ffn`, which dispatches to this package for ReLU answers.
"""

from attnprobe.learners.core.registry import Option
from attnprobe.learners.ffn.estimate import ffn_estimate
from attnprobe.learners.ffn.learner import FINEST_EPS, SIGN_TIME_LIMIT, FFNOptions, extract_ffn, require_fine_answers

#: seconds the 0/1 program may spend on neuron orientations (shared with the transformer learners)
SIGN_TIME = Option("sign_time_limit", float, "seconds the 0/1 program may spend on neuron orientations "
                   "(m > d; default 5)", default=5.0, low=0, open_low=True, metavar="SEC")


__all__ = ["FINEST_EPS", "FFNOptions", "SIGN_TIME", "SIGN_TIME_LIMIT", "extract_ffn", "ffn_estimate",
           "require_fine_answers"]
