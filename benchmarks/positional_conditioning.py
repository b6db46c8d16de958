"""Conditioning of the routes from a RoPE head's logit matrices ``B(δ) = Q R(δ) K`` at a few offsets to every offset,
on real-size heads (d_h = 16 and 128, base 1e4, d = 2 d_h, random Q, K), with relative noise added to the measured
matrices. Rows: the route, the noise, the relative error of ``B(δ)`` rebuilt at δ = 0, −255 and −4096.

- *least squares over offsets*: each frequency's pair of matrices from ``B(δ)``, δ = 0 … L−1, on ``[cos δθ_k,
  sin δθ_k]`` with θ known: the condition number of that design (the route is hopeless when it passes 1e16);
- *one step*: pair bases from the eigenvectors of ``T = M(−2) M(−1)⁻¹`` alone (the low frequencies' eigenvalues
  crowd near 1), then the angles refined at the far offsets;
- *combined steps* (the learner's route): eigenvectors of a random combination of ``M(δ) M(−1)⁻¹`` over every
  measured offset, then the same refinement.

    PYTHONPATH=src python benchmarks/positional_conditioning.py --write
"""

from __future__ import annotations

import argparse

import numpy as np

from attnprobe.learners.positional.rotation import RotaryFactors, fit_keys, factor_rotary, pair_basis, refine_angles
from attnprobe.models.positional import rope_frequencies
from attnprobe.reports import Table
from sections import command_line, write_section

DOC = "positional"
OFFSETS = (-1, -2, -3, -4, -6, -8, -16, -32, -64, -128, -255)


def one_step(M, U, V):
    """The route through ``T = M(−2) M(−1)⁻¹`` alone for the pair bases."""
    P, theta = pair_basis({-1: M[-2] @ np.linalg.inv(M[-1])})
    f = RotaryFactors(np.eye(len(P)), np.eye(len(P)), theta)
    K0 = fit_keys(P, f, {-1: M[-1], -2: M[-2]})
    theta = refine_angles(theta, P, M, K0)
    f = RotaryFactors(np.eye(len(P)), np.eye(len(P)), theta)
    return RotaryFactors(U @ P, fit_keys(P, f, M) @ V.T, theta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks/positional.md")
    args = ap.parse_args()
    table = Table(["d_h", "route", "noise", "B(0)", "B(−255)", "B(−4096)"])
    for dh in (16, 128):
        theta = rope_frequencies(dh, 1e4)
        for L in (256, 4096):
            D = np.arange(L)[:, None] * theta[None]
            cond = np.linalg.cond(np.concatenate([np.cos(D), np.sin(D)], axis=1))
            table.add(dh, f"least squares over offsets 0…{L - 1}", "–", f"condition {cond:.0e}", "", "")
        rng = np.random.default_rng(0)
        d = 2 * dh
        f = RotaryFactors(rng.standard_normal((d, dh)) / np.sqrt(d), rng.standard_normal((dh, d)) / np.sqrt(d), theta)
        U, V = np.linalg.qr(f.Q)[0], np.linalg.qr(f.K.T)[0]
        for noise in (1e-14, 1e-10, 1e-7):
            M = {}
            for o in OFFSETS:
                exact = U.T @ f.matrix(o) @ V
                M[o] = exact + noise * np.linalg.norm(exact) / dh * rng.standard_normal(exact.shape)
            for name, route in (("one step", one_step), ("combined steps", lambda M, U, V: factor_rotary(M, U, V,
                                                                                                         -1, -2))):
                try:
                    got = route(M, U, V)
                    errs = [np.linalg.norm(got.matrix(x) - f.matrix(x)) / np.linalg.norm(f.matrix(x))
                            for x in (0, -255, -4096)]
                    table.add(dh, name, f"{noise:.0e}", *(f"{e:.1e}" for e in errs))
                except Exception as exc:  # a route that fails is a row too
                    table.add(dh, name, f"{noise:.0e}", f"fails: {exc}"[:90], "", "")
    print(table.markdown())
    if args.write:
        write_section("Positional: conditioning of the rotation routes (d_h = 16 and 128)", table.markdown(),
                      command_line(), doc=DOC)


if __name__ == "__main__":
    main()
