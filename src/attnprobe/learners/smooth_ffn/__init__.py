"""Smooth FFNs ``y = W2 σ(W1 x + b1) + b2`` (GELU, tanh-GELU, SiLU) from vector answers.

Modules, one phase each: :mod:`.derivatives` (finite-difference derivatives of the answers), :mod:`.decompose`
(the hidden width and the neurons' fixed factors by simultaneous diagonalisation), :mod:`.neurons` (each neuron's
first layer and the activation), :mod:`.polish` (second layer by least squares, Gauss–Newton on the answers) and
:mod:`.learner` (the driver :func:`extract_smooth_ffn`).
"""

from attnprobe.learners.smooth_ffn.learner import extract_smooth_ffn

__all__ = ["extract_smooth_ffn"]
