"""The gauge of a RoPE layer: heads that share keys and values (GQA), written with one key and value map per group.

Under RoPE a head's score is ``s·q_hᵀ R(δ) k``; a scaled rotation ``S`` of each frequency pair commutes with
``R(δ)``, so ``(W_Q,h, W_K,h) → (Sᵀ W_Q,h, S⁻¹ W_K,h)`` changes nothing (docs/positional.md, "What the answers
identify"). A learner that returns independent heads gives the heads of one KV group keys that agree only up to such
an ``S`` per pair (and values up to an invertible ``T``: ``V_h = W_O,h W_V,h``). :func:`share_kv` finds them and
writes the group's keys and values once: ``W_K,g`` = the first head's, ``W_Q,h ← S_hᵀ W_Q,h`` with
``W_K,h ≈ S_h W_K,g``; ``W_V,g`` = the first head's, ``W_O,h ← W_O,h T_h`` with ``W_V,h ≈ T_h W_V,g``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.models.positional import PositionalAttention, rotation_pairs


def pair_similarity(ref: np.ndarray, other: np.ndarray, pairs) -> np.ndarray:
    """The per-pair scaled rotation ``S`` (d_h × d_h, a block ``[[a, −b], [b, a]]`` on each pair's coordinates,
    the identity elsewhere) with ``other ≈ S ref`` in least squares (rows: the head's coordinates)."""
    dh = ref.shape[0]
    S = np.eye(dh)
    for i, j in zip(*pairs):
        r_i, r_j, o_i, o_j = ref[i], ref[j], other[i], other[j]
        # other_i = a r_i − b r_j, other_j = b r_i + a r_j: linear in (a, b)
        A = np.stack([np.concatenate([r_i, r_j]), np.concatenate([-r_j, r_i])], axis=1)
        a, b = np.linalg.lstsq(A, np.concatenate([o_i, o_j]), rcond=None)[0]
        S[i, i], S[i, j], S[j, i], S[j, j] = a, -b, b, a
    return S


def kv_groups(model: PositionalAttention, groups: int, tol: float = 1e-6) -> list[int]:
    """A group label per head: heads whose key row spaces and value row spaces agree to ``tol`` (relative) share a
    label; refused unless there are ``groups`` labels of equal size."""
    H = model.H

    def same(A, B):
        Qa = np.linalg.qr(A.T)[0]
        return np.linalg.norm(B.T - Qa @ (Qa.T @ B.T)) <= tol * np.linalg.norm(B)

    Wk = [model.Wk[model.group(h)] for h in range(H)]
    Wv = [model.Wv[model.group(h)] for h in range(H)]
    labels = [-1] * H
    nxt = 0
    for h in range(H):
        if labels[h] < 0:
            labels[h] = nxt
            for g in range(h + 1, H):
                if labels[g] < 0 and same(Wk[h], Wk[g]) and same(Wv[h], Wv[g]):
                    labels[g] = nxt
            nxt += 1
    sizes = np.bincount(labels)
    if nxt != groups or len(set(sizes.tolist())) != 1:
        raise ConfigError(f"the recovered heads fall into key/value groups of sizes {sizes.tolist()}, not {groups} "
                          f"equal groups of {H // groups} (the folder's GQA layout)", param="groups")
    return labels


def share_kv(model: PositionalAttention, groups: int, tol: float = 1e-6) -> tuple[PositionalAttention, float]:
    """``model`` (RoPE, full rotary) with heads reordered group by group (head h in group ``h // (H/G)``, as
    Hugging Face lays them out) and one key and value map per group (module docstring). Returns the model and the
    largest relative misfit of a head's keys or values to its group's (the learner's error between heads)."""
    if model.position != "rope" or model.rotary_dim != model.head_dim:
        raise ConfigError("sharing keys and values in the RoPE gauge needs a fully rotary layer", param="position")
    labels = kv_groups(model, groups, tol)
    order = [h for g in range(groups) for h in range(model.H) if labels[h] == g]
    pairs = rotation_pairs(model.rotary_dim, model.layout)
    H, dv = model.H, model.Wv.shape[1]
    WO = model.Wo.reshape(model.outputs, H, dv)
    Wq, bq, Wo, Wk, bk, Wv, bv = [], [], [], [], [], [], []
    misfit = 0.0

    def kv(h):
        g = model.group(h)
        return (np.concatenate([model.Wk[g], model.bk[g][:, None]], axis=1),
                np.concatenate([model.Wv[g], model.bv[g][:, None]], axis=1))

    for g in range(groups):
        heads = order[g * (H // groups):(g + 1) * (H // groups)]
        Kr, Vr = kv(heads[0])
        S = {h: pair_similarity(Kr, kv(h)[0], pairs) for h in heads}
        T = {h: kv(h)[1] @ np.linalg.pinv(Vr) for h in heads}
        for h in heads:
            Kh, Vh = kv(h)
            misfit = max(misfit, float(np.linalg.norm(S[h] @ Kr - Kh) / np.linalg.norm(Kh)),
                         float(np.linalg.norm(T[h] @ Vr - Vh) / max(np.linalg.norm(Vh), 1e-300)))
        # the group's keys and values: every head's, brought into the first head's gauge, averaged
        Kg = np.mean([np.linalg.solve(S[h], kv(h)[0]) for h in heads], axis=0)
        Vg = np.mean([np.linalg.pinv(T[h]) @ kv(h)[1] for h in heads], axis=0)
        Wk.append(Kg[:, :-1])
        bk.append(Kg[:, -1])
        Wv.append(Vg[:, :-1])
        bv.append(Vg[:, -1])
        for h in heads:
            Wq.append(_refit_query(model, h, Kg[:, :-1], S[h]))
            bq.append(S[h].T @ model.bq[h])
            Wo.append(WO[:, h] @ kv(h)[1] @ np.linalg.pinv(Vg))  # W_O,h W_V,h = (W_O,h W_V,h W_V,g⁺) W_V,g
    out = PositionalAttention(np.array(Wq), np.array(Wk), np.array(Wv), np.concatenate(Wo, axis=1), np.array(bq),
                              np.array(bk), np.array(bv), model.bo, position="rope", inv_freq=model.inv_freq,
                              rotary_dim=model.rotary_dim, layout=model.layout, scale=model.scale,
                              causal=model.causal, dtype=model.dtype)
    return out, misfit


#: offsets at which a head's logit matrices are matched when its query map is refitted to its group's keys
REFIT_OFFSETS = (0, -1, -2, -4, -8, -16, -64, -256)


def _refit_query(model: PositionalAttention, h: int, Kg: np.ndarray, S: np.ndarray) -> np.ndarray:
    """Head ``h``'s query map against its group's keys ``Kg``: least squares on ``W_Q'ᵀ R(δ) Kg = W_Q,hᵀ R(δ)
    W_K,h`` over :data:`REFIT_OFFSETS` (the head's own logit matrices; ``Sᵀ W_Q,h`` when the keys agree exactly)."""
    from attnprobe.models.positional import rotation_matrix

    Kh = model.Wk[model.group(h)]
    rows, rhs = [], []
    for delta in REFIT_OFFSETS:
        R = rotation_matrix(delta, model.inv_freq, model.head_dim, model.layout, model.rotary_dim)
        rows.append(Kg.T @ R.T)  # (d, d_h): Kgᵀ R(δ)ᵀ W_Q' = (W_Q,hᵀ R(δ) W_K,h)ᵀ
        rhs.append(Kh.T @ R.T @ model.Wq[h])
    return np.linalg.lstsq(np.concatenate(rows), np.concatenate(rhs), rcond=None)[0]


def balanced(model: PositionalAttention, *, keys: bool = True, values: bool = True) -> PositionalAttention:
    """The same function with each gauge scale balanced: per key group and frequency pair (each coordinate past the
    rotary ones alone, and every coordinate without RoPE) the queries' and keys' rows scaled by ``1/c`` and ``c``
    to equal norms (a scalar commutes with the rotation), and per group ``W_V,g`` and its heads' columns of ``W_O``
    scaled to equal norms. A start whose pairs are unbalanced (the coarse route's logit maps take a random member
    of the rotations' commutant: query/key ratios 0.08 … 3.6 at d = 32) makes the polish's Jacobian ill-conditioned
    in ways the per-array scaling of its conjugate gradients cannot undo. ``keys``/``values``: balance the
    queries and keys / the values and outputs (False holds those arrays as they are)."""
    H, G, dh = model.H, model.G, model.head_dim
    per = H // G
    if model.position == "rope":
        a, b = rotation_pairs(model.rotary_dim, model.layout)
        blocks = [[int(i), int(j)] for i, j in zip(a, b)] + [[i] for i in range(model.rotary_dim, dh)]
    else:
        blocks = [[i] for i in range(dh)]
    Wq, Wk, bq, bk = (np.array(x) for x in (model.Wq, model.Wk, model.bq, model.bk))
    Wv, Wo, bv = np.array(model.Wv), np.array(model.Wo), np.array(model.bv)
    dv = Wv.shape[1]
    for g in range(G):
        heads = slice(g * per, (g + 1) * per)
        for rows in blocks if keys else ():
            nq = np.sqrt(np.sum(Wq[heads][:, rows] ** 2) / per + np.sum(bq[heads][:, rows] ** 2) / per)
            nk = np.sqrt(np.sum(Wk[g, rows] ** 2) + np.sum(bk[g, rows] ** 2))
            if nq > 0 and nk > 0:
                c = np.sqrt(nq / nk)
                Wk[g, rows] *= c
                bk[g, rows] *= c
                Wq[heads, rows] /= c
                bq[heads, rows] /= c
        cols = slice(g * per * dv, (g + 1) * per * dv)
        no = np.sqrt(np.sum(Wo[:, cols] ** 2) / per)
        nv = np.sqrt(np.sum(Wv[g] ** 2) + np.sum(bv[g] ** 2))
        if values and no > 0 and nv > 0:
            c = np.sqrt(no / nv)
            Wv[g] *= c
            bv[g] *= c
            Wo[:, cols] /= c
    return replace(model, Wq=Wq, Wk=Wk, bq=bq, bk=bk, Wv=Wv, Wo=Wo, bv=bv)
