"""Learners: each takes an oracle and returns an Extraction. :mod:`.core` holds what they share and knows no
family; each family package registers its own learners (options, capabilities, estimates) in
:mod:`attnprobe.learners.core.registry` when it is imported: :mod:`.smooth_ffn` (the ``ffn`` learner: ReLU
networks through :mod:`.ffn`, smooth FFNs), :mod:`.head` (single heads), :mod:`.multihead` (multi-head layers),
:mod:`.transformer` (one-layer transformers), :mod:`.positional` (attention whose logits depend on the offset:
RoPE), :mod:`.block` (whole pre-norm blocks)."""

from attnprobe.learners import smooth_ffn, head, multihead, positional, transformer, block  # noqa: F401 (each registers)
from attnprobe.learners.core import registry
from attnprobe.learners.core.registry import Capabilities, Learner, Option, learner, learners, register
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.head import PROBES, extract_exact, extract_lowrank
from attnprobe.learners.transformer import extract_transformer

__all__ = ["PROBES", "Capabilities", "Extraction", "Learner", "Option", "extract_exact", "extract_ffn",
           "extract_lowrank", "extract_transformer", "learner", "learners", "register", "registry"]
