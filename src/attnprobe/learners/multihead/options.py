"""The declared options of the multi-head learners: the registry's flags and the learners' own validation use
these same declarations (one constraint, one message)."""

from attnprobe.learners.core.registry import Option

HEADS = Option("heads", int, "number of heads (detected when omitted)", low=1, metavar="H")
MAX_HEADS = Option("max_heads", int, "upper bound on the number of heads", low=1, metavar="H0")
SUBSPACES = Option("subspaces", str, "known mutually orthogonal head subspaces: an (H, d, d_h) array 'subspaces' "
                   "(Prop. C.2)", metavar="FILE.npz", input_file=True)
ROUTE = Option("multihead_learner", str, "orthogonal: heads in unknown orthogonal subspaces (App. C Hessians); "
               "generic: overlapping heads; auto (default): generic, then orthogonal when generic fails; vector: "
               "whole output rows (picked by auto when the answers are K-vectors)", default="auto",
               choices=("auto", "orthogonal", "generic", "vector"))
