"""The ``ffn`` learner: the ReLU learner (critical points) or the smooth learner, as the activation says.

The activation is given (``relu``, ``gelu``, ``gelu_tanh``, ``silu``) or read from the answers
(:mod:`.detect`: bends at most points → smooth; the smooth learner then picks GELU, tanh-GELU or SiLU by fit).
Gated units (SwiGLU, GeGLU) are recognised by their quadratic growth and refused with the reason.
"""

from __future__ import annotations

import numpy as np

from attnprobe.errors import ConfigError
from attnprobe.learners.ffn import extract_ffn
from attnprobe.learners.smooth_ffn.derivatives import Asker
from attnprobe.learners.smooth_ffn.detect import growth, smooth_bends
from attnprobe.models.smooth_ffn import ACTIVATIONS

GATED = ("swiglu", "geglu")
#: every value of the activation option
CHOICES = ("relu", *ACTIVATIONS, *GATED)
#: growth exponent above which the units are taken to be gated (1 plain, 2 gated)
GATED_GROWTH = 1.5


def _gated_refusal(what: str) -> ConfigError:
    return ConfigError(f"{what}: gated units (SwiGLU, GeGLU) are not learned yet — their second derivatives pair "
                       "each neuron's gate and up projections in a block that simultaneous diagonalisation cannot "
                       "split (docs/smooth-ffn.md); nothing was extracted", param="activation")


def extract_ffn_any(oracle, *, seed: int = 0, progress=None, activation: str | None = None,
                    hidden: int | None = None, bias: bool = True, sign_time_limit: float = 5.0):
    """Run the FFN learner the activation calls for (detected when ``activation`` is None)."""
    if activation is not None and activation not in CHOICES:
        raise ConfigError(f"The 'activation' parameter must be one of {', '.join(CHOICES)}; got {activation!r}",
                          param="activation")
    if activation in GATED:
        raise _gated_refusal(f"activation {activation}")
    test: dict = {}
    before = oracle.queries
    if activation is None:
        rng = np.random.default_rng([int(seed), 7])
        ask = Asker(oracle, reserve=64)
        with oracle.phase("activation_test"):
            smooth, share = smooth_bends(ask, oracle.d, oracle.eps, rng)
            test = {"bending_share": share}
            if smooth:
                test["growth"] = g = growth(ask, oracle.d, rng)
                if g > GATED_GROWTH:
                    raise _gated_refusal(f"the answers grow like |x|^{g:.2f} along rays (gated units)")
        activation = None if smooth else "relu"
        test["smooth"] = bool(smooth)
    if activation == "relu":
        res = extract_ffn(oracle, seed=seed, progress=progress, sign_time_limit=sign_time_limit, bias=bias,
                          hidden=hidden)
    else:
        from attnprobe.learners.smooth_ffn.learner import extract_smooth_ffn

        res = extract_smooth_ffn(oracle, seed=seed, progress=progress, activation=activation, hidden=hidden,
                                 bias=bias)
    return _with_test(res, test, oracle.queries - before - res.queries - (res.check.queries if res.check else 0))


def ffn_any_estimate(s, relu_estimate):
    """The ``ffn`` learner's query estimate: the smooth learner's plan for a smooth activation, refused for gated
    units, else ``relu_estimate`` (the ReLU learner's; also taken when the activation is not given)."""
    act = s.option("activation")
    if act in GATED:
        raise _gated_refusal(f"activation {act}")
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
