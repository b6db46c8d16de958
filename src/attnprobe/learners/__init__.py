"""Learners: one module per algorithm family; each takes an oracle and returns an Extraction. Every learner is
registered in :mod:`attnprobe.learners.registry` (its options, what it recovers, its capabilities)."""

from attnprobe.learners import positional, registry  # noqa: F401  (positional registers its learner)
from attnprobe.learners.exact import PROBES, extract_exact
from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.lowrank import extract_lowrank
from attnprobe.learners.registry import Capabilities, Learner, Option, learner, learners, register
from attnprobe.learners.result import Extraction
from attnprobe.learners.transformer import extract_transformer

__all__ = ["PROBES", "Capabilities", "Extraction", "Learner", "Option", "extract_exact", "extract_ffn",
           "extract_lowrank", "extract_transformer", "learner", "learners", "register", "registry"]
