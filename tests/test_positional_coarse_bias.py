"""RoPE with q/k biases (Qwen2) from float32 answers: the coarse route's key probe, the value maps' kernel and the
logit maps with biases (learners/positional/coarse_bias.py; docs/positional.md, "Coarse answers with q/k biases"),
each against the float64 truth of a Qwen2-like layer (GQA, q/k/v/o biases)."""

import math
from dataclasses import replace

import numpy as np
import pytest

from attnprobe.errors import RecoveryError, UnidentifiableError
from attnprobe.learners.head.probes import random_orthogonal
from attnprobe.learners.positional.coarse import (COARSE_STEP, KEY_SETTINGS, coarse_values, key_derivative,
                                                  pair_derivative, probe_directions)
from attnprobe.learners.positional.coarse_bias import biased_logit_maps, coarse_kernel
from attnprobe.learners.positional.heads import head_directions, match
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.models.positional import PositionalAttention
from attnprobe.oracles.base import Oracle
from attnprobe.targets import random_rope_attention

LENGTHS = (1, 2, 3, 5, 17, 64, 256)


def qwen2_like(d: int, H: int, G: int, seed: int = 3) -> PositionalAttention:
    """A random RoPE layer with Qwen2's biases (q, k, v drawn N(0, 0.5²), as ``positional_victim``'s, and b_O)."""
    t = random_rope_attention(d, H, G, seed=seed)
    r = np.random.default_rng(seed + 100)
    dh = d // H
    return replace(t, bq=r.standard_normal((H, dh)) * 0.5, bk=r.standard_normal((G, dh)) * 0.5,
                   bv=r.standard_normal((G, dh)) * 0.5, bo=r.standard_normal(d) * 0.1)


def test_logit_maps_with_biases_recover_the_function_from_exact_head_coordinates():
    """Float64 answers, each head's exact output coordinates: the log-weight differences give ``W_Q``, ``W_K``,
    ``b_Q`` and ``b_K`` (in a gauge) and the function at every length; the biases are half of it."""
    d, H = 16, 2
    truth = qwen2_like(d, H, 1)
    oracle = Oracle(truth, d)
    G = np.repeat(truth.Wv, H, axis=0)
    c = truth.output_bias()
    Wq, Wk, bq, bk, count = biased_logit_maps(oracle, np.random.default_rng(1), truth.Wo, G, c, truth.inv_freq, 1.0)
    assert count == oracle.queries
    model = PositionalAttention(Wq, Wk, G, truth.Wo, bq=bq, bk=bk, bo=c, inv_freq=truth.inv_freq, scale=1.0)
    assert function_error_over_lengths(model, truth, np.random.default_rng(5), LENGTHS) < 1e-6  # measured 9.5e-9
    without = replace(model, bq=None, bk=None)
    assert function_error_over_lengths(without, truth, np.random.default_rng(5), LENGTHS) > 0.1  # measured 0.44


def _directions(oracle, truth, E, jacobian, settings):
    rng = np.random.default_rng(0)
    z = rng.standard_normal(oracle.d)
    W, _, _ = head_directions(oracle, z, E, settings=settings, eta=COARSE_STEP * math.sqrt(oracle.d),
                              rank=truth.H, noise=0.0, rng=rng, jacobian=jacobian)
    V = truth.value_maps()
    true = np.stack([V[h] @ z for h in range(truth.H)], axis=1)
    true /= np.linalg.norm(true, axis=0)
    return float(np.max(np.abs(np.abs(np.sum(match(true, W) * true, axis=0)) - 1)))


def test_key_probe_inside_the_kernel_reads_each_head_where_the_pair_probe_does_not():
    """float32 answers of a Qwen2-like layer (d = 32, 2/1 heads): zero keys weigh unequally (``q̃ᵀR(δ)b_K``), so the
    zero-key pair probe's ``D`` holds every head's value map; one key moved inside the kernel of the averaged
    ``M`` gives each head's direction ``V_h z``."""
    d, H = 32, 2
    truth = qwen2_like(d, H, 1)
    oracle = Oracle(truth.with_dtype("float32"), d, precision="float32")
    rng = np.random.default_rng(2)
    M, _ = coarse_values(oracle, rng, math.sqrt(d))
    kernel = coarse_kernel(M, H)
    E, probe = probe_directions(d, rng, H + 4, kernel)
    assert probe["jacobian"] is key_derivative and probe["settings"] == KEY_SETTINGS
    key = _directions(oracle, truth, E, key_derivative, KEY_SETTINGS)
    assert key < 1e-6  # 1 − |cos|: measured 3.4e-9
    try:  # measured: no head's direction matches (|cos| 0.12)
        pair = _directions(oracle, truth, random_orthogonal(d, rng)[: H + 4], pair_derivative, KEY_SETTINGS)
    except RecoveryError:
        pair = 1.0
    assert pair > 100 * key


