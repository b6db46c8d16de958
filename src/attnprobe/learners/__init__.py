"""Learners: one module per algorithm family; each takes an oracle and returns an Extraction."""

from attnprobe.learners.exact import PROBES, extract_exact
from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.lowrank import extract_lowrank
from attnprobe.learners.result import Extraction
from attnprobe.learners.transformer import extract_transformer

__all__ = ["PROBES", "Extraction", "extract_exact", "extract_ffn", "extract_lowrank", "extract_transformer"]
