"""The generic multi-head learner: saturated values, isolated heads, switched-off cross components."""

import numpy as np
import pytest

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.multihead.generic import extract_generic
from attnprobe.learners.multihead.isolation import IsolatedHead
from attnprobe.models.attention import AttentionHead
from attnprobe.models.multihead import MultiHeadAttention, match_heads
from attnprobe.oracles.base import Oracle
from attnprobe.targets.multihead import random_multihead, shared_attention_multihead


@pytest.mark.parametrize("d,H,d_h,seed", [(8, 2, None, 0), (8, 4, 8, 1), (12, 3, 12, 2), (16, 4, 4, 3),
                                          (16, 2, 16, 4)])
def test_generic_heads_recovered_up_to_permutation(d, H, d_h, seed):
    target = random_multihead(d, H, d_h, seed=seed)
    oracle = Oracle(target, d)
    res = extract_generic(oracle, seed=seed)
    assert res.model.H == H
    match = match_heads(target, res.model)
    assert match.worst <= 1e-6, match.as_dict()
    assert match.c <= 1e-9
    assert res.check.passed and res.check.error <= 1e-8
    # exact accounting: every oracle query is in one phase or in the check, and the paper's bound holds
    assert sum(res.queries_by_phase.values()) == res.queries
    assert res.queries + res.check.queries == oracle.queries
    assert res.queries <= MultiHeadAttention.query_bound(d, H)
    # the cross stage asks exactly H probes per head and last token, twice (the 4L repeat): last tokens are 0 and a
    # basis of W_h's row space (its numerical rank, at least d_h), or all of R^d when P_h W_h is full rank on the
    # (d−H+1)-dim S_h. The rank is read from the answers, so the count is bounded, not pinned
    r = d_h or d // H
    cross = res.queries_by_phase["cross"]
    assert cross % (2 * H) == 0
    assert H * 2 * H * (min(r, d - H + 1) + 1) <= cross <= H * 2 * H * (d + 1)
    assert set(res.queries_by_phase) == {"values", "isolated", "cross"}


def test_without_biases():
    target = random_multihead(10, 3, 10, seed=5, bias=False)
    res = extract_generic(Oracle(target, 10), bias=False, seed=1)
    match = match_heads(target, res.model)
    assert match.worst <= 1e-6
    assert np.all(res.model.u == 0) and res.model.c == 0


def test_isolated_head_is_exactly_a_single_head():
    """f(X') − x_Nᵀ(Σv − P_h v_h) equals the head (P_h W_h, P_h v_h, P_h u_h, c) on sequences of any length."""
    target = random_multihead(9, 3, 9, seed=7)
    iso = IsolatedHead(Oracle(target, 9), target.v, 1, target.v.sum(0))
    P = iso.P
    head = AttentionHead(P @ target.W[1], P @ target.v[1], P @ target.u[1], target.c)
    rng = np.random.default_rng(0)
    for N in (1, 2, 5):
        X = rng.standard_normal((6, N, 9))
        np.testing.assert_allclose(iso(X), head(X), rtol=1e-12, atol=1e-12)


def test_tied_heads_merge_with_a_note():
    """Prop. 7.1: heads sharing W and u cannot be split; they come back as one head computing the same f."""
    target = shared_attention_multihead(10, 3, tied=2, seed=3)
    oracle = Oracle(target, 10)
    res = extract_generic(oracle, heads=3, seed=0)
    assert res.model.H == 2
    assert any("merge" in n for n in res.notes)
    X = np.random.default_rng(1).standard_normal((64, 4, 10))
    gap = np.abs(res.model(X) - target(X)).max() / np.abs(target(X)).max()
    assert gap <= 1e-8
    tied_v = target.v[:2].sum(0)
    assert min(np.linalg.norm(res.model.v - tied_v, axis=1)) <= 1e-8 * np.linalg.norm(tied_v)