def test_the_kernel_of_the_value_maps_from_float32_answers_and_its_refusal():
    d, H = 32, 2
    truth = qwen2_like(d, H, 1)
    oracle = Oracle(truth.with_dtype("float32"), d, precision="float32")
    M, _ = coarse_values(oracle, np.random.default_rng(0), math.sqrt(d))
    kernel = coarse_kernel(M, H)
    exact = truth.value_maps().sum(axis=0)
    assert kernel.shape == (d - d // H, d)  # G·d_h = 16 of 32 dimensions seen by the values
    assert np.linalg.norm(exact @ kernel.T) < 1e-4 * np.linalg.norm(exact)
    dense = qwen2_like(d, H, H)  # a key and value map per head: H·d_h = d, no kernel
    oracle = Oracle(dense.with_dtype("float32"), d, precision="float32")
    M, _ = coarse_values(oracle, np.random.default_rng(0), math.sqrt(d))
    with pytest.raises(UnidentifiableError, match="sharing keys and values"):
        coarse_kernel(M, H)


def test_coarse_start_with_biases_from_float32_answers():
    """The coarse route with q/k biases end to end at a small size (d = 16, 2/1 heads, value maps at 2d queries):
    its start (before the polish) near the float64 truth, the biases in it."""
    from attnprobe.learners.positional.coarse import coarse_queries, extract_coarse_positional

    truth = qwen2_like(16, 2, 1)
    res = extract_coarse_positional(Oracle(truth.with_dtype("float32"), 16, precision="float32"), heads=2, per=2,
                                    biases=True, check=False)
    assert res.details["qk_biases"] is True and "q/k biases" in res.notes[0]
    planned = coarse_queries(16, 2, 16, per=2, biases=True)  # a walk's halved steps ask more
    assert planned <= res.queries_by_phase["coarse start"] <= 1.5 * planned
    assert np.abs(res.model.bk).max() > 0.1 and np.abs(res.model.bq).max() > 0.1
    assert function_error_over_lengths(res.model, truth, np.random.default_rng(5), LENGTHS) < 2e-2  # measured 3.0e-3


@pytest.mark.slow
def test_float32_qwen2_like_answers_are_routed_to_the_coarse_route_with_biases():
    """Read from float32 answers (nothing declared), the zero-query answers spread over the key's position below
    an additive bias's 1e3·√ε (0.35) but far above bias-free RoPE's 0: the coarse route with q/k biases, its start
    near the float64 truth (~5 s; the polish: the slow test below)."""
    from attnprobe.learners.positional.route import extract_any_positional

    d, H = 16, 2
    truth = qwen2_like(d, H, 1)
    oracle = Oracle(truth.with_dtype("float32"), d, precision="float32")
    res = extract_any_positional(oracle, heads=H, seed=0, polish="never")
    assert res.details["route"] == "coarse" and res.details["qk_biases"] is True
    assert "position term rope with q/k biases (read from the answers" in res.notes[-1]
    assert 1e-4 < res.details["position_route"]["zero_query_spread"] < 0.34  # measured 0.29
    assert np.abs(res.model.bk).max() > 0.1 and np.abs(res.model.bq).max() > 0.1
    assert function_error_over_lengths(res.model, truth, np.random.default_rng(5), LENGTHS) < 2e-2  # measured 1.7e-3


@pytest.mark.slow
def test_qwen2_module_from_float32_answers_polished_to_the_float64_function():
    """``transformers``' Qwen2Attention (d = 16, 2/1 heads, q/k/v biases) served in float32, through the route with
    its polish: within 1e-5 of the float64 module at every length up to 256 (measured 7.5e-7, check 9.8e-7, 84,862
    queries; ~6 min on the loaded 2-core machine), the check passed."""
    from attnprobe.learners.positional.route import extract_any_positional
    from attnprobe.oracles.torch_adapter import oracle_from_torch
    from attnprobe.targets.positional_modules import positional_victim, reference_model

    kw = dict(d=16, heads=2, kv_heads=1, seed=0)
    truth = reference_model(positional_victim("qwen2", dtype="float64", **kw))
    oracle = oracle_from_torch(positional_victim("qwen2", dtype="float32", **kw), 16, precision="float32")
    res = extract_any_positional(oracle, heads=2, seed=0)
    assert res.details["qk_biases"] is True and res.details["polish"]["kept"]
    assert res.check.passed and res.check.extra["norm"] == "worst"
    assert function_error_over_lengths(res.model, truth, np.random.default_rng(5), LENGTHS) < 1e-5


def test_bfloat16_qwen2_answers_are_refused_naming_the_precision_and_the_biases():
    """The bfloat16 route reads bias-free heads only: a bfloat16 Qwen2 module whose zero-query answers spread over
    the key's position is refused in one line after the route's eight probe sequences."""
    from attnprobe.learners.positional.route import extract_any_positional

    oracle = Oracle(qwen2_like(16, 2, 1), 16, precision="bfloat16")  # answers rounded to bfloat16
    with pytest.raises(UnidentifiableError) as exc:
        extract_any_positional(oracle, heads=2, polish="never")
    msg = str(exc.value)
    assert msg.startswith("RoPE with q/k biases") and "bfloat16" in msg and "q/k biases from float32" in msg
    assert "\n" not in msg and oracle.queries == 8


@pytest.mark.slow
def test_float32_qwen2_folder_through_the_cli_reads_its_declared_biases(tmp_path, capsys):
    """A float32 Qwen2 folder (d = 16, 2/1 heads, attention weights and biases N(0, 0.3²)): its config declares the
    q/k biases and the heads, and ``extract --hf-dir`` takes the coarse route with biases (before: refused in one
    line); with ``--polish never`` the start is judged by the check (measured exit 3 at 2.1e-3 > 1.2e-3)."""
    pytest.importorskip("transformers")
    from hf_models import tiny_family_dir

    from attnprobe.cli import main

    folder = tiny_family_dir(tmp_path / "m", "qwen2", hidden=16, heads=2, kv_heads=1, layers=1, std=0.3)
    code = main(["extract", "--hf-dir", str(folder), "--layer", "0", "--out", str(tmp_path / "r.npz"), "--polish",
                 "never", "--keep-failed"])
    out = capsys.readouterr().out
    assert "q/k biases: the heads from the key probe" in out and "position term rope with q/k biases" in out
    assert code in (0, 3)
