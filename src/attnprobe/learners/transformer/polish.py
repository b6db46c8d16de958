"""Joint refinement of a learned transformer's attention: Gauss–Newton / Levenberg–Marquardt on ``W_h``, ``u_h``
and the value maps ``V_h`` against fresh answers, with the model's exact Jacobian (transformer learner, last step).

The region stages measure each head's scores ``p_h(y) = W_h y + u_h`` one region at a time and reach 1e-9–1e-8;
every other parameter (the FFN, the maps) is already ~1e-10. With the FFN region of every sample fixed,
``TF(X) = G_nᵀ a(X) + κ_n`` (``G_n = A diag(1[pre > 0]) w_o``) and

    ∂TF/∂W_h[δ] = G_nᵀ V_h Xᵀ(diag α_h − α_hα_hᵀ)X δ x_N,   ∂TF/∂u_h[δ] = G_nᵀ V_h Xᵀ(diag α_h − α_hα_hᵀ)X δ,
    ∂TF/∂V_h[δ] = G_nᵀ δ Xᵀα_h

(the softmax Jacobian of Sec. 3's ``f``). The Jacobian is never formed: LSQR solves each step through its products
with vectors, so memory stays O(n·H·K·d) for ``n`` sequences. Steps are damped (Levenberg–Marquardt) when the
plain Gauss–Newton step does not lower the residual; the refinement stops when a step gains less than a factor
2 or the residual reaches the answers' rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.sparse.linalg import LinearOperator, lsqr

from attnprobe.errors import ConfigError
from attnprobe.models.softmax import softmax_last

#: sequences per polished number over K answers each: n·K ≈ OVERSAMPLE·(unknowns polished)
OVERSAMPLE = 2.0
#: share of the sequences held out: a step is kept only when it lowers their residual too (no overfitting)
VALIDATION = 0.2
#: a step must divide the residual by at least this to be followed by another one
MIN_GAIN = 2.0
#: "auto" polishes every parameter when the scores alone leave a relative residual above this (the grid's target
#: is a function error of 1e-8 on sequences of every length 1–16, about the residual on lengths 2–8)
ESCALATE = 3e-9
#: LSQR iterations per step at most, per level (an inexact step is followed by another: at d = 32, H = 6 the
#: scores gain as much from 60 iterations as from 400, in a seventh of the time; every parameter at once needs
#: more: a bias-free d = 32, m = 64 FFN learned to 5e-8 came to 1.8e-8 in two steps of 120, 6.2e-9 of 400)
ITERATIONS = {"scores": 60, "all": 400}
#: samples with a neuron this close (relative) to its kink are left out (their FFN region may change in a step)
KINK = 1e-6


@dataclass(frozen=True)
class PolishReport:
    """RMS residual on the held-out sequences (relative to the answers' spread) before and after, steps taken,
    sequences used (fit and held out)."""

    before: float
    after: float
    steps: int
    sequences: int
    kept: bool
    iterations: tuple = ()  # LSQR iterations of each step's accepted solve

    def as_dict(self) -> dict:
        return {"before": self.before, "after": self.after, "steps": self.steps, "sequences": self.sequences,
                "kept": self.kept, "lsqr_iterations": list(self.iterations)}


#: sequence lengths of each level, in equal shares (a neuron may switch on only for some lengths: length 4 alone
#: left one 1e-8 off at lengths 1, 2 and 8 while fitting length 4 to 1e-16)
LENGTHS = {"scores": (2, 4, 8), "all": (1, 2, 4, 8)}
#: parameter groups of each polish level: the attention scores, with the value maps, with the FFN too
LEVELS = {"scores": ("W", "u"), "values": ("W", "u", "v"), "all": ("W", "u", "v", "A", "b", "w_o", "c")}


def polished_numbers(model, level: str = "scores") -> int:
    """How many numbers the polish of ``level`` adjusts."""
    H, d, m, K = model.H, model.d, model.m, model.K
    sizes = {"W": H * d * d, "u": H * d, "v": H * d * d, "A": d * m, "b": m, "w_o": m * K, "c": K}
    return sum(sizes[g] for g in LEVELS[level])


def equations_per_sequence(model, length: int) -> int:
    """Independent equations one answer gives at most: K outputs, but through ``G_n`` of rank ≤ the active
    neurons (about m/2) and softmax Jacobians of rank ≤ length − 1 per head."""
    return max(1, min(model.K, max(1, model.m // 2), (length - 1) * model.H))


def polish_sequences(model, level: str = "scores") -> int:
    """How many sequences :func:`polish_attention` uses (over all its lengths): ``OVERSAMPLE`` equations per
    polished number in the fit, plus a held-out ``VALIDATION`` share that judges every step."""
    per = np.mean([equations_per_sequence(model, N) for N in LENGTHS[level]])
    fit = OVERSAMPLE * polished_numbers(model, level) / per
    k = len(LENGTHS[level])
    return k * int(np.ceil((fit / (1 - VALIDATION) + 32) / k))


class _Linearised:
    """The model's residual and its Jacobian's products at fixed FFN regions, on sequences X of one length."""

    def __init__(self, model, X, y, groups):
        self.model, self.X, self.y, self.groups = model, X, y, tuple(groups)
        n, N, d = X.shape
        H, K, m = model.H, model.K, model.m
        shapes = {"W": (H, d, d), "u": (H, d), "v": (H, d, d), "A": (d, m), "b": (m,), "w_o": (m, K), "c": (K,)}
        self.shapes = [shapes[g] for g in self.groups]
        self.size = sum(int(np.prod(s)) for s in self.shapes)
        s = np.einsum("nti,hij,nj->nht", X, model.W, X[:, -1]) + np.einsum("nti,hi->nht", X, model.u)
        alpha = softmax_last(s)  # (n, H, N)
        mixed = np.einsum("nht,nti->nhi", alpha, X)  # Xᵀα_h
        a = np.einsum("hij,nhj->ni", model.v, mixed) + (X[:, -1] if model.residual else 0.0)
        pre = a @ model.A + model.b
        fit = np.maximum(pre, 0) @ model.w_o + model.c
        self.residual = (np.reshape(y, (n, K)) - fit).reshape(n * K)
        self.keep = np.repeat(np.all(np.abs(pre) > KINK * np.abs(pre).max(), axis=1), K)
        on = (pre > 0).astype(float)
        Dw = on[:, :, None] * model.w_o[None]  # (n, m, K): diag(1[pre > 0]) w_o
        G = np.einsum("im,nmk->nki", model.A, Dw)  # (n, K, d): G_nᵀ
        GV = np.einsum("nki,hij->nhkj", G, model.v)  # G_nᵀV_h
        # G_nᵀV_h Xᵀ(diag α − ααᵀ)X = (G_nᵀV_h Xᵀ diag α) X − (G_nᵀV_h Xᵀα)(αᵀX)
        P = np.einsum("nhkj,ntj,nht->nhkt", GV, X, alpha)  # (n, H, K, N)
        self.R = np.einsum("nhkt,nti->nhki", P, X) - np.einsum("nhk,nhi->nhki", P.sum(axis=3), mixed)
        self.G, self.mixed, self.last, self.Dw, self.a, self.relu = G, mixed, X[:, -1], Dw, a, np.maximum(pre, 0)
        self.n, self.K = n, K

    def column_norms2(self):
        """‖J e_j‖² for every column."""
        sq = np.square
        w = self.keep.reshape(self.n, self.K)
        out = {"W": np.einsum("nhki,nj,nk->hij", sq(self.R), sq(self.last), w),
               "u": np.einsum("nhki,nk->hi", sq(self.R), w)}
        if "v" in self.groups:
            out["v"] = np.einsum("nki,nhj,nk->hij", sq(self.G), sq(self.mixed), w)
        if "A" in self.groups:
            out["A"] = np.einsum("ni,nmk,nk->im", sq(self.a), sq(self.Dw), w)
            out["b"] = np.einsum("nmk,nk->m", sq(self.Dw), w)
            out["w_o"] = np.einsum("nm,nk->mk", sq(self.relu), w)
            out["c"] = w.sum(axis=0)
        return np.concatenate([out[g].reshape(-1) for g in self.groups])

    def split(self, theta):
        out, i = {}, 0
        for name, shape in zip(self.groups, self.shapes):
            k = int(np.prod(shape))
            out[name] = theta[i:i + k].reshape(shape)
            i += k
        return out

    def matvec(self, theta):
        p = self.split(np.asarray(theta).reshape(-1))
        H, d = p["u"].shape
        q = (self.last @ p["W"].reshape(H * d, d).T).reshape(self.n, H, d) + p["u"][None]  # δW_h x_N + δu_h
        out = np.einsum("nhki,nhi->nk", self.R, q)
        if "v" in p:  # G_nᵀ Σ_h δV_h Xᵀα_h
            out += np.einsum("nki,ni->nk", self.G, self.mixed.reshape(self.n, -1) @ p["v"].transpose(0, 2, 1)
                             .reshape(H * d, d))
        if "A" in p:
            out += np.einsum("nmk,nm->nk", self.Dw, self.a @ p["A"] + p["b"])
            out += self.relu @ p["w_o"] + p["c"]
        return out.reshape(-1) * self.keep

    def rmatvec(self, r):
        r = (np.asarray(r).reshape(-1) * self.keep).reshape(self.n, self.K)
        Rr = np.einsum("nhki,nk->nhi", self.R, r)  # (n, H, d)
        H, d = Rr.shape[1:]
        out = {"W": np.tensordot(Rr, self.last, axes=(0, 0)), "u": Rr.sum(axis=0)}
        if "v" in self.groups:
            Gr = np.einsum("nki,nk->ni", self.G, r)
            out["v"] = (Gr.T @ self.mixed.reshape(self.n, H * d)).reshape(d, H, d).transpose(1, 0, 2)
        if "A" in self.groups:
            Dr = np.einsum("nmk,nk->nm", self.Dw, r)
            out["A"], out["b"] = self.a.T @ Dr, Dr.sum(axis=0)
            out["w_o"], out["c"] = self.relu.T @ r, r.sum(axis=0)
        return np.concatenate([out[g].reshape(-1) for g in self.groups])

    def step(self, theta):
        p = self.split(theta)
        return replace(self.model, **{g: getattr(self.model, g) + p[g] for g in self.groups})


class Stacked:
    """The Jacobians of several sequence lengths stacked, columns equilibrated: LSQR runs on ``J·diag(scale)``
    (a column no sequence moves, e.g. a neuron never on, is frozen at scale 0)."""

    def __init__(self, model, blocks, groups):
        self.parts = [_Linearised(model, X, y, groups) for X, y in blocks]
        norms = np.sqrt(sum(p.column_norms2() for p in self.parts))
        live = norms > 1e-12 * norms.max()
        self.scale = np.where(live, 1.0 / np.where(live, norms, 1.0), 0.0)
        self.size = self.parts[0].size
        self.rows = [p.n * p.K for p in self.parts]
        self.residual = np.concatenate([p.residual * p.keep for p in self.parts])

    def matvec(self, theta):
        t = np.asarray(theta).reshape(-1) * self.scale
        return np.concatenate([p.matvec(t) for p in self.parts])

    def rmatvec(self, r):
        pieces = np.split(np.asarray(r).reshape(-1), np.cumsum(self.rows)[:-1])
        return sum(p.rmatvec(x) for p, x in zip(self.parts, pieces)) * self.scale

    def operator(self) -> LinearOperator:
        return LinearOperator((sum(self.rows), self.size), matvec=self.matvec, rmatvec=self.rmatvec,
                              dtype=np.float64)

    def step(self, theta):
        return self.parts[0].step(theta * self.scale)


def _rms(model, blocks, scale) -> float:
    sq = sum(float(np.sum((y - model(X).reshape(y.shape)) ** 2)) for X, y in blocks)
    return float(np.sqrt(sq / max(sum(y.size for _, y in blocks), 1))) / scale


def polish_attention(oracle, model, rng, *, level: str = "scores", held=None, max_steps: int = 8,
                     floor: float | None = None):
    """Refine the parameters of ``LEVELS[level]`` of ``model`` on ``polish_sequences(model, level)`` N(0, I)
    sequences of the lengths ``LENGTHS[level]`` (module docstring); ``held``: ``{length: (X, y)}`` already answered,
    reused (only the rest is asked). ``floor``: the relative residual the answers' rounding allows (default
    ``16·oracle.eps``). Returns ``(model, PolishReport, held)``; the model is the input one unless the refinement
    lowered the residual of the held-out sequences."""
    lengths = LENGTHS[level]
    per = polish_sequences(model, level) // len(lengths)
    held = dict(held or {})
    for N in lengths:
        X0, y0 = held.get(N, (np.zeros((0, N, model.d)), np.zeros((0, model.K))))
        Xn = rng.standard_normal((max(per - len(X0), 0), N, model.d))
        yn = np.asarray(oracle(Xn), dtype=np.float64).reshape(len(Xn), model.K) if len(Xn) else y0[:0]
        held[N] = (np.concatenate([X0, Xn]), np.concatenate([y0, yn]))
    blocks = [held[N] for N in lengths]
    scale = float(np.std(np.concatenate([y for _, y in blocks]))) or 1.0
    every = int(round(1 / VALIDATION))  # every fifth sequence of each length is held out
    fit = [(X[np.arange(len(X)) % every != 0], y[np.arange(len(X)) % every != 0]) for X, y in blocks]
    val = [(X[::every], y[::every]) for X, y in blocks]
    floor = 16 * float(oracle.eps) if floor is None else float(floor)
    best = model
    best_fit, best_val = _rms(model, fit, scale), _rms(model, val, scale)
    before = best_val
    steps, iterations = 0, []
    while steps < max_steps and best_val > floor:
        lin = Stacked(best, fit, LEVELS[level])
        op = lin.operator()
        damp, better = 0.0, None
        for _ in range(4):  # Gauss–Newton, then Levenberg–Marquardt damping if the step overshoots
            out = lsqr(op, lin.residual, damp=damp, atol=1e-15, btol=1e-15, iter_lim=ITERATIONS[level])
            cand = lin.step(out[0])
            rf, rv = _rms(cand, fit, scale), _rms(cand, val, scale)
            if rf < best_fit and rv < best_val:
                better = (cand, rf, rv)
                break
            damp = 1e-4 * out[5] if damp == 0 else 10 * damp  # out[5]: LSQR's estimate of ‖J‖_F
        iterations.append(int(out[2]))
        if better is None:
            break
        gain = best_val / better[2]
        best, best_fit, best_val = better
        steps += 1
        if gain < MIN_GAIN:
            break
    n = sum(len(X) for X, _ in blocks)
    return best, PolishReport(before, best_val, steps, n, best is not model, tuple(iterations)), held


#: what :func:`refine` accepts
HOW = ("auto", "scores", "all", "none")


def check_how(how) -> None:
    if how not in HOW:
        raise ConfigError(f"polish must be one of {', '.join(HOW)}; got {how!r}", param="polish")


def refine(oracle, model, rng, how: str = "auto", *, reserve: int = 0):
    """The transformer learner's last step: ``how`` = ``"scores"`` (W_h, u_h), ``"all"`` (every parameter, after
    the scores), ``"auto"`` (the scores, then everything when the residual is still above ``ESCALATE``) or
    ``"none"``. A level whose sequences do not fit in the budget (less ``reserve`` for the check) is skipped.
    Returns ``(model, [PolishReport as dict, with its level, ...])``."""
    check_how(how)
    reports, held = [], None
    budget = oracle.budget

    def fits(level):
        return budget is None or oracle.remaining - reserve >= polish_sequences(model, level) - (
            0 if held is None else sum(len(X) for X, _ in held.values()))

    if how == "none":
        return model, reports
    if fits("scores"):
        model, rep, held = polish_attention(oracle, model, rng, level="scores")
        reports.append({"level": "scores", **rep.as_dict()})
    if (how == "all" or (how == "auto" and (not reports or reports[-1]["after"] > ESCALATE))) and fits("all"):
        model, rep, held = polish_attention(oracle, model, rng, level="all", held=held)
        reports.append({"level": "all", **rep.as_dict()})
    return model, reports
