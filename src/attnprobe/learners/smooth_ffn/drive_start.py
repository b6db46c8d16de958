"""A start for the smooth learner's factors read far from the origin, where a plain FFN is nearly piecewise linear.

``σ(R z + b) / R → relu(z)`` as R grows (GELU and SiLU alike), so on a circle of radius R in the plane of two of
the C unit directions ``u_a, u_b``, ``x(θ) = R (u_a cos θ + u_b sin θ)``, the answers are ``Σ_i w2_i
relu(α_ia cos θ + α_ib sin θ)·R`` (``α_i = U w1_i``) plus terms of order 1: every neuron bends the answers at the
two angles where ``α_ia cos θ + α_ib sin θ = 0``, and there the second difference along θ is ``+w2_i`` times its
slope jump (convex: always positive). Sampled at N angles, each bend shows in one or two samples; the vector names
the neuron (``w2_i``'s direction), the centroid of the samples' weights its angle ``θ`` to a fraction of a
sample. Each angle is one linear equation ``α_ia cos θ + α_ib sin θ = 0`` on the neuron's C projections; over
the circles of all pairs (a, b) they fix ``α_i`` up to a factor, and ``w2_i ⊗ α_i`` is the learner's factor
(:mod:`.decompose`) without inverting any slice. The answers' rounding is relative, so float32 answers lose
nothing by the drive: a bend's angle is read to ~1e-5 rad whatever R.
"""

from __future__ import annotations

import numpy as np

#: a sample bends when its second difference exceeds this many times the rounding's (its norm over K outputs at the
#: quietest :data:`QUIET` share of the samples)
BEND_FLOOR, QUIET = 2.5, 0.1
#: bends this many times the rounding or stronger found the neurons; weaker ones join the neuron they point to
STRONG = 6.0
#: ... when their output direction is this close to it (cosine) and no other neuron's within 0.6
WEAK_OUTPUT = 0.8
#: a run of bending samples is one bend when its second singular value is below this share of the first
ONE_BEND = 0.15
#: a bend joins a neuron when its output direction is this close (cosine) to the neuron's
SAME_OUTPUT = 0.95
#: a neuron keeps the bends whose equation its solution meets within this (sine of the angle)
AGREE = 2e-2
#: points on which the answers' linear growth far from the origin is checked (:func:`growth_gap`), and the largest
#: gap for which the drive start is used
PROBES, DRIVABLE = 8, 1e-2
#: a run mixing bends is read as at most this many of them, the output directions whose projection on its row space
#: is at least IN_RUN
MAX_MIXED, IN_RUN = 4, 0.9
#: two groups whose projections agree this well (|cos|) and whose output directions are related are one neuron
SAME_PROJECTIONS = 1 - 1e-7
#: singular values of a neuron's equations below this share of the largest span its null space (the answers read
#: the angles to ~1e-6)
NULL = 1e-3
#: ... and the first C entries of that null space are one line when its second singular value is below this share
#: of its first
OPEN = 1e-2
#: a group whose least-squares null vector meets less than this share of its equations is tried by consensus
#: (:func:`_consensus`, TRIES random sets: MiniLM layer 2's pair at output cosine 0.998 met 64 of its group's 112)
ONE_NEURON, TRIES = 0.8, 5000
#: ... whose null vectors count the rows they meet within this (the angles are read to ~1e-5)
CONSENSUS_AGREE = 1e-4
#: ... and only where the null vector's entries on the row's two directions sum to more than this (the unit
#: vector e_7 meets the rows of all 21 circles without direction 7: at AGREE it met 87 rows of the pair's 112)
TRIVIAL = 0.05
#: at most this many circles in all aimed at neurons whose equations leave a plane open (:func:`aimed_circles`)
MAX_AIMED = 16
#: ... where the bends closest to the neuron's output direction are its own when their cosine exceeds this (its
#: plane is open, so any angle is one solution: MiniLM layer 2's unit 1026 bent there at cosine 0.75, a weaker
#: neighbour in the same sample)
AIMED_OUTPUT = 0.5
#: circles tried per open plane: in it, then tilted out of it by TILT times a random direction orthogonal to it
#: (the same equation for the neuron, other neighbours: unit 589's bends mixed in the plane, tilted by 0.5 they
#: did not)
AIMED_TRIES, TILT = 4, 0.5


