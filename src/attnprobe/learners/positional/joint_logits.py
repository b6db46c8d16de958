"""Every head's logit maps from coarse log-weights by one joint fit (docs/positional.md, "bfloat16 answers: the
logit maps by one joint fit").

Each head's log-weight of a key ``x_j`` at offset ``δ_j`` against a zero key is ``ℓ_hj = (W_Q,h z)ᵀ R(δ_j) W_K,g x_j``
(:func:`~.logit_samples.log_weights`; ``g`` the head's key/value group, the query ``z`` itself at offset 0). Instead
of one linear regression per fixed query and offset (d unknowns each, :func:`~.coarse.logit_maps`), every head's
``W_Q`` and each group's shared ``W_K`` are fitted at once to the log-weights of fully random sequences (weighted by
:func:`~.logit_samples.reliability`), by L-BFGS from a small random start: a bilinear least-squares problem with
Gaussian measurements, whose minimiser the fit reaches from a random start as low-rank matrix sensing does. Heads
sharing keys share values too (GQA), so the groups are read from the value maps' row spaces (:func:`key_groups`).
"""

from __future__ import annotations

import math

import numpy as np

from attnprobe.learners.positional.logit_samples import LOGIT_OFFSETS, kept_offsets, log_weights, reliability
from attnprobe.models.positional import rotation_matrix

#: each head's log-weights per unknown of its own (:func:`joint_sequences`): d = 32, 2/1 heads, bfloat16 answers,
#: the module's value maps: 1,000 sequences (≈ 10) read the row spaces 0.03 … 0.06 off, 4,000 (≈ 40) 0.016 … 0.023
#: (benchmarks/research/bfloat16_joint_logits.py)
NUMBERS_PER_UNKNOWN = 40
#: L-BFGS rounds of ``ITERATIONS`` steps each, stopped early when a round lowers the misfit by less than ``STALL``
ROUNDS, ITERATIONS, STALL = 6, 50, 1e-3
#: two heads share a key/value group when their value maps' row spaces overlap this much (mean squared cosine of
#: the principal angles: 1 for a shared ``W_V``, ~d_h/d for independent ones)
GROUP_OVERLAP = 0.5


def key_groups(G: np.ndarray) -> np.ndarray:
    """Each head's key/value group (H,) from its value map's input rows ``G_h`` (H, d_h, d): heads sharing ``W_V``
    (GQA) share its row space, and their keys. Groups of unequal sizes are not GQA: then each head is its own."""
    H, dh, _ = G.shape
    bases = [np.linalg.svd(G[h], full_matrices=False)[2] for h in range(H)]
    label = -np.ones(H, dtype=int)
    for h in range(H):
        if label[h] < 0:
            label[h] = label.max() + 1
            for o in range(h + 1, H):
                if label[o] < 0 and np.linalg.norm(bases[h] @ bases[o].T) ** 2 / dh > GROUP_OVERLAP:
                    label[o] = label[h]
    sizes = np.bincount(label)
    return label if np.all(sizes == sizes[0]) else np.arange(H)


def joint_sequences(d: int, dh: int, *, per: int = NUMBERS_PER_UNKNOWN) -> int:
    """Random logit sequences :func:`joint_logit_maps` asks: ``per`` of each head's log-weights (one a kept offset
    and the query) for each of its ``2·d_h·d`` unknowns (``W_Q`` and a ``W_K`` of its own; shared keys gain more)."""
    m = len(kept_offsets(LOGIT_OFFSETS, dh))
    return math.ceil(per * 2 * dh * d / (m + 1))


def joint_logit_maps(oracle, rng: np.random.Generator, Cb, G, c, theta, rho: float, *, per: int = NUMBERS_PER_UNKNOWN):
    """Every head's ``W_Q``, ``W_K`` (H, d_h, d) (``W_K`` shared within each group of :func:`key_groups`) fitted
    jointly to the log-weights of :func:`joint_sequences` random sequences (entries N(0, ρ²)); returns them, the
    groups and the sequences asked."""
    d = oracle.d
    H, dh = G.shape[:2]
    offs = np.array(kept_offsets(LOGIT_OFFSETS, dh))
    groups = key_groups(G)
    S = joint_sequences(d, dh, per=per)
    toks = as_served(oracle, rng.standard_normal((S, len(offs) + 1, d)) * rho)
    ell = log_weights(oracle, Cb, G, c, toks, np.tile(offs, (S, 1)), int(-offs.min()))
    Wq, Wk = fit_logit_maps(toks, offs, ell, theta, groups, rng)
    return Wq, Wk[groups], groups, S


def as_served(oracle, X: np.ndarray) -> np.ndarray:
    """``X`` rounded to bfloat16 when the answers are (a bfloat16 layer rounds its inputs: the fit then sees the
    tokens it was given)."""
    if oracle.precision != "bfloat16":
        return X
    import ml_dtypes

    return X.astype(ml_dtypes.bfloat16).astype(np.float64)


def fit_logit_maps(toks, offs, ell, theta, groups, rng, *, rounds: int = ROUNDS, iterations: int = ITERATIONS):
    """``W_Q`` (H, d_h, d) and one ``W_K`` per group (G, d_h, d) minimising ``Σ w² (ℓ_hj − (W_Q,h z)ᵀ R(δ_j)
    W_K,g(h) x_j)²`` over the finite log-weights ``ell`` (S, H, T+1) of ``toks`` (S, T+1, d) (keys at ``offs``, the
    query last at offset 0), ``w`` their reliability; L-BFGS from a random start of the logits' size."""
    import torch

    S, T1, d = toks.shape
    H = ell.shape[1]
    dh = len(theta) * 2
    G = int(groups.max()) + 1
    R = torch.tensor(np.stack([rotation_matrix(float(o), theta, dh) for o in np.append(offs, 0)]))
    X = torch.tensor(toks)
    ok = np.isfinite(ell)
    y = torch.tensor(np.where(ok, ell, 0.0))
    w = torch.tensor(np.where(ok, reliability(np.where(ok, ell, 0.0)), 0.0))
    member = torch.tensor(groups)
    scale = 1.0 / math.sqrt(d * float(np.mean(toks ** 2)))  # start logits of the data's size, random directions
    wq = torch.nn.Parameter(torch.tensor(rng.standard_normal((H, dh, d)) * scale))
    wk = torch.nn.Parameter(torch.tensor(rng.standard_normal((G, dh, d)) * scale))
    opt = torch.optim.LBFGS([wq, wk], lr=1, max_iter=iterations, history_size=50, tolerance_grad=1e-12,
                            tolerance_change=1e-15, line_search_fn="strong_wolfe")
    total = float((w ** 2).sum())

    def misfit():
        opt.zero_grad()
        q = torch.einsum("hkd,sd->shk", wq, X[:, -1])
        k = torch.einsum("tab,gbd,std->sgta", R, wk, X)[:, member]  # (S, H, T+1, d_h)
        loss = ((w * (torch.einsum("shk,shtk->sht", q, k) - y)) ** 2).sum() / total
        loss.backward()
        return loss

    last = math.inf
    for _ in range(rounds):  # stop when a round gains less than STALL of the misfit
        now = float(opt.step(misfit))
        if now > (1 - STALL) * last or now < 1e-20:
            break
        last = now
    return wq.detach().numpy(), wk.detach().numpy()
