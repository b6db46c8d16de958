"""Every head's value map from bfloat16 every-position rows, for heads sharing keys and values (GQA): the span of
the value maps (:func:`~.value_span.value_span`), cut into the groups' sub-spans by rank, then each group's mixing
from a zero-key sweep read in the span's coordinates (docs/positional.md, "bfloat16 answers").

1. **span** — :func:`~.value_span.value_span`: ``S (H, K, r)`` spanning ``{V_h Qᵀ}`` (``Q``: ``M``'s row space).
2. **groups** (:func:`group_bases`) — a group's heads share ``W_V,g``, so any mix of them has rank ``d_h``, and
   across groups the ranks add: the combinations ``Σ_k a_k S_k`` of rank ``d_h`` form one ``H/G``-dimensional
   sub-span per group, found by alternating the combination's null space and the combinations vanishing on it.
3. **mixing** (:func:`fit_mixing`) — every row inside the query block of ``[0 × n, z × m]`` answers
   ``y − c = Σ_h S_hm/(n + S_hm) V_h z`` (:mod:`.sweep`), and ``V_h z = Σ_k T_kh S_k Q z``: the answer's
   coordinates on the ``H`` vectors ``S_k Q z`` are ``c(n, m) = T w(n, m)``, one ``T`` for every query and block.
   Within each group (``T`` is block-diagonal in the groups' bases) alternating least squares — each head's centre
   by a grid on ``w = T⁻¹c``, then ``T`` linear — from random starts, then Levenberg–Marquardt on ``T`` and every
   centre at once (the centres eliminated). The zero-key sweep fitted ``K`` numbers per head and query (~3 % off
   for more than two heads); here ``(H/G)²`` numbers are shared by all.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import block_diag

from attnprobe.errors import RecoveryError
from attnprobe.learners.positional import coarse, coarse_bias
from attnprobe.learners.positional.value_span import ROWS, value_span

#: the numbers of zero keys before the query block (0, then geometric up to 512), the block's length (its rows
#: are the blocks m = 1 … BLOCK), the random queries (their entries' size), the mixing's random starts and rounds
ZEROS = tuple(int(n) for n in np.unique(np.concatenate([[0], np.round(np.geomspace(1, 512, 24))])))
BLOCK, QUERIES, QUERY_SCALE, STARTS, ROUNDS = 64, 8, 2.0, 6, 40
#: the span's kernel tokens' entries' size (value_span's KEY_SCALE is 1): the larger, the more the rows' weights differ
#: between heads. d = 128, 8/2, bfloat16: every V_h within 6.4e-3 … 1.0e-2 of the span at 1, 4.6e-3 … 7.5e-3 at 1.5,
#: 4.1e-3 … 7.7e-3 at 2, up to 2.0e-2 at 3, 2.4e-2 … 4.3e-2 at 0.5
KEY_SCALE = 1.5
#: group_bases reads the span through sketches of SKETCH_WIDTH·d_h rows and columns when a span matrix holds more
#: than SKETCH_ABOVE numbers (d = 1024, 8/2 and up; every measured route below it is unchanged). d = 4096, 32/8: an
#: iteration on the whole (4096, 1024) matrices costs ~4⁴× its d = 1024 second, ~4 min (docs/positional.md)
SKETCH_WIDTH, SKETCH_ABOVE = 2, 2**16
#: the centres' range (log S) and their grid
CENTRES = (-15.0, 20.0)
GRID = np.linspace(-6.0, 12.0, 181)


def span_sweep_answers(oracle, Z: np.ndarray, zeros=ZEROS, block: int = BLOCK) -> np.ndarray:
    """The rows inside the query block of ``[0 × n, z × block]`` for every query ``z`` (rows of ``Z``) and count
    ``n``: (len(Z), len(zeros), block, K). One call per ``n``."""
    B, d = Z.shape
    out = []
    for n in zeros:
        X = np.zeros((B, n + block, d))
        X[:, n:] = Z[:, None]
        out.append(np.asarray(oracle.answer_rows(X), dtype=np.float64)[:, n:])
    return np.stack(out, axis=1)


def shapes(logS: np.ndarray, zeros=ZEROS) -> np.ndarray:
    """Every head's block weight ``S/(n + S)``: ``logS (..., H)`` → ``(..., len(zeros), H)``."""
    S = np.exp(np.clip(logS, *CENTRES))[..., None, :]
    return S / (np.asarray(zeros, dtype=np.float64)[:, None] + S)


