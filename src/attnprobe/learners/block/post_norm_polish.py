"""The whole post-norm (BERT) block from its stages, then one joint polish on every-position answers (docs/block.md,
"Post-norm blocks", stages ``assemble`` and ``polish``).

:func:`assemble` puts the attention stage (:mod:`.post_norm_attention`: the attention up to the ones vector, whose
n1 input is ``x + A(x)``), the FFN stage (:func:`.post_norm_ffn.second_layer`: n1's weight, bias 0, and the FFN on
its output) and n2 (:func:`.post_norm.output_norm`) into a :class:`~attnprobe.models.block.TransformerBlock`
(``layout="post"``, LayerNorms; both ε BERT's 1e-12, which the stages do not read). :func:`polish_block` is
Gauss–Newton on every weight but n2's and the fixed gauges (n1's bias, the key and value biases), each step by
LSMR on the matrix-free Jacobian (``torch.func`` ``jvp``/``vjp``: one pass over the sequences each), the columns
scaled by a probed estimate of ``diag(JᵀJ)`` (Rademacher probes, ``E(Jᵀu)² = diag JᵀJ``); a step (or its half,
quarter, eighth) is kept only where the misfit falls. Each length's residuals are relative to that length's
largest ``|y − x|``, the norm the block check reads (:func:`.learner.every_position_check`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.sparse.linalg import LinearOperator, lsmr

from attnprobe.models.block import TransformerBlock
from attnprobe.models.positional import PositionalAttention
from attnprobe.models.smooth_ffn import SmoothFFN

#: both LayerNorms' ε (BERT's default; neither is read from the answers: docs/block.md)
EPS = 1e-12
#: lengths of the polish's sequences (cycled), up to the check's longest
LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: the arrays fitted, by the block's names (n1's bias, the key and value biases and n2 are held)
FITTED = ("Wq", "bq", "Wk", "Wv", "Wo", "bo", "norm1_w", "W1", "b1", "W2", "b2")
#: Rademacher probes of the column scaling; step fractions tried
PROBES, BACKTRACK = 16, (1.0, 0.5, 0.25, 0.125)


def assemble(attention: PositionalAttention, w1: np.ndarray, ffn: SmoothFFN, n2: tuple) -> TransformerBlock:
    """The post-norm block ``n2(h + F(h))``, ``h = n1(x + A(X))``, n1 = ``(w1, 0)``, n2 = ``n2``."""
    d = attention.d
    return TransformerBlock(attention, ffn, w1, n2[0], norm1_b=np.zeros(d), norm2_b=n2[1], norm="layer", eps=EPS,
                            layout="post")


def polish_data(answer_rows, d: int, rng, sequences: int) -> list:
    """``sequences`` N(0, 1) sequences, lengths cycled from :data:`LENGTHS`, and their answers at every position:
    a list of ``(X (B, N, d), Y (B, N, d))`` per length."""
    per = np.bincount(np.arange(sequences) % len(LENGTHS), minlength=len(LENGTHS))
    data = []
    for N, b in zip(LENGTHS, per):
        if b:
            X = rng.standard_normal((int(b), N, d))
            data.append((X, np.asarray(answer_rows(X), dtype=np.float64)))
    return data


def _arrays(block: TransformerBlock) -> dict:
    a, f = block.attention, block.ffn
    return {"Wq": a.Wq, "bq": a.bq, "Wk": a.Wk, "Wv": a.Wv, "Wo": a.Wo, "bo": a.bo, "norm1_w": block.norm1_w,
            "W1": f.W1, "b1": f.b1, "W2": f.W2, "b2": f.b2}


def _rebuild(block: TransformerBlock, p: dict) -> TransformerBlock:
    from dataclasses import replace

    a, f = block.attention, block.ffn
    att = PositionalAttention(p["Wq"], p["Wk"], p["Wv"], p["Wo"], bq=p["bq"], bk=a.bk, bv=a.bv, bo=p["bo"],
                              position="none", scale=a.scale, causal=a.causal)
    return replace(block, attention=att, ffn=SmoothFFN(p["W1"], p["b1"], p["W2"], p["b2"], f.activation),
                   norm1_w=p["norm1_w"])


def _forward(torch, p: dict, fixed: dict, X):
    """The post-norm block in torch (float64) on ``X (B, N, d)``."""
    F = torch.nn.functional
    d = X.shape[-1]
    q = torch.einsum("hed,bnd->bhne", p["Wq"], X) + p["bq"][None, :, None]
    k = torch.einsum("hed,bnd->bhne", p["Wk"], X) + fixed["bk"][None, :, None]
    v = torch.einsum("hed,bnd->bhne", p["Wv"], X) + fixed["bv"][None, :, None]
    att = torch.softmax(fixed["scale"] * q @ k.transpose(-1, -2), -1) @ v
    B, H, N, dv = att.shape
    a = att.permute(0, 2, 1, 3).reshape(B, N, H * dv) @ p["Wo"].T + p["bo"]
    h = F.layer_norm(X + a, (d,), p["norm1_w"], fixed["norm1_b"], EPS)
    u = h + F.gelu(h @ p["W1"].T + p["b1"]) @ p["W2"].T + p["b2"]
    return F.layer_norm(u, (d,), fixed["norm2_w"], fixed["norm2_b"], EPS)


@dataclass
class PolishReport:
    """Relative misfit (rms over every answered number, each length relative to its largest ``|y − x|``) before
    and after each kept step, and LSMR's iterations per step."""

    history: list = field(default_factory=list)
    iterations: list = field(default_factory=list)