def test_too_many_heads_for_the_width_is_refused():
    target = random_multihead(7, 4, 7, seed=0)  # found H = 4 heads, but the switch-off probe needs d ≥ 2H
    with pytest.raises(UnidentifiableError, match="d ≥ 2H"):
        extract_generic(Oracle(target, 7))
    with pytest.raises(UnidentifiableError, match="at most 3 heads"):  # refused before any query
        extract_generic(Oracle(target, 7, budget=0), heads=4)


def test_max_heads_is_enforced():
    target = random_multihead(12, 3, 12, seed=0)
    with pytest.raises(UnidentifiableError, match="max_heads"):
        extract_generic(Oracle(target, 12), max_heads=2)


def test_attention_that_ignores_the_probe_is_refused():
    """W = 0 and u = 0: every head attends uniformly, F is linear, the heads cannot be told apart."""
    target = MultiHeadAttention(np.zeros((2, 6, 6)), np.random.default_rng(0).standard_normal((2, 6)))
    with pytest.raises(UnidentifiableError, match="linear in the probe"):
        extract_generic(Oracle(target, 6))


def test_torch_multihead_attention_layer():
    """A real ``torch.nn.MultiheadAttention`` (float64, biases, d_h = d/H) read at one output row."""
    import torch

    from attnprobe.oracles.torch_adapter import oracle_from_torch
    from attnprobe.oracles.torch_multihead import TorchMultiheadRow, multihead_from_torch

    torch.manual_seed(3)
    module = TorchMultiheadRow(12, 3, row=2)
    with torch.no_grad():
        module.attn.in_proj_bias.normal_(0, 0.5)  # torch initialises the biases to 0: make u_h and c visible
        module.attn.out_proj.bias.normal_(0, 0.5)
    truth = multihead_from_torch(module)
    res = extract_generic(oracle_from_torch(module, 12), seed=0)
    assert res.model.H == 3
    assert match_heads(truth, res.model).worst <= 1e-6
    assert res.check.passed


def test_budget_is_refused_before_the_first_query():
    from attnprobe.errors import BudgetExceededError

    target = random_multihead(16, 2, 16, seed=0)
    oracle = Oracle(target, 16, budget=50)
    with pytest.raises(BudgetExceededError):
        extract_generic(oracle)
    assert oracle.queries == 0


def test_cli_generic_multihead_with_the_head_dimension_given(tmp_path):
    """--rank reaches the generic learner: every isolated head is sketched at rank d_h, heads recovered exactly."""
    import json

    from attnprobe.cli import main
    from attnprobe.models import load_model, save_model
    from attnprobe.models.multihead import match_heads
    from attnprobe.targets import random_multihead

    truth = random_multihead(16, 2, 4, seed=5)
    t = save_model(truth, tmp_path / "layer.npz")
    out = tmp_path / "got.npz"
    assert main(["extract", "--target", str(t), "--method", "multihead", "--rank", "4", "--quiet",
                 "--out", str(out)]) == 0
    got = load_model(out)
    assert match_heads(truth, got).worst <= 1e-6
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["passed"] is True
    assert sum(summary["queries_by_phase"].values()) == summary["queries"] <= 4 * 2 * 16**2 - 2 * 2 + 1


def _column(fn):
    """The same oracle answering one output per sequence as a column (B, 1)."""
    return lambda X: fn(X)[:, None]


@pytest.mark.parametrize("method", ["exact", "lowrank", "generic", "orthogonal", "subspaces"])
def test_one_output_column_answers_work_like_scalars(method):
    """Answers of shape (B, 1) (a vector with K = 1) give every scalar learner the result (B,) answers give."""
    from attnprobe.learners import extract_exact, extract_lowrank
    from attnprobe.learners.multihead import extract_multihead
    from attnprobe.targets import random_head
    from attnprobe.targets.multihead import random_orthogonal_multihead

    if method in ("exact", "lowrank"):
        target = random_head(8, seed=0)
        learn = extract_exact if method == "exact" else extract_lowrank
    else:
        target, E = random_orthogonal_multihead(8, 2, seed=0)
        def learn(o, seed=0):
            return extract_multihead(o, method=method, subspaces=E if method == "subspaces" else None, seed=seed)
    flat, col = learn(Oracle(target, 8), seed=0), learn(Oracle(_column(target), 8), seed=0)
    assert col.check.passed and col.check.error <= 1e-8
    assert col.queries == flat.queries
    np.testing.assert_allclose(col.model.W, flat.model.W, rtol=0, atol=1e-12)


