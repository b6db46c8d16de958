"""Conjugate gradients (Hestenes–Stiefel), optionally preconditioned: the inner solver of the Gauss–Newton and
Levenberg–Marquardt fits (the positional polishes, the row logits, the reduced logit matrices), on numpy arrays or
torch tensors of any shape (the unknowns as one array; inner products over every entry)."""

from __future__ import annotations


def _dot(a, b) -> float:
    return float((a * b).sum())


def conjugate_gradients(apply, b, steps: int, *, x=None, precondition=None, rtol: float = 1e-10):
    """An approximate solution of ``apply(x) = b`` (``apply`` symmetric positive semi-definite) from ``x`` (default
    zero) after at most ``steps`` products, preconditioned by ``precondition`` (symmetric positive definite;
    default none). Stops early once ``‖r‖ ≤ rtol·‖b‖`` or at a direction without positive curvature (the last
    iterate is returned, never a division by zero)."""
    r = b * 1 if x is None else b - apply(x)
    x = b * 0 if x is None else x
    z = r if precondition is None else precondition(r)
    p, rz = z, _dot(r, z)
    bound = rtol * _dot(b, b) ** 0.5
    for _ in range(steps):
        if _dot(r, r) ** 0.5 <= bound:
            break
        Ap = apply(p)
        pAp = _dot(p, Ap)
        if not pAp > 0:
            break
        a = rz / pAp
        x = x + a * p
        r = r - a * Ap
        z = r if precondition is None else precondition(r)
        rz, old = _dot(r, z), rz
        p = z + (rz / old) * p
    return x