def grid_centres(C: np.ndarray, T: np.ndarray, zeros=ZEROS) -> np.ndarray:
    """Each head's centre from ``w = T⁻¹c`` by a grid (no coupling between heads): ``C (B, n, H)`` → (B, H)."""
    w = C @ np.linalg.pinv(T).T
    sh = shapes(GRID[:, None], zeros)[:, :, 0]  # (grid, n)
    err = (sh ** 2).sum(1)[None, :, None] - 2 * np.einsum("bnh,gn->bgh", w, sh)  # ‖w − shape‖² less ‖w‖²
    return GRID[np.argmin(err, axis=1)]


def refine_centres(C: np.ndarray, T: np.ndarray, logS: np.ndarray, zeros=ZEROS, steps: int = 3) -> np.ndarray:
    """Gauss–Newton on every block's centres at once (``T`` held)."""
    eye = np.eye(T.shape[1])
    for _ in range(steps):
        w = shapes(logS, zeros)
        r = (C - w @ T.T).reshape(len(C), -1)
        J = ((w * (1 - w))[:, :, None, :] * T[None, None]).reshape(len(C), -1, T.shape[1])
        A = np.einsum("bni,bnj->bij", J, J)
        A = A + (1e-6 * np.einsum("bii->b", A)[:, None, None] / len(eye) + 1e-12) * eye
        logS = np.clip(logS + np.linalg.solve(A, np.einsum("bni,bn->bi", J, r)[..., None])[..., 0], *CENTRES)
    return logS


def joint_refine(C: np.ndarray, T: np.ndarray, logS: np.ndarray, zeros=ZEROS, steps: int = 30):
    """Levenberg–Marquardt on ``T`` and every centre, the centres eliminated (the Schur complement of their
    block-diagonal normal equations): ``C ≈ shapes(logS) Tᵀ``."""
    B, nz, H = C.shape
    eye = np.eye(H)

    def cost(T, logS):
        return float(((C - shapes(logS, zeros) @ T.T) ** 2).sum())
    f, lam = cost(T, logS), 1e-3
    for _ in range(steps):
        w = shapes(logS, zeros)
        r = (C - w @ T.T).reshape(B, -1)
        JT = (w[:, :, None, None, :] * eye[None, None, :, :, None]).reshape(B, nz * H, H * H)
        Js = ((w * (1 - w))[:, :, None, :] * T[None, None]).reshape(B, nz * H, H)
        A, Bb = np.einsum("bni,bnj->ij", JT, JT), np.einsum("bni,bnj->bij", JT, Js)
        D, gT, gs = np.einsum("bni,bnj->bij", Js, Js), np.einsum("bni,bn->i", JT, r), np.einsum("bni,bn->bi", Js, r)
        while lam < 1e8:
            Dinv = np.linalg.inv(D + lam * np.einsum("bii->bi", D)[:, :, None] * eye + 1e-12 * eye)
            Sc = A + lam * np.diag(np.diag(A)) - np.einsum("bij,bjk,blk->il", Bb, Dinv, Bb)
            dT = np.linalg.solve(Sc, gT - np.einsum("bij,bjk,bk->i", Bb, Dinv, gs))
            ds = np.einsum("bij,bj->bi", Dinv, gs - np.einsum("bji,j->bi", Bb, dT))
            Tn, sn = T + dT.reshape(H, H), np.clip(logS + ds, *CENTRES)
            fn = cost(Tn, sn)
            if fn < f:
                gain, (T, logS, f), lam = 1 - fn / f, (Tn, sn, fn), lam / 3
                break
            lam *= 4
        if lam >= 1e8 or gain < 1e-7:
            break
    return T, logS


