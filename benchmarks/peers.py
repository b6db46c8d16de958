"""Fair peer comparison of ReLU-network extraction: attnprobe's FFN learner against the Adversarial Robustness
Toolbox's FunctionallyEquivalentExtraction (Jagielski et al. 2020), set up as its authors intend.

    PYTHONPATH=src python -W ignore benchmarks/peers.py [--seeds 2] [--art-seeds 2] [--timeout 300] [--write]

Both learners query the same networks at the same answer precision (a float64 column and a float32 one: the
victim computes and answers in that precision). ART is set up as in its own example: ``art.config.ART_NUMPY_DTYPE
= np.float64`` (its example sets Keras to float64), ``BlackBoxClassifierNeuralNetwork(..., preprocessing=None)``
(the default (0, 1) preprocessing would cast every input to float32), its default ``extract`` parameters, the
number of neurons m given (attnprobe is not told m), and 100 fresh inputs for its last-layer fit (its example
passes ``x_test[0:100]``; those queries are counted). Every row either learner sends is counted by a wrapper
whose count survives a stopped run. Each ART run is stopped after ``--timeout`` seconds.

Networks: ART's own setting, 784-16-10 with hidden and output biases (random Gaussian weights of that shape:
:func:`attnprobe.targets.random_relu_net` with ``bias=True, outputs=10``), and the paper's bias-free scalar nets
(Sec. 4.1) at small d, m, which ART sees as two logits (f, −f) because it needs at least two classes.
Scored on 1000 fresh N(0, I) inputs (not counted): the relative L2 error over all outputs, and the neurons
recovered to < 1e-3 up to permutation and positive scale (direction of (a_k, b_k) and output weights).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

import numpy as np

from attnprobe.learners.ffn import extract_ffn
from attnprobe.models import ReLUNet, neuron_errors
from attnprobe.oracles import Oracle
from attnprobe.targets import random_relu_net

from attnprobe.reports import Table, relative_error as rel
from sections import write_section

DOC = "peers"  # its results file: docs/benchmarks/peers.md
TITLE = "Peer comparison: ReLU networks, attnprobe vs ART FunctionallyEquivalentExtraction (fair setup)"
SMALL = ((8, 4), (8, 8), (16, 8), (16, 16))


def network(kind: str, d: int, m: int, seed: int) -> ReLUNet:
    if kind == "art":
        return random_relu_net(d, m, seed=seed, bias=True, outputs=10)
    return random_relu_net(d, m, seed=seed)


class Victim:
    """Rows (n, d) -> answers in ``precision``; every row counted in a shared counter. ``pair``: a scalar net is
    answered as the two logits (f, −f) (ART needs two classes)."""

    def __init__(self, net: ReLUNet, precision: str, counter, pair: bool = False) -> None:
        self.net, self.counter, self.pair = net.with_dtype(precision), counter, pair

    def __call__(self, x):
        x = np.asarray(x, dtype=np.float64).reshape(-1, self.net.d)
        self.counter.value += x.shape[0]
        y = self.net.forward(x)
        return np.stack([y, -y], axis=1) if self.pair else y


def score(net: ReLUNet, model: ReLUNet, seed: int) -> tuple[float, int]:
    X = np.random.default_rng(10_000 + seed).standard_normal((1000, net.d))
    err = rel(model.forward(X), net.forward(X))
    ne = neuron_errors(net.A, net.w_o, model.A, model.w_o, b_true=net.b, b_hat=model.b)
    return err, ne["within_1e-3"]


def run_art(kind, d, m, seed, precision, queue, counter):
    import art.config

    art.config.ART_NUMPY_DTYPE = np.float64
    from art.attacks.extraction import FunctionallyEquivalentExtraction
    from art.estimators.classification import BlackBoxClassifierNeuralNetwork

    net = network(kind, d, m, seed)
    victim = Victim(net, precision, counter, pair=net.outputs is None)
    np.random.seed(seed)  # ART draws its search line and probes from numpy's global generator
    K = net.outputs or 2
    clf = BlackBoxClassifierNeuralNetwork(victim, input_shape=(d,), nb_classes=K, preprocessing=None)
    attack = FunctionallyEquivalentExtraction(classifier=clf, num_neurons=m)
    sample = np.random.default_rng(20_000 + seed).standard_normal((100, d))
    t0 = time.perf_counter()
    try:
        attack.extract(sample)
        w_1, b_1 = attack.w_1, attack.b_1[:, 0]
        if net.outputs is None:  # logits (f, −f): f is the first
            w_1, b_1 = w_1[:, 0], b_1[0]
        model = ReLUNet(attack.w_0, w_1, "float64", attack.b_0[:, 0], b_1)
        err, good = score(net, model, seed)
        status = "model returned"
    except Exception as exc:  # ART asserts on the number of critical points it found
        err, good, status = float("nan"), 0, f"failed: {type(exc).__name__}: {str(exc)[:70]}"
    queue.put((err, good, time.perf_counter() - t0, status))


def art_row(kind, d, m, seed, precision, timeout):
    ctx = mp.get_context("fork")
    q, counter = ctx.Queue(), ctx.Value("q", 0)
    proc = ctx.Process(target=run_art, args=(kind, d, m, seed, precision, q, counter))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()
        proc.join()
        return counter.value, float("nan"), 0, timeout, f"stopped after {timeout:.0f} s (no model)"
    err, good, secs, status = q.get()
    return counter.value, err, good, secs, status


def ours_row(kind, d, m, seed, precision):
    net = network(kind, d, m, seed)
    oracle = Oracle(net.with_dtype(precision), d, precision=precision)
    t0 = time.perf_counter()
    try:
        res = extract_ffn(oracle, seed=seed, bias=kind == "art", check=False)
        err, good = score(net, res.model, seed)
        status = "model returned"
    except Exception as exc:  # report, never hide
        err, good, status = float("nan"), 0, f"failed: {type(exc).__name__}: {str(exc)[:70]}"
    return oracle.queries, err, good, time.perf_counter() - t0, status


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=2, help="seeds per small bias-free network")
    ap.add_argument("--art-seeds", type=int, default=2, help="seeds of ART's own 784-16-10 setting")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per ART run")
    ap.add_argument("--precisions", nargs="+", default=["float64", "float32"])
    ap.add_argument("--networks", nargs="+", choices=["art", "paper"], default=["art", "paper"],
                    help="art: ART's 784-16-10 biased setting; paper: the small bias-free nets")
    ap.add_argument("--write", action="store_true", help="replace the section in docs/benchmarks/peers.md")
    a = ap.parse_args(argv)
    cases = [("art", 784, 16, s) for s in range(a.art_seeds)] if "art" in a.networks else []
    cases += [("paper", d, m, s) for d, m in SMALL for s in range(a.seeds)] if "paper" in a.networks else []
    rows = []
    for kind, d, m, seed in cases:
        for precision in a.precisions:
            for name, fn in (("attnprobe", lambda: ours_row(kind, d, m, seed, precision)),
                             ("ART", lambda: art_row(kind, d, m, seed, precision, a.timeout))):
                q, err, good, secs, status = fn()
                label = f"{d}-{m}-10 biased" if kind == "art" else f"{d}-{m}-1 bias-free"
                rows.append([label, seed, precision, name, q, round(secs, 1), err, f"{good}/{m}", status])
                print(rows[-1], flush=True)
    out = Table(["network", "seed", "answers", "learner", "queries", "seconds", "rel. L2 error (1000 fresh)",
                 "neurons < 1e-3", "outcome"], rows).markdown()
    print(out)
    if a.write:
        title = TITLE if len(a.networks) == 2 else (
            f"{TITLE}: {'ART setting' if a.networks == ['art'] else 'small bias-free nets'}, "
            f"ART stopped after {a.timeout:.0f} s")
        write_section(title, out,
                      "PYTHONPATH=src python -W ignore benchmarks/peers.py " + " ".join(argv or sys.argv[1:]), doc=DOC)


if __name__ == "__main__":
    main()
