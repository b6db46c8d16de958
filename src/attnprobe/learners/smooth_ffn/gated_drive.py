"""A start for gated units' blocks read far from the origin, where a gated FFN is nearly piecewise quadratic.

A gated unit ``w2 σ(g·x + bg)(u·x + bu)`` (σ = SiLU or GELU, ``σ(R t)/R → relu(t)``) on the circle
``x(θ) = R (u_a cos θ + u_b sin θ)`` is ``R² w2 relu(γ(θ)) ν(θ)`` plus terms of order R, with ``γ = α_a cos θ +
α_b sin θ`` (``α = U g``) and ``ν = β_a cos θ + β_b sin θ`` (``β = U u``): between its two zero crossings it is a
trigonometric polynomial of degree 2 (frequencies 0 and 2; the order-R terms frequency 1), and at a crossing θ0 its
slope jumps by ``R² w2 |γ'(θ0)| ν(θ0)`` with ``|γ'(θ0)| = ‖(α_a, α_b)‖``. The second difference
``Y(θ+δ) − 2 cos 2δ·Y(θ) + Y(θ−δ)`` removes the frequency 2; what is left between bends is a piecewise constant
``(2 − 2 cos 2δ)·(frequency-0 part)``, removed by one more first difference to find the bends and by the two
quiet neighbours to read them. Each bend gives, as for plain units (:mod:`.drive_start`), ``w2``'s direction and
one equation ``α_a cos θ0 + α_b sin θ0 = 0`` on the gate's projections; its signed size gives one more,
``β_a cos θ0 + β_b sin θ0 = s / ‖(α_a, α_b)‖`` (up to one factor per unit), on the up projection's. The unit's
block is ``w2 ⊗ span{α, β}`` on the first C directions — what :func:`.decompose.block_factors` reads from
Jennrich's pencil, here without inverting any slice.
"""

from __future__ import annotations

import numpy as np

from attnprobe.learners.smooth_ffn.drive_start import (AGREE, QUIET, STRONG, output_direction, bend_floor,
                                                       group_bends, hot_runs, plane_circle)

#: a run of bending samples is one bend when its second singular value is below this share of the first
ONE_BEND = 0.15
#: a unit's gate equations must leave one line: singular values below this share of the largest span the null space
NULL = 1e-3
#: bends whose output directions are opposite within this (cosine) are one unit's (the sign is ν's)
OPPOSITE = -0.95
#: the slope jump of a bend is read from at most PIECE answers each side of it, at least PIECE_MIN in all
PIECE, PIECE_MIN = 8, 8
#: the up projection's equations kept: within this many robust deviations (1.4826 × median) of the fit
OUTLIER = 4.0


def gated_bends(Y: np.ndarray) -> list[tuple[float, np.ndarray, float]]:
    """The bends of periodic answers ``Y`` ``(N, K)`` sampled at ``2π j / N`` of a gated FFN far out: ``(angle,
    signed summed second difference, its norm over the rounding's)`` for every run that is one bend (runs that mix
    several are left out)."""
    N = Y.shape[0]
    D2 = np.roll(Y, -1, axis=0) - 2 * np.cos(4 * np.pi / N) * Y + np.roll(Y, 1, axis=0)
    D3 = D2 - np.roll(D2, 1, axis=0)  # D3[j] = D2[j] − D2[j−1]: 0 between bends
    # the rounding is relative: D3's norm over the answers' (the largest of the four it reads), at least float64's
    size = np.linalg.norm(Y, axis=1)
    size = np.maximum.reduce([np.roll(size, k) for k in (-1, 0, 1, 2)]) + 1e-300
    norms = np.linalg.norm(D3, axis=1) / size
    noise = max(float(np.quantile(norms, QUIET)), 1e-15)
    hot = norms > bend_floor(*Y.shape) * noise
    if not hot.any() or hot.all():
        return []
    runs = hot_runs(hot)
    out = []
    for k, run in enumerate(runs):
        if len(run) < 2:
            continue
        p, q = run[0], run[-1]  # D2 changes from p − 1 to q: the bend's samples are p … q − 1
        js = [(p + k) % N for k in range(len(run) - 1)]
        base = 0.5 * (D2[(p - 1) % N] + D2[q % N])
        R = D2[js] - base
        _, s, vt = np.linalg.svd(R, full_matrices=False)
        if len(s) > 1 and s[1] > ONE_BEND * s[0]:
            continue
        v = R.sum(0)
        w = np.clip(R @ (vt[0] if vt[0] @ v > 0 else -vt[0]), 0, None)
        if w.sum() <= 0:
            continue
        pos = np.arange(len(js)) + p
        centre = float(w @ pos / w.sum())
        # the kink lies between samples p − 1 and q: the answers left of it from the previous run's last D2
        # sample on, right of it up to the next run's first
        left = (p - 1 - min(PIECE, (p - runs[k - 1][-1]) % N)) if len(runs) > 1 else p - 1 - PIECE
        right = (q + min(PIECE, (runs[(k + 1) % len(runs)][0] - q) % N)) if len(runs) > 1 else q + PIECE
        jump = _slope_jump(Y, np.arange(left + 1, p), np.arange(q, right), centre)
        out.append((float(2 * np.pi * centre / N) % (2 * np.pi), v if jump is None else jump,
                    float(np.linalg.norm(v) / (noise * size[p % N]))))
    return out


