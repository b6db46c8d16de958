"""Attention logits of every head from every position at once (every-position answers; docs/every-position.md).

A sequence ``[0; s·o_1; …; s·o_m]`` of a zero token and m scaled orthonormal directions answers, at the row of
query token ``x_i``, ``y_i − c = Σ_h Σ_j α_{h,ij} V_h x_j`` (the zero token adds no value), with
``log(α_{h,ij}/α_{h,i0}) = x_jᵀ(W_h x_i + u_h)``. One least-squares solve with the K × Hm matrix ``[V_h x_j]``
(shared by every row of a bidirectional layer; its first i columns for row i of a causal one) reads all of them:
the zero token's row (bidirectional) or a zero token appended last (causal) gives ``s·o_jᵀu_h``, and row i gives
``s² o_jᵀ W_h o_i`` for every token pair of the sequence, m² entries of every ``W_h`` per sequence where a
last-position answer reads m. Sequences pair blocks of the basis; with the low-rank sketch of Sec. 5 only the
blocks meeting the first L directions (``W_h``'s entries ``[:, L]`` and ``[L, :]``), then
``W_h = Q_h (Q_h[L])⁺ W_h[L, :]`` with ``Q_h`` a basis of the columns ``[:, L]`` (in the basis O).
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import RecoveryError
from attnprobe.learners.multihead.vector_logits import gap_rank, least_squares


#: sketch directions beyond d/H (a head's rank must stay at least this far below them; the last-position
#: learner keeps 16)
SKETCH_MARGIN = 8


def block_sequences(blocks: list[np.ndarray], pairs: list[tuple[int, int]], causal: bool) -> list[np.ndarray]:
    """Token index lists of the sequences: ``-1`` is the zero token, first (and also last when ``causal``); each
    pair ``(p, q)`` of blocks gives one sequence (causal: also the reversed one, since row i sees only j ≤ i)."""
    out = []
    for p, q in pairs:
        idx = blocks[p] if p == q else np.concatenate([blocks[p], blocks[q]])
        if not causal:
            out.append(np.concatenate([[-1], idx]))
            continue
        out.extend(np.concatenate([[-1], order, [-1]]) for order in (idx, idx[::-1]))
    return out


def read_rows(Y: np.ndarray, c: np.ndarray, V: np.ndarray, T: np.ndarray, causal: bool):
    """Logits ``x_jᵀ(W_h x_i + u_h)`` (H, n, n) of one sequence's rows ``Y (n, K)`` for its tokens ``T (n, d)``
    (zero rows: zero tokens, logit 0); NaN where a row does not see a token (causal). Also the smallest
    attention weight read."""
    n = T.shape[0]
    H = V.shape[0]
    live = np.flatnonzero(np.any(T != 0, axis=1))
    A = np.matmul(V, T[live].T)  # (H, K, m): V_h x_j
    out = np.full((H, n, n), np.nan)
    out[:, :, np.setdiff1d(np.arange(n), live)] = 0.0
    smallest = 1.0
    R = (Y - c).T  # (K, n)
    if not causal:
        alpha = least_squares(A.transpose(1, 0, 2).reshape(A.shape[1], -1), R).reshape(H, len(live), n)
        rows = [(np.arange(n), live, alpha)]
    else:
        rows = []
        for i in range(n):
            seen = live[live <= i]
            if seen.size == 0:
                continue
            k = int(np.searchsorted(live, i, side="right"))
            Ai = A[:, :, :k].transpose(1, 0, 2).reshape(A.shape[1], -1)
            rows.append((np.array([i]), seen, least_squares(Ai, R[:, i:i + 1]).reshape(H, k, 1)))
    for which, seen, alpha in rows:
        zero = 1.0 - alpha.sum(axis=1)  # the zero tokens' weight, (H, rows)
        zeros_seen = np.array([np.sum(~np.any(T[:i + 1] != 0, axis=1)) if causal else n - len(live)
                               for i in which])
        smallest = min(smallest, float(alpha.min()), float(zero.min()))
        if smallest <= 0:
            raise RecoveryError(f"an attention weight came out {smallest:.2e} ≤ 0: the value maps V_h do not "
                                "explain the every-position answers (heads not separated, or the answers too "
                                "coarse for these probes)")
        logits = np.log(alpha) - np.log(zero / zeros_seen)[:, None, :]  # (H, seen, rows): one zero token's
        out[:, which[:, None], seen[None, :]] = logits.transpose(0, 2, 1)
    return out, smallest


def learn_logits_rows(oracle, c, V, scale, tokens, rng, report, *, causal: bool, sketch: bool = True):
    """Every ``W_h`` and ``u_h`` from every-position answers (module docstring); ``tokens`` m directions per
    sequence. Returns ``W, u``, the smallest attention weight read, the heads' ranks
    (None when measured whole) and the number of sequences asked."""
    from attnprobe.learners.head.probes import random_orthogonal

    H, d = V.shape[0], V.shape[-1]
    O = random_orthogonal(d, rng)  # token directions (rows)
    seqs, L, use_sketch = logits_sequences(d, H, tokens, causal, sketch)
    asked = []
    batch = 64
    for k0 in range(0, len(seqs), batch):
        chunk = seqs[k0:k0 + batch]
        for n in sorted({len(s) for s in chunk}):  # one batch shares N
            group = np.stack([s for s in chunk if len(s) == n])
            Ts = np.where((group >= 0)[:, :, None], scale * O[np.maximum(group, 0)], 0.0)
            asked.append((group, Ts, oracle.answer_rows(Ts)))
        report()
    W, u, smallest, ranks = _read_heads(asked, c, V, O, scale, L if use_sketch else None, causal)
    return W, u, smallest, ranks, len(seqs)


def logits_sequences(d: int, H: int, tokens: int, causal: bool, sketch: bool = True):
    """The token index lists of the every-position logits stage (:func:`block_sequences`), the sketch's L and
    whether the sketch is used: blocks of ``m // 2`` basis directions paired; with the sketch only the pairs
    meeting the first ``L = d/H + SKETCH_MARGIN`` directions."""
    m = max(2, int(tokens))
    half = m // 2
    L = min(d, -(-d // H) + SKETCH_MARGIN)
    L = min(d, -(-L // half) * half)  # whole blocks
    low = [np.arange(i, min(L, i + half)) for i in range(0, L, half)]
    rest = [np.arange(i, min(d, i + half)) for i in range(L, d, half)]
    blocks = low + rest
    pairs = [(p, q) for p in range(len(blocks)) for q in range(p, len(blocks))]
    sketched = [(p, q) for p, q in pairs if p < len(low)]
    use_sketch = sketch and L < d and len(sketched) < len(pairs)
    return block_sequences(blocks, sketched if use_sketch else pairs, causal), L, use_sketch


def _read_heads(asked, c, V, O, scale, L, causal):
    """``W, u``, the smallest attention weight and the heads' ranks from the answers ``asked`` read with the value
    maps ``V`` (:func:`read_rows`); ``L``: the sketch's directions (None: every ``W_h`` measured whole)."""
    H, d = V.shape[0], O.shape[0]
    Wsum, Wn = np.zeros((H, d, d)), np.zeros((d, d))  # Σ over readings of o_jᵀ W_h o_i s², as [h, j, i]
    usum, un = np.zeros((H, d)), np.zeros(d)  # Σ over readings of s·o_jᵀu_h
    smallest = 1.0
    for idx, Ts, Y in asked:
        for s, T, Yk in zip(idx, Ts, Y):
            lg, sm = read_rows(Yk, c, V, T, causal)
            smallest = min(smallest, sm)
            live = np.flatnonzero(s >= 0)
            zeros = np.flatnonzero(s < 0)
            qz = zeros[-1] if causal else zeros[0]  # the zero query's row sees every token
            u_seq = lg[:, qz, live]  # (H, m)
            usum[:, s[live]] += u_seq
            un[s[live]] += 1
            for i in live:
                sees = ~np.isnan(lg[0, i, live])
                seen = live[sees]
                # less this sequence's own u reading: the value maps' error moves both alike
                Wsum[:, s[seen], s[i]] += lg[:, i, seen] - u_seq[:, sees]
                Wn[s[seen], s[i]] += 1
    if not un.all():
        raise RecoveryError("the every-position sequences did not reach every direction")  # pragma: no cover
    u = (usum / un) @ O / scale  # s·o_jᵀu_h → u_h, every reading averaged
    with np.errstate(invalid="ignore", divide="ignore"):  # (NaN: entries the sketch does not read)
        Wb = np.where(Wn > 0, Wsum / Wn, np.nan) / scale**2  # o_jᵀ W_h o_i, [h, j, i], every reading averaged
    if L is None:
        return np.matmul(np.matmul(O.T, Wb), O), u, smallest, None
    cols = Wb[:, :, :L]  # W_h o_i for i in L, in the basis O
    ranks = [gap_rank(np.linalg.svd(Ch, compute_uv=False), L) for Ch in cols]
    if max(ranks) > L - SKETCH_MARGIN:
        raise RecoveryError(f"a head's W_h has rank {max(ranks)} near the sketch's {L} directions: measure it "
                            "whole (sketch=False)")
    W = np.empty((H, d, d))
    for h in range(H):
        Qh = np.linalg.svd(cols[h], full_matrices=False)[0][:, :ranks[h]]
        Wbh = Qh @ np.linalg.lstsq(Qh[:L], Wb[h, :L, :], rcond=None)[0]
        W[h] = O.T @ Wbh @ O
    return W, u, smallest, ranks
