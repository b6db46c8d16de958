"""Multi-head extraction with known mutually orthogonal head subspaces (Prop. C.2).

Inputs whose rows lie in ``U_h`` see head h alone (``X v_g = 0`` for ``g ≠ h``), so each head is the single-head
problem of width ``d_h = dim U_h`` (:func:`~attnprobe.oracles.subspace.restrict_to_subspace`) and the exact
learner of Thm 4.1 recovers ``W̃_h, ṽ_h, ũ_h`` there; lifting back gives ``W_h = E_h W̃_h E_hᵀ`` etc. Every head
also reads the layer's shared ``c``. Queries: ``Σ_h (d_h² + 2d_h + 1)`` plus the exact learner's calibration
(≤ 2 %), far below ``4Hd² − 2H + 1``; heads are recovered in the order of the given subspaces.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError, RecoveryError, SaturationError
from attnprobe.learners.head.exact import extract_exact
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.core.skeleton import Run
from attnprobe.models.attention import AttentionHead
from attnprobe.models.multihead import MultiHeadAttention
from attnprobe.oracles.subspace import restrict_to_subspace

#: largest |E_gᵀE_h| (g ≠ h) accepted as "mutually orthogonal" for user-given subspaces
ORTHOGONALITY_TOL = 1e-8


def as_bases(subspaces, d: int) -> list[np.ndarray]:
    """Orthonormal bases ``(d, d_h)`` from an array ``(H, d, d_h)`` or a list of ``(d, d_h)`` arrays, checked
    to be orthonormal and mutually orthogonal (Assumption C.1)."""
    if isinstance(subspaces, np.ndarray) and subspaces.ndim == 3:
        bases = [subspaces[h] for h in range(subspaces.shape[0])]
    else:
        bases = [np.asarray(E, dtype=np.float64) for E in subspaces]
    if not bases:
        raise ConfigError("give at least one subspace", param="subspaces")
    for h, E in enumerate(bases):
        if E.ndim != 2 or E.shape[0] != d or not 1 <= E.shape[1] <= d:
            raise ConfigError(f"subspace {h} must be a (d, d_h) basis with d = {d}; got shape {E.shape}",
                              param="subspaces")
    E = np.concatenate(bases, axis=1).astype(np.float64)
    if E.shape[1] > d:
        raise ConfigError(f"the subspaces have total dimension {E.shape[1]} > d = {d}: they cannot be mutually "
                          "orthogonal", param="subspaces")
    gap = np.abs(E.T @ E - np.eye(E.shape[1])).max()
    if gap > ORTHOGONALITY_TOL:
        raise ConfigError(f"the subspace bases are not orthonormal and mutually orthogonal (max |EᵀE − I| = "
                          f"{gap:.1e}); Prop. C.2 needs orthogonal head subspaces. Orthonormalise each basis, and "
                          "leave subspaces out (the generic learner) when they are unknown", param="subspaces")
    return [np.asarray(B, dtype=np.float64) for B in bases]


#: RMS probe logit of the single-head learner inside a subspace: small logits keep every attention weight far
#: from 0 and 1, so the leakage of other heads through an estimated subspace is amplified least (measured:
#: 1.5 turned 2e-9 subspace errors into head errors up to 3e-7 and failures, 0.5 kept them below 2e-9)
SUBSPACE_TARGET_LOGIT = 0.5
#: probe draws per head inside an estimated subspace: the leakage can push an answer just outside the softmax
#: average (measured: 3 of 288 draws at logit 0.5), and fresh probes then succeed
ATTEMPTS = 3


def learn_heads_in_subspaces(oracle, bases, *, bias: bool = True, seed: int = 0, leakage: float | None = None,
                             target_logit: float = SUBSPACE_TARGET_LOGIT, progress=None
                             ) -> tuple[MultiHeadAttention, dict]:
    """Phase function: every head by the exact single-head learner inside its subspace (Prop. C.2).

    ``leakage``: relative size of what other heads add to answers inside an estimated subspace; the single-head
    learner then treats it as answer noise (its saturation and convexity tests).
    """
    heads, per_head, cs = [], [], []
    for h, E in enumerate(bases):
        for attempt in range(ATTEMPTS):
            sub = restrict_to_subspace(oracle, E, name=f"{oracle.name} in subspace {h}", eps=leakage)
            try:
                res = extract_exact(sub, bias=bias, seed=seed + h + 1000 * attempt, check=False,
                                    target_logit=target_logit)
                break
            except (RecoveryError, SaturationError):
                if attempt == ATTEMPTS - 1 or leakage is None:
                    raise
        m = res.model
        heads.append((E @ m.W @ E.T, E @ m.v, E @ m.u))
        cs.append(m.c)
        per_head.append(int(res.queries))
        if progress:
            progress(h + 1, len(bases))
    W, v, u = (np.stack([t[i] for t in heads]) for i in range(3))
    c = float(np.median(cs)) if bias else 0.0
    details = {"queries_per_head": per_head, "head_dims": [int(E.shape[1]) for E in bases],
               "c_spread": float(np.ptp(cs))}
    return MultiHeadAttention(W, v, u, c), details


def extract_multihead_subspaces(oracle, subspaces, *, bias: bool = True, seed: int = 0, check: bool = True,
                                progress=None) -> Extraction:
    """Recover every head of a layer whose heads live in the given mutually orthogonal subspaces (Prop. C.2),
    in the order of ``subspaces`` (``(H, d, d_h)`` or a list of ``(d, d_h)`` bases). One phase, ``heads``."""
    bases = as_bases(subspaces, oracle.d)
    oracle.expect_scalar("multi-head")  # (B, 1) answers read as (B,), also by the check on this oracle
    run = Run(oracle, "multihead-subspaces", seed=seed, check=check, progress=progress)
    planned = sum(AttentionHead.unknowns(E.shape[1], bias) for E in bases)
    run.plan(planned, f"multi-head extraction in {len(bases)} known subspaces ({planned} unknowns; calibration "
                      "may add 2 %)", at_least=True)
    with run.phase("heads"):
        model, details = learn_heads_in_subspaces(oracle, bases, bias=bias, seed=seed,
                                                  progress=lambda *_: run.report(planned))
    details["query_bound"] = MultiHeadAttention.query_bound(model.d, model.H)
    return run.finish(model, unknowns=planned - (len(bases) - 1) * int(bias), details=details,
                      hint=" (heads in the given mutually orthogonal subspaces, Prop. C.2)")


def load_subspaces(path, d: int) -> list:
    """Head subspace bases (Prop. C.2) from an ``.npz`` file: an array ``subspaces`` (or ``E``) of shape
    ``(H, d, d_h)``, or one ``(d, d_h)`` array per head (in file order). Read through the safe loader (a regular
    file, real numbers, headers checked before anything is decompressed) and refused above ``8·d²`` numbers
    (``Σ d_h ≤ d``) or when the file is a saved model."""
    from attnprobe.models.io import load_arrays

    arrays = load_arrays(path, max_bytes=8 * 8 * d * d + 4096, what="subspaces file")
    if "kind" in arrays:
        raise ConfigError(f"{path} is a saved {arrays['kind']} model, not head subspaces; give an .npz with an "
                          "(H, d, d_h) array named 'subspaces'", param="subspaces")
    for key in ("subspaces", "E"):
        if key in arrays:
            if arrays[key].ndim != 3:
                raise ConfigError(f"the {key!r} array of {path} has shape {arrays[key].shape}; it must be (H, d, d_h)",
                                  param="subspaces")
            return list(arrays[key])
    if not arrays:
        raise ConfigError(f"{path} holds no arrays; save an (H, d, d_h) array named 'subspaces'", param="subspaces")
    return list(arrays.values())
