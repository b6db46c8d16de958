"""The ``ffn`` learner: the ReLU learner (critical points) or the smooth learner, as the activation says.

The activation is given (``relu``, ``gelu``, ``gelu_tanh``, ``silu``, ``swiglu``, ``geglu``, ``geglu_tanh``) or
read from the answers (:mod:`.detect`: bends at most points → smooth; quadratic growth along rays → gated, the
gated learner :mod:`.gated_learner`; else the smooth learner picks GELU, tanh-GELU or SiLU by fit).
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.smooth_ffn.derivatives import Asker
from attnprobe.learners.smooth_ffn.detect import growth, smooth_bends
from attnprobe.models.gated_ffn import GATED_FAMILIES
from attnprobe.models.smooth_ffn import ACTIVATIONS

GATED = tuple(GATED_FAMILIES)
#: every value of the activation option
CHOICES = ("relu", *ACTIVATIONS, *GATED)
#: growth exponent above which the units are taken to be gated (1 plain, 2 gated)
GATED_GROWTH = 1.5


def extract_ffn_any(oracle, *, seed: int = 0, progress=None, activation: str | None = None,
                    hidden: int | None = None, bias: bool = True, sign_time_limit: float = 5.0,
                    start: str | None = None):
    """Run the FFN learner the activation calls for (detected when ``activation`` is None); ``start``: the smooth
    learner's start (``jennrich`` or ``drive``; None: its own choice)."""
    if activation is not None and activation not in CHOICES:
        raise ConfigError(f"The 'activation' parameter must be one of {', '.join(CHOICES)}; got {activation!r}",
                          param="activation")
    test: dict = {}
    before = oracle.queries
    if activation is None:
        rng = np.random.default_rng([int(seed), 7])
        ask = Asker(oracle, reserve=64)
        with oracle.phase("activation_test"):
            smooth, share = smooth_bends(ask, oracle.d, oracle.eps, rng)
            test = {"bending_share": share}
            if smooth:
                test["growth"] = growth(ask, oracle.d, rng)
        activation = ("gated" if smooth and test["growth"] > GATED_GROWTH else None) if smooth else "relu"
        test["smooth"] = bool(smooth)
    if activation in (*GATED, "gated"):
        from attnprobe.learners.smooth_ffn.gated_learner import extract_gated_ffn

        res = extract_gated_ffn(oracle, seed=seed, progress=progress, hidden=hidden, bias=bias,
                                activation=None if activation == "gated" else activation)
    elif activation == "relu":
        res = extract_ffn(oracle, seed=seed, progress=progress, sign_time_limit=sign_time_limit, bias=bias,
                          hidden=hidden)
    else:
        from attnprobe.learners.smooth_ffn.learner import extract_smooth_ffn

        res = extract_smooth_ffn(oracle, seed=seed, progress=progress, activation=activation, hidden=hidden,
                                 bias=bias, start=start)
    return _with_test(res, test, oracle.queries - before - res.queries - (res.check.queries if res.check else 0))


def ffn_any_estimate(s, relu_estimate):
    """The ``ffn`` learner's query estimate: the smooth learner's plan for a smooth activation, the gated learner's
    for gated units, else ``relu_estimate`` (the ReLU learner's; also taken when the activation is not given)."""
    act = s.option("activation")
    if act in GATED:
        from attnprobe.learners.smooth_ffn.gated_learner import gated_estimate

        return gated_estimate(s)
    if act in ACTIVATIONS:
        from attnprobe.learners.smooth_ffn.learner import smooth_estimate

        return smooth_estimate(s)
    return relu_estimate(s)


def _with_test(res, test: dict, spent: int):
    """The detection's queries and findings added to the result (its phases still sum to its queries)."""
    if test:
        res.details["activation_test"] = test
    if spent:
        res.queries += spent
        res.queries_by_phase = {"activation_test": spent, **res.queries_by_phase}
    return res
