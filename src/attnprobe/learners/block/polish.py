"""Gauss–Newton on a RoPE attention's parameters against its answers (the block learner's attention stage).

Through a block the attention answers only with its query at rms ≈ 1 (the norm fixes the query's scale), which the
RoPE learner's probes read ~1e-5 … 1e-6 of the function (docs/block.md). From that start, Gauss–Newton steps on
every parameter (``W_Q, W_K, W_V, W_O`` per head and the shared frequencies θ) against the last-row answers of
random sequences at several lengths take the function to the answers' own precision. Each step solves the
linearised problem with LSMR on a matrix-free operator (``J δ`` and ``Jᵀ r`` by forward- and reverse-mode
differentiation in torch); the scaled rotation per frequency pair that leaves the function unchanged is a null
direction LSMR leaves alone (a minimum-norm step).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse.linalg import LinearOperator, lsmr

from attnprobe.learners.core.descent import keep_if_lower
from attnprobe.learners.positional.polish import last_row, row_constants
from attnprobe.models.positional import PositionalAttention

#: Gauss–Newton rounds and LSMR iterations per round
ROUNDS, ITERATIONS = 3, 500


def _torch():
    import torch

    return torch


def _column_scales(f, residual, p, torch, probes: int = 4) -> np.ndarray:
    """1/‖J e_i‖ per column: exact for the frequencies (few, and far larger than the rest: they multiply every
    offset), a group's root-mean-square from random probes for each weight matrix (its columns are alike)."""
    from torch.func import jvp

    out = np.ones(p.shape[0])
    i = 0
    rng = np.random.default_rng(0)
    for g, shape in enumerate(f.shapes):
        n = int(np.prod(shape))
        if g == len(f.shapes) - 1:
            for j in range(n):
                e = torch.zeros_like(p)
                e[i + j] = 1
                out[i + j] = 1 / max(float(jvp(residual, (p,), (e,))[1].norm()), 1e-300)
        else:
            acc = 0.0
            for _ in range(probes):
                e = torch.zeros_like(p)
                e[i:i + n] = torch.as_tensor(rng.standard_normal(n))
                acc += float(jvp(residual, (p,), (e,))[1].norm()) ** 2 / n
            out[i:i + n] = 1 / max(np.sqrt(acc / probes), 1e-300)
        i += n
    return out


class RopeLastRow:
    """The last-row answer of independent RoPE heads (rotate-half, scale 1, causal, no biases) as a function of one
    flat parameter vector: ``Wq (H, d_h, d)``, ``Wk (H, d_h, d)``, ``Wv (H, d_v, d)``, ``Wo (K, H·d_v)``, ``θ``.
    The forward pass is the positional polish's (:func:`~attnprobe.learners.positional.polish.last_row`) on the
    model with one key and value group per head and zero biases."""

    def __init__(self, model: PositionalAttention):
        H, dh, d = model.Wq.shape
        dv, K = model.Wv.shape[1], model.outputs
        Wk = np.stack([model.Wk[model.group(h)] for h in range(H)])
        Wv = np.stack([model.Wv[model.group(h)] for h in range(H)])
        self.shapes = [(H, dh, d), (H, dh, d), (H, dv, d), (K, H * dv), (len(model.inv_freq),)]
        self.start = np.concatenate([model.Wq.ravel(), Wk.ravel(), Wv.ravel(), model.Wo.ravel(),
                                     np.asarray(model.inv_freq).ravel()])
        self.model = model
        self.heads = PositionalAttention(model.Wq, Wk, Wv, model.Wo, position="rope", inv_freq=model.inv_freq,
                                         layout="half", scale=1.0, causal=True)
        self.zeros = {"bq": np.zeros((H, dh)), "bk": np.zeros((H, dh)), "bv": np.zeros((H, dv)), "bo": np.zeros(K)}
        self.constants: dict = {}

    def unpack(self, p):
        out, i = [], 0
        for s in self.shapes:
            n = int(np.prod(s))
            out.append(p[i:i + n].reshape(s))
            i += n
        return out

    def forward(self, p, Z):
        """Last rows (B, K) of torch sequences ``Z (B, N, d)``."""
        torch = _torch()
        N = Z.shape[1]
        if N not in self.constants:
            self.constants.update(row_constants(self.heads, [N]))
        parts = dict(zip(("Wq", "Wk", "Wv", "Wo", "inv_freq"), self.unpack(p)))
        parts |= {name: torch.as_tensor(zero) for name, zero in self.zeros.items()}
        return last_row(self.heads, parts, self.constants, Z)

    def to_model(self, p: np.ndarray) -> PositionalAttention:
        Wq, Wk, Wv, Wo, theta = self.unpack(p)
        m = self.model
        return PositionalAttention(Wq, Wk, Wv, Wo, bo=m.bo, position="rope", inv_freq=theta, layout="half",
                                   scale=1.0, causal=True)


