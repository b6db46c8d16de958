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

from attnprobe.learners.smooth_ffn.drive_start import (AGREE, QUIET, STRONG, _equations, _output_direction, bend_floor,
                                                       circle, group_bends)

#: a run of bending samples is one bend when its second singular value is below this share of the first
ONE_BEND = 0.15
#: a unit's gate equations must leave one line: singular values below this share of the largest span the null space
NULL = 1e-3
#: bends whose output directions are opposite within this (cosine) are one unit's (the sign is ν's)
OPPOSITE = -0.95


def gated_bends(Y: np.ndarray) -> list[tuple[float, np.ndarray, float]]:
    """The bends of periodic answers ``Y`` ``(N, K)`` sampled at ``2π j / N`` of a gated FFN far out: ``(angle,
    signed summed second difference, its norm over the rounding's)`` for every run that is one bend (runs that mix
    several are left out)."""
    N = Y.shape[0]
    D2 = np.roll(Y, -1, axis=0) - 2 * np.cos(4 * np.pi / N) * Y + np.roll(Y, 1, axis=0)
    D3 = D2 - np.roll(D2, 1, axis=0)  # D3[j] = D2[j] − D2[j−1]: 0 between bends
    norms = np.linalg.norm(D3, axis=1)
    noise = float(np.quantile(norms, QUIET))
    floor = bend_floor(*Y.shape) * noise
    hot = norms > floor
    if not hot.any() or hot.all():
        return []
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
    out = []
    for run in runs:
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
        out.append((float(2 * np.pi * (w @ pos) / w.sum() / N) % (2 * np.pi), v, float(np.linalg.norm(v) / noise)))
    return out


def gated_drive_blocks(ask, U: np.ndarray, C: int, radius: float, samples: int
                       ) -> tuple[list[np.ndarray], np.ndarray, dict]:
    """Each unit's block ``w2 ⊗ span{U[:C] g, U[:C] u}`` ``(K·C, 2)`` (orthonormal columns, the layout of
    :func:`.decompose.block_factors`) from the bends on the circles of every pair of the directions ``U``
    (``(M, d)``, M ≥ C), ``samples`` answers each; the best supported first, with their supports."""
    M = U.shape[0]
    rng = np.random.default_rng(0)
    found, raw = [], []
    ref = None
    for a in range(M):
        for b in range(a + 1, M):
            _, X = circle(U, a, b, radius, samples)
            for th, v, q in gated_bends(ask(X)):
                if ref is None:
                    ref = rng.standard_normal(v.shape[0])
                sg = 1.0 if v @ ref >= 0 else -1.0  # one orientation per output direction: the sign is ν's
                found.append((a, b, th, sg * v, q))
                raw.append(v)
    if not found:
        return [], np.zeros(0, int), {"bends": 0}
    groups, atoms = group_bends(found)
    groups, atoms = _joined_opposites(groups, atoms, found)
    blocks, support, residuals = [], [], []
    for g in groups:
        g = np.array(g)
        E = _equations(found, g, M)
        ok = _trimmed(E, np.array([found[i][4] for i in g]))
        _, sv, vt = np.linalg.svd(E[ok])
        if ok.sum() < M or not (E[ok] != 0).any(0).all() or sv[-1] > NULL * sv[0] or sv[-2] < NULL * sv[0]:
            continue  # every direction seen, the equations' null space one line
        alpha = vt[-1]
        w2 = _output_direction(np.array([found[i][3] / np.linalg.norm(found[i][3]) for i in g[ok]]))
        rows, rhs = [], []
        for i in g[ok]:
            a, b, th, _, _ = found[i]
            row = np.zeros(M)
            row[a], row[b] = np.cos(th), np.sin(th)
            rows.append(row)
            rhs.append((raw[i] @ w2) / np.hypot(alpha[a], alpha[b]))
        beta, *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
        residuals.append(float(np.linalg.norm(np.array(rows) @ beta - rhs) / max(np.linalg.norm(rhs), 1e-300)))
        Q = np.linalg.qr(np.stack([alpha[:C], beta[:C]], axis=1))[0]
        blocks.append(np.kron(w2[:, None], Q))
        support.append(int(ok.sum()))
    order = np.argsort(-np.array(support), kind="stable")
    details = {"bends": len(found), "bend_groups": len(groups), "units_found": len(blocks),
               "up_fit_median": float(np.median(residuals)) if residuals else None}
    return [blocks[i] for i in order], np.array(support)[order], details


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
