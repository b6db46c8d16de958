"""attnprobe: recover the weights of attention models from black-box queries.

Implements *Provably Learning Attention with Queries* (Bhattamishra, Shah, Hahn, Kanade).
"""

from attnprobe.errors import AttnprobeError
from attnprobe.learners import Extraction, extract_exact
from attnprobe.models import AttentionHead, load_model, save_model
from attnprobe.oracles import Oracle

__version__ = "0.1.0"
__all__ = ["AttentionHead", "AttnprobeError", "Extraction", "Oracle", "extract_exact", "load_model", "save_model"]