def test_several_outputs_are_refused_by_a_scalar_learner_in_one_line():
    from attnprobe.errors import OracleAnswerError

    target = random_multihead(8, 2, seed=0)
    oracle = Oracle(lambda X: np.stack([target(X), 2 * target(X)], axis=1), 8)
    with pytest.raises(OracleAnswerError, match="answers 2 outputs per sequence.*multi-head learner") as err:
        extract_generic(oracle)
    assert "\n" not in str(err.value)


def test_tied_heads_merge_with_a_note_even_when_heads_is_not_given():
    target = shared_attention_multihead(10, 3, tied=2, seed=3)
    res = extract_generic(Oracle(target, 10), seed=0)
    assert res.model.H == 2 and res.check.passed
    assert any("Prop. 7.1" in n and "more heads than found" in n for n in res.notes)


@pytest.mark.parametrize("bias", [True, False])
def test_three_heads_sharing_one_attention_stay_within_the_query_bound(bias):
    """Prop. 7.1 at d = 8: every adaptive stage is bounded (the values stage once bisected rounding for 10M queries
    when the whole probe grid fell in the all-heads-off cone)."""
    bound = MultiHeadAttention.query_bound(8, 3)
    for seed in range(4):
        target = shared_attention_multihead(8, 3, tied=3, seed=seed, bias=bias)
        oracle = Oracle(target, 8, budget=bound + 40)
        res = extract_generic(oracle, bias=bias, seed=seed)
        assert res.model.H == 1 and res.check.passed
        assert res.queries <= bound


def test_crossing_search_is_bounded_on_answers_that_are_not_piecewise_linear():
    from attnprobe.errors import RecoveryError
    from attnprobe.learners.multihead import saturation

    target = random_multihead(8, 2, seed=0)
    rng = np.random.default_rng(0)
    oracle = Oracle(lambda X: target(X) * (1 + 1e-3 * rng.standard_normal(len(X))), 8, budget=20_000)
    circle = saturation.Circle(oracle, np.zeros(8), np.eye(8)[0], np.eye(8)[1], target(np.zeros((1, 2, 8)))[0],
                                float(np.linalg.norm(target.v.sum(0))))
    with pytest.raises(RecoveryError, match="change their linear piece more than"):
        saturation.find_crossings(circle, 1e12, target.v.sum(0), max_crossings=2)
    assert oracle.queries < 2_000


def _true_worst(target, res):
    return match_heads(target, res.model).worst if res.model.H == target.H else np.inf


@pytest.mark.parametrize("d,H", [(16, 2), (32, 4), (64, 4)])
def test_float32_answers_pass_only_with_heads_within_the_reported_error(d, H):
    """Float32 answers: a result that passes has every head (W, v) within the check's error (the per-head check),
    and a refusal names the precision, never a rank, a seed or a bias."""
    from attnprobe.errors import AttnprobeError

    passed = 0
    for seed in range(3):
        target = random_multihead(d, H, seed=seed)
        try:
            res = extract_generic(Oracle(target.with_dtype("float32"), d, precision="float32"), seed=seed)
        except AttnprobeError as exc:
            assert "float32" in str(exc) and not any(w in str(exc) for w in ("seed", "rank", "bias"))
            continue
        m = match_heads(target, res.model)
        assert max(np.max(m.W), np.max(m.v)) <= res.check.error  # the check's error covers every head
        assert len(res.check.extra["heads"]["bound"]) == res.model.H
        passed += res.check.passed
    assert passed >= 1