def _slope_jump(Y: np.ndarray, left: np.ndarray, right: np.ndarray, knot: float) -> np.ndarray | None:
    """The jump of the answers' slope (per sample) at ``knot`` from the samples ``left`` and ``right`` of it (taken
    modulo N): least squares on ``1, t, t², t³, t₊, t₊²`` (the pieces are smooth, the difference of the two vanishes
    at the knot); None when a side has fewer than two samples or both fewer than :data:`PIECE_MIN`."""
    if len(left) < 2 or len(right) < 2 or len(left) + len(right) < PIECE_MIN:
        return None
    idx = np.concatenate([left, right])
    t = idx - knot
    tp = np.clip(t, 0, None)
    A = np.stack([np.ones_like(t), t, t ** 2, t ** 3, tp, tp ** 2], axis=1)
    sol = np.linalg.lstsq(A, Y[idx % Y.shape[0]], rcond=None)[0]
    return sol[4]


def gated_drive_blocks(ask, U: np.ndarray, C: int, radius: float, samples: int, units: int, *, first: int,
                       more: int, most: int) -> tuple[list[np.ndarray], np.ndarray, dict]:
    """Each unit's block ``w2 ⊗ span{U[:C] g, U[:C] u}`` ``(K·C, 2)`` (orthonormal columns, the layout of
    :func:`.decompose.block_factors`) from the bends on circles in random planes of the span of the directions
    ``U`` (``(M, d)``, M ≥ C; each bend's equation then holds every direction, so no circle graph has to connect
    them), ``samples`` answers each: ``first`` circles, then ``more`` at a time while fewer than ``units`` units are
    found, at most ``most``. The best supported first, with their supports and ``details``."""
    M = U.shape[0]
    rng = np.random.default_rng(0)
    found: list = []
    raw: list = []
    asked = 0
    while True:
        for _ in range(first if asked == 0 else more):
            pq = np.linalg.qr(rng.standard_normal((M, 2)))[0].T  # a random plane of the M directions' span
            _, X = plane_circle(pq[0] @ U, pq[1] @ U, radius, samples)
            for th, v, q in gated_bends(ask(X)):
                if np.linalg.norm(v) > 0:
                    found.append((pq[0], pq[1], th, v, q))
                    raw.append(v)
            asked += 1
        blocks, support, details = _units(found, raw, M, C)
        if len(blocks) >= units or asked >= most:
            return blocks, support, {**details, "circles": asked, "samples": samples}


