"""The sign of a slow rotation pair's sine part, tested by the row polish's misfit (docs/positional.md, "bfloat16
answers": where the d = 128 error sits).

In pair ``k`` of a key/value group the logit between offsets ``δ`` is ``q_kᵀ R(δ θ_k) k_k`` (rotate-half or interleaved
coordinates ``(a_k, b_k)``): reflecting the second coordinate of the group's ``W_K`` and of its heads' ``W_Q``
(``J = diag(1, −1)``, with their biases) gives ``q_kᵀ J R(δ θ_k) J k_k = q_kᵀ R(−δ θ_k) k_k``: the rotation runs
backwards. On rows of N tokens its sine part is at most ``sin(N θ_k)``; for the slowest pairs (LLaMA d_h = 16, base 1e4:
``θ = 1e-3, 3.2e-4``, angles 0.26 and 0.08 over 256 tokens) the logit fit can come out conjugated and the row polish
cannot turn it back: the sign is a discrete choice the continuous fit does not cross. Measured (d = 128, 8/2, bfloat16
rows, one group's lowest pair conjugated in the row-polished state): flipped and polished on 48 sequences the misfit
fell 1.04e-2 → 5.03e-3 and the function to 7.2e-3 over every length (the served layer itself 1.6e-2); unflipped, the
same rows' polish stalled at 7.59e-3. So the misfit chooses the sign without the truth: :func:`choose_pair_signs`
polishes each slow pair of each group conjugated in turn and keeps a flip that lowers it.
"""

from __future__ import annotations

import numpy as np

from attnprobe.models.positional import PositionalAttention, rotation_pairs

#: a pair is tested when its largest angle over the rows, ``N θ_k``, stays under this (radians): its sine part
#: under ~half its cosine part's
SLOW_ANGLE = 0.5
#: row-polish rounds a run of the test: the base, its control and each candidate
TEST_ROUNDS = 2
#: a flip is kept when its misfit is under the control's by this fraction (the research's gap: 33 %)
MARGIN = 0.02
#: at most this many candidates (groups × pairs): past it only each group's slowest pairs are tested (LLaMA-3's
#: d_h = 128 at base 5e5 has 33 slow pairs over 256 tokens, 264 candidates at 8 groups)
MAX_CANDIDATES = 8


def slow_pairs(model: PositionalAttention, length: int, most: int | None = None) -> list[int]:
    """The rotation pairs whose angle over ``length`` tokens, ``length · θ_k``, stays under :data:`SLOW_ANGLE`; at
    most ``most`` of them, the slowest."""
    if model.position != "rope":
        return []
    theta = np.abs(np.asarray(model.inv_freq))
    slow = [int(k) for k in np.argsort(theta) if theta[k] * length < SLOW_ANGLE]
    return sorted(slow[:most] if most is not None else slow)


def conjugated(model: PositionalAttention, group: int, pair: int) -> PositionalAttention:
    """``model`` with pair ``pair`` of key/value group ``group`` conjugated (module docstring): the pair's second
    coordinate negated in the group's ``W_K``, ``b_K`` and its heads' ``W_Q``, ``b_Q``."""
    from dataclasses import replace

    per = model.H // model.G
    b = int(rotation_pairs(model.rotary_dim, model.layout)[1][pair])
    heads = slice(group * per, (group + 1) * per)
    Wq, Wk, bq, bk = (np.array(x, dtype=np.float64) for x in (model.Wq, model.Wk, model.bq, model.bk))
    Wq[heads, b] *= -1
    bq[heads, b] *= -1
    Wk[group, b] *= -1
    bk[group, b] *= -1
    return replace(model, Wq=Wq, Wk=Wk, bq=bq, bk=bk)


def choose_pair_signs(model: PositionalAttention, data, *, polish_options: dict, log=None):
    """Each slow pair (:func:`slow_pairs` over the rows' length) of each key/value group conjugated in turn, greedily,
    on the same rows ``data`` (:func:`~.row_polish.polish_rows` with ``polish_options``, :data:`TEST_ROUNDS` rounds
    a run): the state is polished once (the base), then a candidate, the base with one pair conjugated, against the
    control, the base polished as many rounds again — the same rounds from the same state, so a flip wins on its
    sign, not on more polishing — kept when its misfit is under the control's by :data:`MARGIN` (it becomes the
    base). Returns the control of the last base (polished model) and a dict: the candidates' misfits, the flips
    kept."""
    from attnprobe.learners.positional.row_polish import polish_rows

    log = log or (lambda line: None)
    pairs = slow_pairs(model, max(X.shape[1] for X, _ in data), most=max(1, MAX_CANDIDATES // model.G))
    if not pairs:
        return model, {"pairs": [], "flipped": [], "tried": []}
    base = polish_rows(model, data, rounds=TEST_ROUNDS, **polish_options)[0]
    control, rep = polish_rows(base, data, rounds=TEST_ROUNDS, **polish_options)
    misfit, tried, flipped = rep.misfit_after, [], []
    log(f"pair signs: as fitted, misfit {misfit:.3e}; testing pairs {pairs} of {model.G} groups conjugated")
    for g in range(model.G):
        for k in pairs:
            candidate, rep = polish_rows(conjugated(base, g, k), data, rounds=TEST_ROUNDS, **polish_options)
            keep = rep.misfit_after < (1 - MARGIN) * misfit
            tried.append({"group": g, "pair": k, "misfit": rep.misfit_after, "against": misfit, "kept": bool(keep)})
            log(f"pair signs: group {g} pair {k} conjugated: misfit {rep.misfit_after:.3e} against {misfit:.3e}"
                + (" — kept" if keep else ""))
            if keep:
                base = candidate
                control, rep = polish_rows(base, data, rounds=TEST_ROUNDS, **polish_options)
                misfit = rep.misfit_after
                flipped.append([g, k])
    return control, {"pairs": pairs, "flipped": flipped, "tried": tried, "misfit": misfit}