def test_a_head_worse_than_the_tolerance_fails_the_check():
    """The layer's output can hide a head 1e-3 off at float64 precision; the per-head check does not."""
    from attnprobe.learners.multihead.headcheck import check_heads

    target = random_multihead(16, 2, seed=0)
    wrong = MultiHeadAttention(target.W + 1e-3 * np.linalg.norm(target.W[0]) / 16 * np.eye(16)[None], target.v,
                               target.u, target.c)
    hc = check_heads(Oracle(target, 16), wrong, np.random.default_rng(0))
    assert np.all(hc.bound >= 1e-3 / 4)  # the perturbation is 1e-3 of ‖W_0‖ in each head, up to its norm ratio
    right = check_heads(Oracle(target, 16), target, np.random.default_rng(0))
    assert np.all(right.bound <= 1e-10) and right.queries == 2 * 16 * 2


def test_head_check_bounds_the_true_head_errors():
    """Simulated recovered layers (every head perturbed by a random relative error): the bound covers the truth."""
    from attnprobe.learners.multihead.headcheck import check_heads

    rng = np.random.default_rng(1)
    for seed in range(6):
        target = random_multihead(24, 3, seed=seed)
        level = 10.0 ** rng.uniform(-9, -3)
        W = target.W * (1 + level * rng.standard_normal(target.W.shape))
        v = target.v * (1 + level * rng.standard_normal(target.v.shape))
        got = MultiHeadAttention(W, v, target.u, target.c)
        m = match_heads(target, got)
        hc = check_heads(Oracle(target, 24), got, rng)
        assert np.all(hc.bound[m.perm] >= np.maximum(m.W, m.v)), (hc.bound, m.W, m.v)
        assert np.all(hc.bound[m.perm] <= 100 * np.maximum(m.W, m.v))


@pytest.mark.parametrize("rel", [1e-12, 1e-10])
def test_undeclared_relative_noise_is_measured_and_named(rel):
    target = random_multihead(16, 2, seed=0)
    rng = np.random.default_rng(0)
    oracle = Oracle(lambda X: target(X) * (1 + rel * rng.standard_normal(len(X))), 16)
    res = extract_generic(oracle, seed=0)
    assert res.check.passed and _true_worst(target, res) <= res.check.error
    assert rel / 100 <= res.details["measured_noise"] <= 100 * rel
    assert any("relative noise of about" in n for n in res.notes)


def test_clipped_inputs_are_detected_and_named():
    from attnprobe.errors import InputNormError

    target = random_multihead(12, 2, seed=0)

    def clipped(X):
        n = np.linalg.norm(X, axis=2, keepdims=True)
        return target(X * np.minimum(1.0, 1e6 / np.maximum(n, 1e-300)))

    oracle = Oracle(clipped, 12)
    with pytest.raises(InputNormError, match="clips inputs at norm ≈ 1e\\+06") as err:
        extract_generic(oracle)
    assert "\n" not in str(err.value) and "W_h y + u_h" not in str(err.value)


def test_max_input_norm_is_respected_or_refused_up_front():
    from attnprobe.errors import SaturationError

    target = random_multihead(12, 2, seed=0)
    oracle = Oracle(target, 12)
    oracle.max_input_norm = 1e6
    with pytest.raises(SaturationError, match="norm at most 1e\\+06.*need norms of at least"):
        extract_generic(oracle)
    assert oracle.queries == 0
    oracle.max_input_norm = 1e9  # room for radius 40 only; this layer saturates at radius 1e4
    with pytest.raises(SaturationError, match="max_input_norm = 1e\\+09 lets the saturated probes") as err:
        extract_generic(oracle)
    assert "W_h y + u_h" not in str(err.value)
    sent = []
    oracle = Oracle(lambda X: (sent.append(float(np.max(np.linalg.norm(X, axis=2)))), target(X))[1], 12)
    oracle.max_input_norm = 1e12
    res = extract_generic(oracle, check=False)
    values = res.queries_by_phase["values"]
    assert max(sent[:values]) <= 1e12 and res.details["max_input_norm_used"] <= 1e12


