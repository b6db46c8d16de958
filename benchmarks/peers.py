"""Peer comparison: the Adversarial Robustness Toolbox's FunctionallyEquivalentExtraction (Jagielski et
al. 2020, a one-hidden-layer ReLU extractor) against attnprobe's FFN learner on the same bias-free ReLU networks.

    pip install adversarial-robustness-toolbox     # after torch==2.13.0 if torch is wanted; ART does not pull torch
    python benchmarks/peers.py [--timeout 60] [--seeds 1]

ART's victim is wrapped so every input row it asks about is counted (its last-layer fit asks about the sample
inputs it is given, counted too). ART's model has biases and K outputs, so the bias-free scalar networks are inside
its assumptions (biases 0; K = 2 outputs f and −f, since ART needs two classes); it needs the number of neurons m, which attnprobe does not. ART computes in
float32. Both are scored by the relative error on the same 256 fresh Gaussian inputs (not counted as queries).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np

from attnprobe.learners.ffn import extract_ffn
from attnprobe.oracles import Oracle
from attnprobe.reports import Table, command_line, write_section
from attnprobe.targets import random_relu_net

TITLE = "ART FunctionallyEquivalentExtraction (Jagielski et al. 2020) against the FFN learner"


class CountingVictim:
    """The victim as ART sees it: rows (n, d) -> logits (f(x), −f(x)) (ART needs at least two classes; the pair is
    the same hidden layer read by w_o and −w_o); counts every row."""

    def __init__(self, net, counter=None):
        self.net = net
        self.counter = counter  # a multiprocessing.Value, so the count survives a stopped run

    @property
    def rows(self):
        return self.counter.value

    def __call__(self, x):
        x = np.asarray(x, dtype=np.float64).reshape(-1, self.net.d)
        self.counter.value += x.shape[0]
        y = self.net.forward(x)
        return np.stack([y, -y], axis=1)


def fresh_error(net, predict, seed):
    X = np.random.default_rng(seed + 7).standard_normal((256, net.d))
    y = net.forward(X)
    yh = np.asarray(predict(X), dtype=np.float64).reshape(-1)
    return float(np.linalg.norm(yh - y) / np.linalg.norm(y))


def run_art(d, m, seed, queue, counter, params):
    from art.attacks.extraction import FunctionallyEquivalentExtraction
    from art.estimators.classification import BlackBoxClassifierNeuralNetwork

    net = random_relu_net(d, m, seed=seed)
    victim = CountingVictim(net, counter)
    np.random.seed(seed)
    clf = BlackBoxClassifierNeuralNetwork(victim, input_shape=(d,), nb_classes=2)
    attack = FunctionallyEquivalentExtraction(classifier=clf, num_neurons=m)
    X_fit = np.random.default_rng(seed).standard_normal((10 * (m + 1), d)).astype(np.float32)
    t0 = time.perf_counter()
    try:
        extracted = attack.extract(X_fit, **params)
        err = fresh_error(net, lambda X: extracted.predict(X.astype(np.float32))[:, 0], seed)
        status = "ok"
    except Exception as exc:  # ART raises AssertionError when it finds the wrong number of critical points
        err, status = float("nan"), f"failed: {type(exc).__name__}: {str(exc)[:80]}"
    queue.put((victim.rows, err, time.perf_counter() - t0, status))


class BiasedNet:
    """ART's home setting as a harness check: ``x ↦ w_oᵀReLU(Aᵀx + b)`` with a random bias b."""

    def __init__(self, d, m, seed):
        rng = np.random.default_rng(seed)
        self.d, self.A = d, rng.standard_normal((d, m)) / np.sqrt(d)
        self.b, self.w_o = rng.standard_normal(m), rng.standard_normal(m)

    def forward(self, x):
        return np.maximum(np.asarray(x, dtype=np.float64) @ self.A + self.b, 0) @ self.w_o


def run_art_biased(d, m, seed, queue, counter, params):
    from art.attacks.extraction import FunctionallyEquivalentExtraction
    from art.estimators.classification import BlackBoxClassifierNeuralNetwork

    net = BiasedNet(d, m, seed)
    victim = CountingVictim(net, counter)
    np.random.seed(seed)
    attack = FunctionallyEquivalentExtraction(
        classifier=BlackBoxClassifierNeuralNetwork(victim, input_shape=(d,), nb_classes=2), num_neurons=m)
    t0 = time.perf_counter()
    try:
        extracted = attack.extract(np.random.default_rng(seed).standard_normal((10 * (m + 1), d)).astype(np.float32),
                                   **params)
        err = fresh_error(net, lambda X: extracted.predict(X.astype(np.float32))[:, 0], seed)
        status = "ok"
    except Exception as exc:
        err, status = float("nan"), f"failed: {type(exc).__name__}: {str(exc)[:80]}"
    queue.put((victim.rows, err, time.perf_counter() - t0, status))


def run_ours(d, m, seed):
    net = random_relu_net(d, m, seed=seed)
    o = Oracle(net, d)
    t0 = time.perf_counter()
    res = extract_ffn(o, seed=seed, check=False)
    return res.queries, fresh_error(net, res.model.forward, seed), time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per ART run")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--biased", action="store_true", help="only the harness check: ART on a ReLU net with biases")
    args = p.parse_args()
    if args.biased:
        ctx = mp.get_context("fork")
        q, counter = ctx.Queue(), ctx.Value("q", 0)
        proc = ctx.Process(target=run_art_biased, args=(8, 4, 0, q, counter, {}))
        proc.start()
        proc.join(args.timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join()
            print(f"ART on a biased net d=8, m=4: stopped after {args.timeout:.0f} s and {counter.value} queries")
        else:
            print("ART on a biased net d=8, m=4 (queries, rel. error, s, status):", q.get())
        return
    t = Table(["d", "m", "seed", "ART settings", "ART queries", "ART rel. error", "ART s", "ART status",
               "attnprobe queries", "attnprobe rel. error", "attnprobe s"])
    ctx = mp.get_context("fork")
    configs = {"ART defaults": {}, "ART loosened": {"rel_diff_slope": 1e-3, "rel_diff_value": 1e-3}}
    for d, m in ((8, 4), (8, 8), (16, 8), (16, 16)):
        for seed in range(args.seeds):
            o_q, o_err, o_s = run_ours(d, m, seed)
            for name, params in configs.items():
                q, counter = ctx.Queue(), ctx.Value("q", 0)
                proc = ctx.Process(target=run_art, args=(d, m, seed, q, counter, params))
                proc.start()
                proc.join(args.timeout)
                if proc.is_alive():
                    proc.terminate()
                    proc.join()
                    a_rows, a_err, a_s = counter.value, float("nan"), args.timeout
                    status = f"stopped after {args.timeout:.0f} s (no result)"
                else:
                    a_rows, a_err, a_s, status = q.get()
                t.add(d, m, seed, name, a_rows, f"{a_err:.1e}", f"{a_s:.1f}", status, o_q, f"{o_err:.1e}",
                      f"{o_s:.1f}")
                print(t.rows[-1], flush=True)
    write_section(TITLE, t.markdown(), command_line(), parent="Peer comparison")


if __name__ == "__main__":
    main()