def polish_block(block: TransformerBlock, data, *, rounds: int = 4, iterations: int = 200,
                 target: float = 0.0) -> tuple[TransformerBlock, PolishReport]:
    """Gauss–Newton steps (module docstring) on ``data`` (:func:`polish_data`), none once the misfit is below
    ``target``; the result fits ``data`` no worse than ``block``."""
    import torch

    if block.ffn.activation != "gelu":
        raise ValueError("the post-norm polish reads GELU FFNs (BERT's)")
    a = block.attention
    fixed = {"bk": a.bk, "bv": a.bv, "norm1_b": block.norm1_b, "norm2_w": block.norm2_w, "norm2_b": block.norm2_b}
    fixed = {k: torch.as_tensor(np.array(v, dtype=np.float64)) for k, v in fixed.items()} | {"scale": a.scale}
    start = _arrays(block)
    shapes = {k: np.shape(v) for k, v in start.items()}
    sizes = {k: int(np.prod(s)) for k, s in shapes.items()}
    Xs = [torch.as_tensor(X) for X, _ in data]
    Ys = [torch.as_tensor(Y) for _, Y in data]
    w = [1.0 / float((Y - X).abs().max()) for X, Y in zip(Xs, Ys)]
    count = sum(Y.numel() for Y in Ys)

    def unflat(theta):
        out, i = {}, 0
        for k in FITTED:
            out[k] = theta[i:i + sizes[k]].reshape(shapes[k])
            i += sizes[k]
        return out

    def residual(theta):
        p = unflat(theta)
        return torch.cat([(wi * (_forward(torch, p, fixed, X) - Y)).reshape(-1) for wi, X, Y in zip(w, Xs, Ys)])

    def misfit(r):
        return float(r.norm()) / math.sqrt(count)

    theta = torch.as_tensor(np.concatenate([np.ravel(start[k]) for k in FITTED]).astype(np.float64))
    r = residual(theta)
    report = PolishReport([misfit(r)])
    for _ in range(rounds):
        if report.history[-1] < target:
            break
        step, used = _gn_step(torch, residual, theta, r, iterations)
        report.iterations.append(used)
        best = None
        for t in BACKTRACK:
            r_t = residual(theta + t * step)
            if best is None or misfit(r_t) < best[1]:
                best = (t, misfit(r_t), r_t)
            if best[1] < report.history[-1] / 2:
                break
        if not best[1] < report.history[-1]:
            break
        theta, r = theta + best[0] * step, best[2]
        report.history.append(best[1])
    p = {k: v.detach().numpy().copy() for k, v in unflat(theta).items()}
    return _rebuild(block, p), report


def _gn_step(torch, residual, theta, r, iterations: int = 200):
    """One Gauss–Newton step ``min ‖J δ + r‖`` by LSMR, columns scaled by probed ``√diag(JᵀJ)``."""
    from torch.func import jvp, vjp

    _, pull = vjp(residual, theta)
    gen = torch.Generator().manual_seed(0)
    diag = torch.zeros_like(theta)
    for _ in range(PROBES):
        u = torch.randint(0, 2, r.shape, generator=gen, dtype=torch.float64) * 2 - 1
        diag += pull(u)[0] ** 2
    col = torch.sqrt(diag / PROBES).clamp_min(1e-12 * float(torch.sqrt(diag.max() / PROBES)))

    def mv(x):
        return jvp(residual, (theta,), (torch.as_tensor(np.ravel(x)) / col,))[1].detach().numpy()

    def rmv(y):
        return (pull(torch.as_tensor(np.ravel(y)))[0] / col).detach().numpy()

    op = LinearOperator((r.numel(), theta.numel()), matvec=mv, rmatvec=rmv, dtype=np.float64)
    sol = lsmr(op, -r.detach().numpy(), atol=1e-12, btol=1e-12, maxiter=iterations)
    return torch.as_tensor(sol[0]) / col, int(sol[2])