def test_rank_is_detected_per_head_at_about_the_rank_given_cost():
    """Low-rank heads (d = 32, d_h = 4): the detected head rank is the real one, and detection costs what the
    single-head learner's does: two more range directions (2d queries) per head, not a sketch of every leak."""
    target = random_multihead(32, 4, 4, seed=2)
    given = extract_generic(Oracle(target, 32), rank=4, seed=0)
    found = extract_generic(Oracle(target, 32), seed=0)
    assert found.details["head_rank"] == [4] * 4 == given.details["head_rank"]
    assert found.details["isolated_rank"] == [4] * 4
    assert found.queries <= given.queries + 4 * 2 * 32
    assert _true_worst(target, found) <= 1e-8 and found.check.passed


VICTIM = '''
import numpy as np
from attnprobe.targets.multihead import random_multihead

layer = random_multihead(12, 2, seed=0)


def clipped(X):
    n = np.linalg.norm(X, axis=2, keepdims=True)
    return layer(X * np.minimum(1.0, 1e6 / np.maximum(n, 1e-300)))


def column(X):
    return layer(X)[:, None]
'''


@pytest.mark.parametrize("attr, dtype, code, message", [
    ("clipped", None, 2, "clips inputs at norm"),  # the CLI names the bound it measured
    (None, "float16", 2, "float16 answers overflow for inputs of norm above about 256"),
    ("column", None, 0, None),
])
def test_cli_multihead_refusals_name_the_cause_in_one_line(tmp_path, monkeypatch, capsys, attr, dtype, code,
                                                           message):
    from attnprobe.cli import main
    from attnprobe.models import save_model

    (tmp_path / "mh_victim.py").write_text(VICTIM)
    save_model(random_multihead(12, 2, seed=0), tmp_path / "layer.npz")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    src = ["--oracle", f"mh_victim:{attr}", "--d", "12"] if attr else ["--target", "layer.npz", "--dtype", dtype]
    assert main(["extract", *src, "--method", "multihead", "--quiet", "--out", "x.npz"]) == code
    err = capsys.readouterr().err
    if message:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and message in lines[0], err
        assert not any(w in lines[0] for w in ("seed", "rank", "bias=", "W_h y + u_h = 0"))
        assert not (tmp_path / "x.npz").exists()


def test_values_stage_plan_is_a_lower_bound():
    from attnprobe.learners.multihead.generic import planned_values

    for d, H, tied in [(8, 3, 3), (8, 3, 2), (16, 2, None), (12, 3, None)]:
        target = shared_attention_multihead(d, H, tied=tied, seed=0) if tied else random_multihead(d, H, seed=0)
        res = extract_generic(Oracle(target, d), seed=0)
        assert planned_values(d) <= res.queries_by_phase["values"]


@pytest.mark.parametrize("noise", ["gaussian:1e-9", "gaussian:1e-7", "avq:1e-8"])
def test_declared_answer_noise_reaches_the_cross_stage(noise):
    """Declared noise sets the cross stage's switch-off tolerance (fresh 1e-9 noise used to be refused)."""
    from attnprobe.oracles.chain import AnswerChain

    target = random_multihead(16, 2, seed=0)
    oracle = Oracle(target, 16, chain=AnswerChain(noise=noise, seed=1))
    res = extract_generic(oracle, seed=0)
    assert res.check.passed and _true_worst(target, res) <= res.check.error


@pytest.mark.slow
@pytest.mark.parametrize("layer", range(6))
def test_float32_minilm_layers_are_refused_naming_the_precision(layer):
    """Scalar float32 answers of every real MiniLM-L6 layer: refused in one line that names the precision and the
    value error it left, never a rank, a seed or a bias (run: pytest -m slow)."""
    from attnprobe.errors import RecoveryError
    from attnprobe.targets.minilm import minilm_layer

    target = minilm_layer(layer, 0, dtype="float32")
    with pytest.raises(RecoveryError, match="too coarse.*float32 answers.*value vectors only to") as err:
        extract_generic(Oracle(target, 384, precision="float32"), rank=32)
    assert not any(w in str(err.value) for w in ("seed", "rank", "bias="))
