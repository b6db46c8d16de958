"""The RoPE routes' shared identity: the registry name their results carry and the lengths their functional check
reads (up to the longest sequence the sketched offsets cover), for the float64 learner (:mod:`.rope`) and the
float32 one (:mod:`.coarse`) alike."""

METHOD = "positional"
#: lengths of the functional check (up to the longest sequence the offsets cover)
CHECK_LENGTHS = (1, 2, 8, 64, 256)
