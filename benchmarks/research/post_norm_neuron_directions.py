"""Research: the post-norm neurons stage's span at MiniLM's size through C probe directions by alternating least
squares (docs/block.md, "Post-norm blocks", stage 7 at MiniLM's size): each point's correction ``q_j ⊗ g_j``
against the current span (a C × C solve), then one subspace-iteration step of the corrected points; per sweep the
span's sines to the true S. The data, the sweep and the sines live in ``post_norm_neuron_span_newton.py`` (its
Gauss–Newton steps superseded these sweeps); this runs its sweeps alone:

    PYTHONPATH=src python benchmarks/research/post_norm_neuron_directions.py C N SWEEPS

(= ``post_norm_neuron_span_newton.py C N 0 0 SWEEPS``). Exact derivatives (no queries).
"""
import runpy
import sys
from pathlib import Path

C, n, sweeps = sys.argv[1:4]
sys.argv = [sys.argv[0], C, n, "0", "0", sweeps]
runpy.run_path(str(Path(__file__).with_name("post_norm_neuron_span_newton.py")), run_name="__main__")