def fit_mixing(C: np.ndarray, H: int, rng: np.random.Generator, zeros=ZEROS, *, starts: int = STARTS,
               rounds: int = ROUNDS):
    """``T (H, H)`` and the centres with ``C ≈ shapes(logS) Tᵀ`` (module docstring, step 3): the lowest misfit of
    ``starts`` random starts (a wrong minimum's misfit is 5 … 30× the floor, and two wrong starts can agree: d = 16,
    4/2, float64 rows, two of three at 1.1e-2, one at 2.8e-7). Returns (relative misfit, T, logS)."""
    fits = []
    for _ in range(starts):
        T = rng.standard_normal((H, H))
        for _ in range(rounds):
            logS = refine_centres(C, T, grid_centres(C, T, zeros), zeros)
            T = np.linalg.lstsq(shapes(logS, zeros).reshape(-1, H), C.reshape(-1, H), rcond=None)[0].T
            if not np.isfinite(T).all() or np.linalg.matrix_rank(T) < H:  # the heads' shapes merged: restart
                break
        else:
            T, logS = joint_refine(C, T, logS, zeros)
        if not np.isfinite(T).all() or np.linalg.matrix_rank(T) < H:
            continue
        fits.append((np.linalg.norm(C - shapes(logS, zeros) @ T.T) / np.linalg.norm(C), T, logS))
    if not fits:
        raise RecoveryError(f"the sweep's rows did not separate {H} heads (every start merged two of them)")
    return min(fits, key=lambda f: f[0])


def group_bases(S: np.ndarray, dh: int, groups: int, rng: np.random.Generator, *, iters: int = 60,
                tries: int = 12) -> np.ndarray:
    """Each key/value group's sub-span of ``S (H, K, r)`` (module docstring, step 2) as rows of coefficients
    ``(groups, H/groups, H)``; refused when fewer than ``groups`` distinct sub-spans are found. Past
    :data:`SKETCH_ABOVE` numbers a matrix, read on ``P S_k Q`` (:func:`sketched_span`: the ranks the search tests
    are kept, each iteration ~(K/4d_h)(r/4d_h)× cheaper)."""
    if S.shape[1] * S.shape[2] > SKETCH_ABOVE:
        S = sketched_span(S, SKETCH_WIDTH * dh)
    H = S.shape[0]
    per = H // groups
    found = []
    for _ in range(tries):
        a = rng.standard_normal(H)
        for _ in range(iters):
            N = np.linalg.svd(np.einsum("k,kar->ar", a, S))[2][dh:].T
            vt = np.linalg.svd(np.einsum("kar,rs->kas", S, N).reshape(H, -1).T, full_matrices=False)[2]
            a = vt[-1]
        sub = vt[-per:]
        if all(np.linalg.norm(sub @ f.T) < 0.5 * math.sqrt(per) for f in found):
            found.append(sub)
        if len(found) == groups:
            return np.array(found)
    raise RecoveryError(f"the value maps' span did not split into {groups} key/value groups (found {len(found)} "
                        f"sub-spans of rank-{dh} combinations)")


def sketched_span(S: np.ndarray, width: int, seed: int = 0) -> np.ndarray:
    """``P S_k Q`` for every ``S_k (K, r)``, ``P (min(K, width), K)`` and ``Q (r, min(r, width))`` Gaussian (their
    own generator: the caller's draws are unchanged). A combination ``Σ a_k S_k`` of rank ``ρ`` keeps rank
    ``min(ρ, width)`` (generic sketches), so a group's rank-``d_h`` combinations stay the only ones of rank
    ``d_h`` when ``width > d_h``: the coefficients :func:`group_bases` looks for are the same."""
    H, K, r = S.shape
    gen = np.random.default_rng(seed)
    P = gen.standard_normal((min(K, width), K)) / math.sqrt(K) if K > width else np.eye(K)
    Q = gen.standard_normal((r, min(r, width))) / math.sqrt(r) if r > width else np.eye(r)
    return np.einsum("ak,hkr,rb->hab", P, S, Q, optimize=True)


