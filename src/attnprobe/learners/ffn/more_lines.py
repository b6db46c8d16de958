"""More search lines for coarse answers, and the choice between the neuron sets the lines saw.

On float32 answers a weak neuron whose kink lies within a stencil of a strong one, or two kinks that a chord
test takes for one, leave a line's neuron set wrong by a neuron or two; which kinks merge depends on the last bits
of the answers (another BLAS kernel's float32 rounding of the same network merges others). Every neuron's
hyperplane crosses each search line once, and two neurons close on one random line are far apart on another, so
further lines repair the first: neurons seen on two lines are kept, a neuron one line alone saw is kept unless it
is two kinks that line merged (the sum of two neurons other lines alone saw), and the set that best explains every
answer asked so far wins.
"""

from __future__ import annotations

import numpy as np

from attnprobe.learners.ffn.regions import hyperplane_normals

#: lines searched at most (the first included) when the neurons found do not explain the answers
MAX_LINES = 3
#: two jumps are the same neuron when their hyperplane normals agree to this cosine (float32 jumps of weak neurons
#: are off by up to ~0.05 rad; two random directions in d ≥ 4 agree this well with probability < 1e-4)
SAME_NEURON_COS = 1.0 - 2e-3
#: a jump one line alone saw is two kinks the line merged when it is ±J_a ± J_b of two jumps that other lines alone
#: saw, to this relative error
MERGED_PAIR = 2e-2
#: the neurons are accepted when their polished answers agree with every answer to this many roundings
CONSISTENT_ROUNDINGS = 16.0


def needs_another_line(orientation_exact: bool, consistency: float, eps: float) -> bool:
    """Another line is searched when no ±1 orientation reproduces the linear part (a neuron is missing or wrong)
    or the polished network misses some answer by more than :data:`CONSISTENT_ROUNDINGS` roundings."""
    return not orientation_exact or consistency > CONSISTENT_ROUNDINGS * eps


def candidate_sets(J: np.ndarray, line: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Jump sets to choose from (boolean masks over the jumps), given every line's jumps (``line``: which line saw
    each): the neurons two lines saw plus the unmerged ones one line alone saw; the neurons two lines saw; the last
    line alone; one jump of every neuron any line saw. Also the mask of the unmerged jumps one line alone saw
    (each may be tried on its own)."""
    n = J.shape[0]
    N = hyperplane_normals(J)
    close = (np.abs(N.T @ N) > SAME_NEURON_COS) & (line[:, None] != line[None, :])
    rep = np.full(n, -1)
    for k in range(n):  # each jump joins the first earlier jump of another line it matches
        earlier = np.flatnonzero(close[k, :k])
        rep[k] = rep[earlier[0]] if earlier.size else k
    lines_seen = np.array([len(set(line[rep == rep[k]])) for k in range(n)])
    first = rep == np.arange(n)
    single = lines_seen == 1
    merged = np.zeros(n, dtype=bool)
    for k in np.flatnonzero(single):
        merged[k] = is_merged_pair(J[k], J[single & (line != line[k])])
    sets = [first & ~merged, first & ~single, line == line.max(), first]
    unique, seen = [], set()
    for keep in sets:
        key = keep.tobytes()
        if keep.any() and key not in seen:
            seen.add(key)
            unique.append(keep)
    return unique, first & single & ~merged


def is_merged_pair(jump: np.ndarray, others: np.ndarray) -> bool:
    """Whether ``jump`` is ``±J_a ± J_b`` of two of ``others`` (to :data:`MERGED_PAIR`): two neurons whose kinks
    its line took for one."""
    if others.shape[0] < 2:
        return False
    cand = others.reshape(others.shape[0], -1)
    a, b = np.triu_indices(cand.shape[0], 1)
    j = jump.reshape(-1)
    miss = min(float(np.min(np.linalg.norm(sa * cand[a] + sb * cand[b] - j, axis=1)))
               for sa in (1, -1) for sb in (1, -1))
    return miss <= MERGED_PAIR * max(float(np.linalg.norm(j)), 1e-300)