def growth_gap(ask, d: int, radius: float, rng: np.random.Generator) -> float:
    """How far the answers are from growing linearly at ``radius`` (the ReLU limit is positively homogeneous):
    the largest ``‖f(2x) − 2f(x)‖ / ‖2f(x)‖`` over :data:`PROBES` random points x of norm ``radius`` (2·PROBES
    queries). Small (~1e-5) for a plain FFN; of order one when a norm in front caps the scale it can be driven to."""
    Z = rng.standard_normal((PROBES, d))
    Z *= radius / np.linalg.norm(Z, axis=1, keepdims=True)
    Y = ask(np.concatenate([Z, 2 * Z]))
    one, two = Y[:PROBES], Y[PROBES:]
    return float(np.max(np.linalg.norm(two - 2 * one, axis=1) / np.maximum(np.linalg.norm(2 * one, axis=1),
                                                                             1e-300)))


def circle(U: np.ndarray, a: int, b: int, radius: float, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The angles ``(N,)`` and the points ``(N, d)`` of the circle of ``radius`` in the plane ``(u_a, u_b)``."""
    return plane_circle(U[a], U[b], radius, samples)


def plane_circle(p: np.ndarray, q: np.ndarray, radius: float, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The angles ``(N,)`` and the points ``radius (p cos θ + q sin θ)`` ``(N, d)``."""
    theta = 2 * np.pi * np.arange(samples) / samples
    return theta, radius * (np.cos(theta)[:, None] * p + np.sin(theta)[:, None] * q)


def bend_floor(N: int, K: int) -> float:
    """The floor of a bend over the rounding's norm at the :data:`QUIET` quantile: :data:`BEND_FLOOR`, or for few
    outputs the largest of N such norms (a chi distribution with K degrees: ``√K + √(2 ln N)`` against
    ``√K − 0.9`` at the 10 % quantile) with a third to spare (16-48-16 at N = 4096: a floor of 2.5 let 540 false
    bends through)."""
    rk = np.sqrt(K)
    return max(BEND_FLOOR, 1.3 * (rk + 1.5 * np.sqrt(2 * np.log(N))) / max(rk - 0.9, 0.1))


def bends(Y: np.ndarray) -> tuple[list[tuple[float, np.ndarray, float]], list[tuple[int, np.ndarray, float]]]:
    """The bends of periodic answers ``Y`` ``(N, K)`` sampled at ``2π j / N``: ``(angle, summed second difference,
    its norm over the rounding's)`` for every run of bending samples that is one bend (rank one), and the runs that
    mix several ``(first sample, second differences (L, K), rounding)`` (:func:`mixed_bends` reads them once the
    neurons' output directions are known). The rounding's norm over K outputs hardly varies from sample to sample,
    so a floor a few times it finds weak bends without false ones."""
    N = Y.shape[0]
    # the second difference of a sinusoid cos(θ − φ) is 2(cos δ − 1) times itself: so this one is 0 between bends
    D = np.roll(Y, -1, axis=0) - 2 * np.cos(2 * np.pi / N) * Y + np.roll(Y, 1, axis=0)
    norms = np.linalg.norm(D, axis=1)
    noise = float(np.quantile(norms, QUIET))
    hot = norms > bend_floor(*Y.shape) * noise
    if not hot.any() or hot.all():
        return [], []
    runs = hot_runs(hot)
    out, mixed = [], []
    for run in runs:
        js = [(run[0] - 1) % N, *run, (run[-1] + 1) % N]  # a neighbour each side: a bend's share below the floor
        R = D[js]
        _, s, vt = np.linalg.svd(R, full_matrices=False)
        if len(s) > 1 and s[1] > ONE_BEND * s[0] and s[1] > bend_floor(*Y.shape) * noise:
            mixed.append((run[0] - 1, R, noise * bend_floor(*Y.shape)))
            continue
        v = vt[0] if vt[0] @ R.sum(0) > 0 else -vt[0]
        w = np.clip(R @ v, 0, None)
        pos = np.arange(len(js)) + (run[0] - 1)
        out.append((float(2 * np.pi * (w @ pos) / w.sum() / N) % (2 * np.pi), R.sum(0),
                    float(np.linalg.norm(R.sum(0)) / noise)))
    return out, mixed


def hot_runs(hot: np.ndarray) -> list[list[int]]:
    """The runs of consecutive True samples of a periodic mask ``hot`` (not all True, not all False), in circular
    order from a quiet sample."""
    N = len(hot)
    start = int(np.flatnonzero(~hot)[0])
    order = (np.arange(N) + start) % N
    runs: list[list[int]] = []
    prev = None
    for j in order[hot[order]]:
        pos = (j - start) % N
        if prev is not None and pos - prev <= 1:
            runs[-1].append(int(j))
        else:
            runs.append([int(j)])
        prev = pos
    return runs


def group_bends(found: list[tuple[int, int, float, np.ndarray, float]]) -> tuple[list[list[int]], np.ndarray]:
    """Bends ``(a, b, angle, vector, strength)`` grouped by their output direction: the strong ones
    (:data:`STRONG`) found the groups (cosine above :data:`SAME_OUTPUT` to a group's mean joins it), the weak ones
    join the group they clearly point to. Returns the groups (indices into ``found``) and their unit directions
    ``(K, groups)``."""
    groups: list[list[int]] = []
    dirs = np.array([v / np.linalg.norm(v) for _, _, _, v, _ in found])
    snr = np.array([q for *_, q in found])
    strong = np.flatnonzero(snr >= STRONG)
    if not len(strong):
        return [], np.zeros((dirs.shape[1] if len(dirs) else 0, 0))
    sums = np.zeros((len(strong), dirs.shape[1]))  # each group's summed directions (its first rows in use)
    unit = np.zeros_like(sums)
    for i in strong:
        n = len(groups)
        if n:
            cos = unit[:n] @ dirs[i]
            j = int(np.argmax(cos))
            if cos[j] > SAME_OUTPUT:
                groups[j].append(int(i))
                sums[j] += dirs[i]
                unit[j] = sums[j] / np.linalg.norm(sums[j])
                continue
        groups.append([int(i)])
        sums[n] = unit[n] = dirs[i]
    Cm = unit[:len(groups)]
    weak = np.flatnonzero(snr < STRONG)
    if len(weak):
        cos = dirs[weak] @ Cm.T
        top = np.sort(cos, axis=1)
        for r, i in enumerate(weak):
            if top[r, -1] > WEAK_OUTPUT and (top.shape[1] < 2 or top[r, -2] < 0.6):
                groups[int(np.argmax(cos[r]))].append(int(i))
    return groups, Cm.T


def mixed_bends(N: int, first: int, R: np.ndarray, floor: float, atoms: np.ndarray) -> list[tuple[int, float, float]]:
    """A run of second differences ``R`` ``(L, K)`` (from sample ``first`` of N) that mixes several bends, read
    as the known output directions ``atoms`` ``(K, n)`` closest to its row space: ``(atom, angle, strength over
    the floor)`` for each bend the least-squares weights show above the bend ``floor``; none when the atoms do not
    explain it."""
    _, s, vt = np.linalg.svd(R, full_matrices=False)
    r = int(min(MAX_MIXED, np.sum(s > floor)))
    if r < 2 or atoms.shape[1] < r:
        return []
    proj = np.linalg.norm(vt[:r] @ atoms, axis=0)
    cand = np.argsort(-proj)[:r]
    if proj[cand[-1]] < IN_RUN:
        return []
    Wt = np.linalg.lstsq(atoms[:, cand], R.T, rcond=None)[0]  # (r, L)
    if np.linalg.norm(R.T - atoms[:, cand] @ Wt) > floor * np.sqrt(len(R)):
        return []
    out = []
    pos = np.arange(len(R)) + first
    for c, w in zip(cand, np.clip(Wt, 0, None)):
        if w.sum() > floor:
            out.append((int(c), float(2 * np.pi * (w @ pos) / w.sum() / N) % (2 * np.pi), float(w.sum() / floor)))
    return out


def solve_groups(found: list[tuple[int, int, float, np.ndarray, float]], groups: list[list[int]], M: int,
                 C: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict, list]:
    """Each group's equations ``α_a cos θ + α_b sin θ = 0`` solved: unit output directions ``(K, n)``, unit
    projections on the first C directions ``α`` ``(C, n)`` (a neuron whose equations leave them open is dropped),
    the bends each rests on ``(n,)`` and counts; bends its solution misses form a group of their own (a second
    neuron with nearly the same output direction), found by consensus when the least-squares null vector meets too
    few (:func:`_consensus`). Last, the dropped groups whose equations leave exactly a plane open
    ``(bends, group index, equations (n, M), plane (2, M))``, the best supported first (:func:`aimed_circles`)."""
    dirs = np.array([v / np.linalg.norm(v) for _, _, _, v, _ in found])
    W2, alpha, support, kept, dropped, split, planes = [], [], [], 0, 0, 0, []
    rng = np.random.default_rng(0)
    queue = [(gi, np.array(g)) for gi, g in enumerate(groups)]
    while queue:
        gi, g = queue.pop()
        E = _equations(found, g, M)
        ok = _agreeing(E)
        if ok.mean() < ONE_NEURON and (best := _consensus(E, rng)).any():
            ok, split = best, split + 1
        al = _projections(E[ok], C)
        if al is None:
            dropped += 1
            if (plane := _open_plane(E[ok])) is not None:
                planes.append((int(ok.sum()), gi, E[ok], plane))
            continue
        if not ok.all():  # a second neuron with nearly the same output direction: its bends are tried on their own
            queue.append((gi, g[~ok]))
        W2.append(output_direction(dirs[g[ok]]))
        alpha.append(al)
        support.append(int(ok.sum()))
        kept += int(ok.sum())
    details = {"bend_groups": len(groups), "groups_dropped": dropped, "bends_used": kept, "groups_by_consensus": split}
    planes.sort(key=lambda t: -t[0])
    return W2, alpha, support, details, planes


def aimed_circles(ask, U: np.ndarray, C: int, radius: float, samples: int, planes: list, *, atoms: np.ndarray,
                  count: int) -> tuple[list, list, list, int]:
    """Neurons whose equations leave a plane open (a group seen on circles that do not connect all M directions:
    MiniLM layer 2 had three) read on one more circle each, in that plane: with ``n1, n2`` spanning it,
    ``x(θ) = R (n1 U cos θ + n2 U sin θ)`` gives ``w1·x = R (α·n1 cos θ + α·n2 sin θ)``, so the neuron's bends
    (the two closest to its output direction, ``atoms`` column of its group, or read from runs mixing bends) give
    the missing equation ``(n1 cos θ + n2 sin θ)·α = 0``. When that circle shows none, up to
    :data:`AIMED_TRIES` − 1 more tilted out of the plane by ``r ⟂ n1, n2`` (``(n1 + r1) U``, ``(n2 + r2) U``:
    since ``α·r = 0`` the equation is the same for this neuron, not for the others). At most ``count`` circles in
    all; returns output directions, projections, supports and the circles asked."""
    W2, alpha, support, asked = [], [], [], 0
    for bends_seen, gi, E, (n1, n2) in planes:
        w = atoms[:, gi]
        rng = np.random.default_rng(gi)
        angles = []
        for tilt in range(min(AIMED_TRIES, count - asked)):
            asked += 1
            r = rng.standard_normal((2, len(n1))) * (tilt > 0) * TILT
            r -= (r @ np.array([n1, n2]).T) @ np.array([n1, n2])
            _, X = plane_circle((n1 + r[0]) @ U, (n2 + r[1]) @ U, radius, samples)
            single, mix = bends(ask(X))
            angles = [th for first, R, floor in mix
                      for c, th, _ in mixed_bends(samples, first, R, floor, atoms) if c == gi]
            cos = np.array([v @ w / np.linalg.norm(v) for _, v, _ in single])
            near = np.flatnonzero(cos > max(AIMED_OUTPUT, cos.max(initial=0) - 1e-2))  # the bend and its antipode
            angles += [single[i][0] for i in near]
            if angles:
                break
        if not angles:
            continue
        Ea = np.concatenate([E, np.array([np.cos(t) * (n1 + r[0]) + np.sin(t) * (n2 + r[1]) for t in angles])])
        ok = _agreeing(Ea)
        al = _projections(Ea[ok], C)
        if al is not None:
            W2.append(w)
            alpha.append(al)
            support.append(int(ok.sum()))
    return W2, alpha, support, asked


def drive_factors(ask, U: np.ndarray, C: int, radius: float, samples: int) -> tuple[np.ndarray, dict]:
    """The factors ``w2_i ⊗ (U[:C] w1_i)`` ``(K·C, n)`` (unit columns, the layout of
    :func:`.decompose.split_factors`), the best-supported first, from the bends on the circles of every pair of the
    directions ``U`` (``(M, d)``, M ≥ C: the rows past C only add circles), ``samples`` answers each, then up to
    :data:`MAX_AIMED` circles aimed at the neurons their equations leave open (:func:`aimed_circles`)."""
    M = U.shape[0]
    found, mixed = [], []
    for a in range(M):
        for b in range(a + 1, M):
            theta, X = circle(U, a, b, radius, samples)
            single, mix = bends(ask(X))
            found += [(a, b, th, v, q) for th, v, q in single]
            mixed += [(a, b, *run) for run in mix]
    groups, atoms = group_bends(found)
    decoded = 0
    for a, b, first, R, floor in mixed:
        for c, th, q in mixed_bends(samples, first, R, floor, atoms):
            groups[c].append(len(found))
            found.append((a, b, th, atoms[:, c] * q * floor, q))
            decoded += 1
    W2, alpha, support, details, planes = solve_groups(found, groups, M, C)
    more = (aimed_circles(ask, U, C, radius, samples, planes, atoms=atoms, count=MAX_AIMED) if planes
            else ([], [], [], 0))
    W2, alpha, support, merged = _merged(W2 + more[0], alpha + more[1], support + more[2])
    details.update(bends=len(found) - decoded, mixed_runs=len(mixed), mixed_bends_read=decoded,
                   groups_merged=merged, open_planes=len(planes), aimed_circles=more[3], aimed_found=len(more[0]))
    if not W2:
        return np.zeros((found[0][3].shape[0] * C if found else 0, 0)), details
    W2, alpha, support = np.array(W2).T, np.array(alpha).T, np.array(support)
    order = np.argsort(-support, kind="stable")
    A = np.einsum("kn,cn->kcn", W2[:, order], alpha[:, order]).reshape(W2.shape[0] * C, -1)
    return A / np.linalg.norm(A, axis=0), details


def circles(M: int) -> int:
    """Circles :func:`drive_factors` reads on M directions (one per pair)."""
    return M * (M - 1) // 2


def output_direction(S: np.ndarray) -> np.ndarray:
    """The common direction of unit vectors ``S`` ``(n, K)``, those that stray (a weaker bend within the run) left
    out: the mean of the half closest to the first mean."""
    v = S.mean(0)
    cos = S @ (v / np.linalg.norm(v))
    keep = cos >= np.median(cos)
    v = S[keep].mean(0)
    return v / np.linalg.norm(v)


def _equations(found: list, g: np.ndarray, M: int) -> np.ndarray:
    """The equations ``α_a cos θ + α_b sin θ = 0`` of the bends ``g`` of ``found``, one row ``(M,)`` each."""
    E = np.zeros((len(g), M))
    for r, i in enumerate(g):
        a, b, th, _, _ = found[i]
        E[r, a], E[r, b] = np.cos(th), np.sin(th)
    return E


def _consensus(E: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The rows of E that the best of :data:`TRIES` null vectors of random M − 1 of them meets within
    :data:`CONSENSUS_AGREE` (random sample consensus): for a group mixing two neurons with nearly the same
    output direction and a few stray bends, whose least-squares null vector meets neither. Empty when no null
    vector meets 2·M rows (a few random rows always have one)."""
    n, M = E.shape
    if n < 2 * M:
        return np.zeros(n, bool)
    pick = np.argsort(rng.random((TRIES, n)), axis=1)[:, :M - 1]
    _, sv, vt = np.linalg.svd(E[pick])
    v = vt[:, -1] * (sv[:, -1] > NULL * sv[:, 0])[:, None]  # (TRIES, M); a set of lower rank (a bend and its
    # antipode give one equation) leaves a plane open, and its null vector is any line in it
    # a row is met only where v does not vanish on both its directions: e_j meets every circle without j
    meets = (np.abs(E @ v.T) < CONSENSUS_AGREE) & ((E != 0) @ np.abs(v.T) > TRIVIAL)
    best = int(np.argmax(meets.sum(0)))
    return meets[:, best] if meets[:, best].sum() >= 2 * M else np.zeros(n, bool)


def _open_plane(E: np.ndarray) -> np.ndarray | None:
    """The null space ``(2, M)`` of equations E when it is a plane, else None."""
    M = E.shape[1]
    if len(E) == 0:
        return None
    _, s, vt = np.linalg.svd(E)
    null = vt[np.concatenate([s, np.zeros(M - len(s))]) < NULL * max(s[0], 1e-300)]
    return null if len(null) == 2 else None


def _agreeing(E: np.ndarray, rounds: int = 3) -> np.ndarray:
    """The equations (rows of E, unit-norm) that one null vector meets within :data:`AGREE`: solved on all, then
    again on those it meets (another neuron's bends pull the first solution; a few rounds let it settle)."""
    ok = np.ones(len(E), bool)
    for _ in range(rounds):
        if ok.sum() < 2:
            break
        new = np.abs(E @ np.linalg.svd(E[ok])[2][-1]) < AGREE
        if (new == ok).all() or new.sum() < 2:
            break
        ok = new
    return ok


def _projections(E: np.ndarray, C: int) -> np.ndarray | None:
    """The unit vector of the first C entries of E's null space when that is one line, else None (the equations
    leave them open: too few circles saw the neuron)."""
    M = E.shape[1]
    if len(E) == 0:
        return None
    _, s, vt = np.linalg.svd(E)
    null = vt[np.concatenate([s, np.zeros(M - len(s))]) < NULL * max(s[0], 1e-300)]
    if len(null) == 0:
        return None
    u, sv, _ = np.linalg.svd(null[:, :C].T, full_matrices=False)
    if sv[0] < OPEN or (len(sv) > 1 and sv[1] > OPEN * sv[0]):
        return None
    return u[:, 0]


def _merged(W2: list, alpha: list, support: list) -> tuple[list, list, list, int]:
    """Groups that are one neuron (the same projections to :data:`SAME_PROJECTIONS`, a related output direction:
    a bend whose vector a close neighbour bent away from the rest) kept once, the best supported."""
    if not W2:
        return W2, alpha, support, 0
    order = np.argsort(-np.array(support), kind="stable")
    Al, W = np.array(alpha), np.array(W2)
    keep: list[int] = []
    for i in order:
        if any(abs(Al[i] @ Al[j]) > SAME_PROJECTIONS and W[i] @ W[j] > 0.5 for j in keep):
            continue
        keep.append(int(i))
    return [W2[i] for i in keep], [alpha[i] for i in keep], [support[i] for i in keep], len(W2) - len(keep)