#: lengths of the polish's sequences, and sequences per length per 6 model widths
POLISH_LENGTHS, POLISH_PER_D = (2, 4, 8, 16, 32, 64), 16 / 6
#: the polish's keys: N(0, POLISH_KEYS²) per coordinate (rms well inside the norm's ball)
POLISH_KEYS = 0.6


def polish_data(att_oracle, query_rms: float, rng) -> list:
    """Random sequences (keys of rms ≈ :data:`POLISH_KEYS`, the query of rms ``query_rms``) at each of
    :data:`POLISH_LENGTHS` and the attention oracle's last rows: the polish's data (measured in
    benchmarks/block_learner.py; the learner refits the logits instead, :mod:`.refine`)."""
    d = att_oracle.d
    n = max(16, math.ceil(POLISH_PER_D * d))
    data = []
    for N in POLISH_LENGTHS:
        Z = rng.standard_normal((n, N, d)) * POLISH_KEYS
        Z[:, -1] *= query_rms * math.sqrt(d) / np.linalg.norm(Z[:, -1], axis=1, keepdims=True)
        data.append((Z, att_oracle(Z)))
    return data


def polish_attention(model: PositionalAttention, data: list[tuple[np.ndarray, np.ndarray]], *, rounds: int = ROUNDS,
                     iterations: int = ITERATIONS) -> tuple[PositionalAttention, list[float]]:
    """Gauss–Newton on ``model`` against ``data`` (pairs of sequences ``Z (B, N, d)`` and last-row answers ``Y (B, K)``
    less the model's constant ``bo``); a step is kept only when it lowers the residual. Returns the model and the
    relative residual before and after each kept step."""
    torch = _torch()
    from torch.func import jvp, vjp

    f = RopeLastRow(model)
    Zs = [torch.as_tensor(Z, dtype=torch.float64) for Z, _ in data]
    Ys = [torch.as_tensor(Y - model.bo, dtype=torch.float64) for _, Y in data]
    scale = float(torch.sqrt(sum((Y**2).sum() for Y in Ys)))

    def residual(p):
        return torch.cat([(f.forward(p, Z) - Y).reshape(-1) for Z, Y in zip(Zs, Ys)])

    p = torch.as_tensor(f.start.copy())
    r = residual(p)
    history = [float(r.norm()) / scale]
    col = _column_scales(f, residual, p, torch)
    for _ in range(rounds):
        n, m = r.shape[0], p.shape[0]
        _, pullback = vjp(residual, p)
        op = LinearOperator((n, m), dtype=np.float64,
                            matvec=lambda v: jvp(residual, (p,), (torch.as_tensor(np.ravel(v) * col),))[1].numpy(),
                            rmatvec=lambda u: pullback(torch.as_tensor(np.ravel(u)))[0].numpy() * col)
        step = lsmr(op, -r.numpy(), maxiter=iterations, atol=1e-15, btol=1e-15)[0] * col
        trial = p + torch.as_tensor(step)
        r_new = residual(trial)
        (p, r), more = keep_if_lower(history, float(r_new.norm()) / scale, (p, r), (trial, r_new), floor=1e-14)
        if not more:
            break
    return f.to_model(p.numpy()), history
