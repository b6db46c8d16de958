"""The RoPE routes' shared identity: the registry name their results carry and the lengths their functional check
reads (up to the longest sequence the sketched offsets cover), for the float64 learner (:mod:`.rope`) and the
float32 one (:mod:`.coarse`) alike."""

METHOD = "positional"
#: lengths of the functional check (up to the longest sequence the offsets cover)
CHECK_LENGTHS = (1, 2, 8, 64, 256)
#: the check of a route that claims an error (the bfloat16 routes): every length 1 … 256, four sequences each — the
#: statistic the claim bounds (the largest relative error at the last position over those lengths). Five lengths × 8
#: sequences undersample it: d = 32, 4/2, every-position rows, check 1.1e-2 where every length read 3.8e-2 against
#: the float64 module
CLAIM_LENGTHS, CLAIM_PER_LENGTH = tuple(range(1, 257)), 4