def span_coordinates(oracle, S: np.ndarray, Q: np.ndarray, c: np.ndarray, Z: np.ndarray, zeros=ZEROS,
                     block: int = BLOCK) -> tuple[np.ndarray, float]:
    """The sweep's rows at the queries ``Z`` as coordinates on ``S_k Q z``: (len(Z)·block, len(zeros), H), and the
    median relative distance of the rows from those vectors' span."""
    H = S.shape[0]
    Y = span_sweep_answers(oracle, Z, zeros, block) - c
    U = np.einsum("hkr,qr->qkh", S, Z @ Q.T)
    C, off = [], []
    for Ui, Yi in zip(U, Y):
        rows = Yi.reshape(-1, Yi.shape[-1]).T
        coef = np.linalg.lstsq(Ui, rows, rcond=None)[0]
        off.append(np.linalg.norm(rows - Ui @ coef) / np.linalg.norm(rows))
        C.append(coef.T.reshape(len(zeros), block, H).transpose(1, 0, 2))
    return np.concatenate(C), float(np.median(off))


def row_value_maps(oracle, heads: int, rng: np.random.Generator, *, M: np.ndarray, c: np.ndarray,
                   queries: int = QUERIES, rows: int = ROWS, starts: int = STARTS, rounds: int = ROUNDS):
    """Every ``V_h`` (H, K, d) from every-position rows (module docstring); ``M``, ``c`` from the values stage.
    The groups come from ``M``'s kernel (``r = G·d_h``). Returns ``V`` and what was measured."""
    H, (K, d) = heads, M.shape
    dh = K // H
    kernel = coarse_bias.coarse_kernel(M, H)
    Q = coarse.row_space_basis(kernel, d)
    G = len(Q) // dh
    if G < 1 or len(Q) != G * dh or H % G:
        raise RecoveryError(f"the value maps' row space has rank {len(Q)}, not a multiple of d_h = {dh} dividing "
                            f"{H} heads into key/value groups")
    S, sv = value_span(oracle, Q, kernel, H, rng, rows=rows, key_scale=KEY_SCALE)
    Z = rng.standard_normal((queries, d)) * QUERY_SCALE
    C, off = span_coordinates(oracle, S, Q, c, Z)
    per = H // G
    Gf = np.concatenate(group_bases(S, dh, G, rng)).T if G > 1 else np.eye(H)
    Cg = C @ np.linalg.inv(Gf).T
    fits = [fit_mixing(Cg[..., g * per:(g + 1) * per], per, rng, starts=starts, rounds=rounds) for g in range(G)]
    T = Gf @ block_diag(*[f[1] for f in fits])
    logS = np.concatenate([f[2] for f in fits], axis=1)
    misfit = float(np.linalg.norm(C - shapes(logS) @ T.T) / np.linalg.norm(C))
    V = np.einsum("kh,kar->har", T, S) @ Q
    return V, {"groups": G, "span_gap": float(sv[H] / sv[H - 1]), "rows_off_span": off, "mixing_misfit": misfit}


def row_value_queries(d: int, heads: int, kv_heads: int, *, queries: int = QUERIES, rows: int = ROWS) -> int:
    """Sequences :func:`row_value_maps` asks: the span's ``2·nodes·r`` and the sweep's ``queries·len(ZEROS)``."""
    from attnprobe.learners.positional.value_span import span_queries

    return span_queries(d, heads, kv_heads, rows=rows)["span"][0] + queries * len(ZEROS)
