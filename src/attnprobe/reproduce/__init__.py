"""Reproduce the paper: one experiment per claim, each with the paper's statement, the measured value,
whether the claim holds, and a figure (``attnprobe reproduce``)."""

from attnprobe.reproduce.claims import CLAIMS, Claim
from attnprobe.reproduce.run import run_claims

__all__ = ["CLAIMS", "Claim", "run_claims"]
