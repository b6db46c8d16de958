"""Research: finding a neutral key ``x₀`` (``W_K,g x₀ + b_K,g = 0`` in every group) of a RoPE layer with biases from
its answers alone, by Gauss–Newton on the pair probe's tail (Qwen2, float64 reference function of a random-init
``Qwen2Attention``, d = 32, 2 heads, 1 KV group, d_h = 16, biases N(0, 0.5²)).

With every key at ``x`` and the pair at ``x ± ηe`` the pair probe ``D(x)`` (``heads.pair_jacobian`` on the tokens
shifted by ``x``) has rank H exactly when ``x`` is neutral; otherwise the heads' whole value maps enter and the rank
is full. The residual is the block of ``D(x)`` outside its top-H singular spaces (fixed at ``x``), its Jacobian in
``x`` by forward differences along ``m = G·d_h + 8`` random directions, the step by least squares (singular values
below 1e-6 of the largest dropped), over the tails of ``Z`` random queries at once. Columns: start, queries ``Z``,
the key residual ``‖W_K x + b_K‖ / ‖b_K‖`` per Gauss–Newton step (truth read from the weights, for the table only),
the largest tail ``s_(H+1)/s_1`` at the last step, queries spent.

    PYTHONPATH=src python benchmarks/research/neutral_key_search.py > benchmarks/research/neutral_key_search.out
"""

from __future__ import annotations

import numpy as np

from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.positional.heads import pair_jacobian
from attnprobe.reports import Table
from attnprobe.targets.positional_modules import positional_victim, reference_model

D, H, G, STEPS = 32, 2, 1, 6


def search(truth, x, zs, rng):
    """Gauss–Newton steps from ``x`` on the tails of the queries ``zs``: the key residual after each, the last
    tail, the queries asked."""
    asked = [0]

    def layer(shift):
        def f(X):
            asked[0] += len(X)
            return truth(np.asarray(X) + shift)
        return f

    E = random_orthogonal(D, rng)[:H + 8]
    eta, tau, m = 0.01 * np.sqrt(D), 1e-4 * np.sqrt(D), G * (D // H) + 8
    residuals, tail = [key_residual(truth, x)], None
    for _ in range(STEPS):
        Om = rng.standard_normal((m, D)) / np.sqrt(D)
        rows, cols, tails = [], [], []
        for z in zs:
            D0 = pair_jacobian(layer(x), z, E, eta)
            U, s, Vt = np.linalg.svd(D0, full_matrices=False)
            P, Q = U[:, H:], Vt[H:].T
            r0 = (P.T @ D0 @ Q).ravel()
            tails.append(s[H] / s[0])
            rows.append(r0)
            cols.append(np.stack([((P.T @ pair_jacobian(layer(x + tau * w), z, E, eta) @ Q).ravel() - r0) / tau
                                  for w in Om], axis=1))
        step = np.linalg.lstsq(np.concatenate(cols), -np.concatenate(rows), rcond=1e-6)[0]
        x = x + Om.T @ step
        residuals.append(key_residual(truth, x))
        tail = max(tails)
    return residuals, tail, asked[0]


def key_residual(truth, x) -> float:
    k = np.einsum("gkd,d->gk", truth.Wk, x) + truth.bk
    return float(np.linalg.norm(k) / np.linalg.norm(truth.bk))


def main() -> None:
    truth = reference_model(positional_victim("qwen2", d=D, heads=H, kv_heads=G, seed=1))
    x0 = -np.linalg.lstsq(truth.Wk.reshape(-1, D), truth.bk.reshape(-1), rcond=None)[0]
    table = Table(["start", "queries Z", "key residual per step", "last tail s_(H+1)/s_1", "sequences"])
    for start, Z in (("x₀ + N(0, 0.01²)", 1), ("x₀ + N(0, 0.01²)", 12), ("0", 12)):
        rng = np.random.default_rng(0)
        x = x0 + 0.01 * rng.standard_normal(D) if start != "0" else np.zeros(D)
        res, tail, asked = search(truth, x, rng.standard_normal((Z, D)), rng)
        table.add(start, Z, " → ".join(f"{r:.1e}" for r in res), f"{tail:.1e}", asked)
        print(table.markdown().splitlines()[-1], flush=True)
    print(table.markdown())


if __name__ == "__main__":
    main()