def _units(found: list, raw: list, M: int, C: int) -> tuple[list[np.ndarray], np.ndarray, dict]:
    """The blocks of the units the bends ``found`` (``(p, q, θ0, signed vector, strength)``) show: grouped by output
    direction (each bend oriented by a fixed reference first: its sign is ν's), the gate's projections as the null
    vector of the group's equations ``(p cos θ0 + q sin θ0)·α = 0``, the up's by least squares on the signed sizes."""
    if not found:
        return [], np.zeros(0, int), {"bends": 0, "units_found": 0}
    ref = np.random.default_rng(1).standard_normal(raw[0].shape[0])
    found = [(p, q, th, v if v @ ref >= 0 else -v, s) for p, q, th, v, s in found]
    groups, atoms = group_bends(found)
    groups, atoms = _joined_opposites(groups, atoms, found)
    blocks, support, residuals = [], [], []
    for g in groups:
        g = np.array(g)
        E = np.array([np.cos(found[i][2]) * found[i][0] + np.sin(found[i][2]) * found[i][1] for i in g])
        ok = _trimmed(E, np.array([found[i][4] for i in g]))
        _, sv, vt = np.linalg.svd(E[ok])
        if ok.sum() < M or sv[-1] > NULL * sv[0] or sv[-2] < NULL * sv[0]:
            continue  # the equations' null space is one line
        alpha = vt[-1]
        w2 = output_direction(np.array([found[i][3] / np.linalg.norm(found[i][3]) for i in g[ok]]))
        rows, rhs = [], []
        for i in g[ok]:
            p, q, th, _, _ = found[i]
            # ‖(p·α, q·α)‖ ν(θ0) = s: the rounding's share of s is the same in every row
            rows.append(np.hypot(p @ alpha, q @ alpha) * (np.cos(th) * p + np.sin(th) * q))
            rhs.append(raw[i] @ w2)
        beta, res = _robust_lstsq(np.array(rows), np.array(rhs))
        residuals.append(res)
        Q = np.linalg.qr(np.stack([alpha[:C], beta[:C]], axis=1))[0]
        blocks.append(np.kron(w2[:, None], Q))
        support.append(int(ok.sum()))
    order = np.argsort(-np.array(support), kind="stable")
    details = {"bends": len(found), "bend_groups": len(groups), "units_found": len(blocks),
               "up_fit_median": float(np.median(residuals)) if residuals else None}
    return [blocks[i] for i in order], np.array(support, dtype=int)[order], details


def _joined_opposites(groups: list[list[int]], atoms: np.ndarray, found: list) -> tuple[list[list[int]], np.ndarray]:
    """Groups whose output directions are opposite (a unit whose orientation flipped against the reference) joined,
    their bends' vectors flipped to the first group's orientation."""
    n = len(groups)
    gone = set()
    for i in range(n):
        for j in range(i + 1, n):
            if j in gone or i in gone or atoms[:, i] @ atoms[:, j] > OPPOSITE:
                continue
            for k in groups[j]:
                a, b, th, v, q = found[k]
                found[k] = (a, b, th, -v, q)
            groups[i] += groups[j]
            gone.add(j)
    keep = [i for i in range(n) if i not in gone]
    return [groups[i] for i in keep], atoms[:, keep]


def _trimmed(E: np.ndarray, strength: np.ndarray) -> np.ndarray:
    """The equations (rows of E) one null vector meets within :data:`.drive_start.AGREE`, found by dropping the
    worst-met row until every row left is met (a few false bends, far off, pull a first least-squares solution away
    from all rows and a re-solve on the rows it meets then settles on a wrong set)."""
    ok = strength >= STRONG
    if ok.sum() < E.shape[1]:
        ok[:] = True
    while ok.sum() > 2:
        r = np.abs(E @ np.linalg.svd(E[ok])[2][-1])
        worst = int(np.argmax(np.where(ok, r, -1.0)))
        if r[worst] < AGREE:
            return r < AGREE
        ok[worst] = False
    return ok


def _robust_lstsq(A: np.ndarray, b: np.ndarray, rounds: int = 3) -> tuple[np.ndarray, float]:
    """Least squares without the rows it misses by more than :data:`OUTLIER` robust deviations (a slope read across
    a weak bend no run showed is off by up to 10 %); returns the solution and the kept rows' relative residual."""
    keep = np.ones(len(b), bool)
    for _ in range(rounds):
        x = np.linalg.lstsq(A[keep], b[keep], rcond=None)[0]
        r = np.abs(A @ x - b)
        cut = OUTLIER * 1.4826 * np.median(r[keep])
        new = r <= max(cut, 1e-300)
        if new.sum() < A.shape[1] or (new == keep).all():
            break
        keep = new
    return x, float(np.linalg.norm(r[keep]) / max(np.linalg.norm(b[keep]), 1e-300))
