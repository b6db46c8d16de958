"""Learners for attention whose logits depend on the offset between positions (RoPE; docs/positional.md).

Registered as ``--method positional`` (whole output rows at the last position, float64 answers)."""

from attnprobe.learners.positional.rope import extract_positional, positional_queries
from attnprobe.learners.registry import Capabilities, Option, register


def _positional(oracle, *, seed, progress, heads):
    return extract_positional(oracle, heads=heads, seed=seed, progress=progress)


register("positional", _positional, recovers="positional",
         capabilities=Capabilities(vector_answers=True, fine_answers=True),
         help="RoPE attention (LLaMA/Mistral: rotary, GQA, no biases) from whole output rows at the last position; "
              "per head and frequency pair W_Q, W_K up to a scaled rotation of the pair, the frequencies, V_h",
         options=[Option("heads", int, "number of heads (detected when omitted)", low=1, metavar="H")])

__all__ = ["extract_positional", "positional_queries"]
