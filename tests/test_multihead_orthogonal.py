import numpy as np
import pytest

from attnprobe.errors import BudgetExceededError, ConfigError, RecoveryError, SaturationError
from attnprobe.learners.multihead import extract_multihead
from attnprobe.learners.multihead.blocks import simultaneous_blocks
from attnprobe.models import MultiHeadAttention, match_heads
from attnprobe.oracles import Oracle
from attnprobe.targets import orthogonal_subspaces, random_multihead, random_orthogonal_multihead


@pytest.mark.parametrize("H,dh,bias", [(2, 4, True), (3, 3, True), (2, 3, False)])
def test_known_subspaces_recover_every_head(H, dh, bias):
    m, E = random_orthogonal_multihead(H * dh, H, dh, seed=H + dh, bias=bias)
    oracle = Oracle(m, m.d)
    perm = np.roll(np.arange(H), 1)
    res = extract_multihead(oracle, subspaces=E[perm], bias=bias, seed=1)
    match = match_heads(m, res.model)
    assert match.worst < 1e-10 and list(match.perm) == list(np.argsort(perm))
    assert abs(res.model.c - m.c) < 1e-12
    # each head costs exactly what the single-head learner costs in d_h dimensions (+ at most 2 % calibration)
    per_head = dh * dh + 2 * dh + 1 if bias else dh * dh + dh
    assert H * per_head <= res.queries <= H * per_head * 1.02 + H
    assert res.queries == sum(res.details["queries_per_head"]) == res.queries_by_phase["heads"]
    assert res.check.passed and res.check.error < 1e-10


def test_known_subspaces_must_be_orthogonal():
    m = random_multihead(6, 2, 3, seed=0)
    oracle = Oracle(m, 6)
    E = np.random.default_rng(0).standard_normal((2, 6, 3))
    with pytest.raises(ConfigError, match="orthogonal"):
        extract_multihead(oracle, subspaces=E)
    assert oracle.queries == 0


def test_known_subspaces_of_a_generic_layer_fail_the_check():
    """Overlapping heads do not decouple in any subspace: the result must not claim success."""
    m = random_multihead(8, 2, 4, seed=5)
    E = orthogonal_subspaces(8, 2, 4, np.random.default_rng(1))
    oracle = Oracle(m, 8)
    try:
        res = extract_multihead(oracle, subspaces=E)
    except (RecoveryError, SaturationError) as exc:  # the single-head learner may refuse such answers outright
        assert ("softmax" in str(exc) or "saturated" in str(exc)) and oracle.queries > 0
    else:  # or it returns a model, which the check must fail: the layer is far from any sum of decoupled heads
        assert not res.passed and res.check.error > 100 * res.check.tolerance and res.check.error >= 0.1


@pytest.mark.parametrize("H,dh,seed", [(2, 4, 0), (3, 4, 1), (4, 3, 2)])
def test_unknown_orthogonal_subspaces(H, dh, seed):
    """App. C conjecture, implemented: Hessians + finest simultaneous block diagonalisation, H detected."""
    d = H * dh
    m, _ = random_orthogonal_multihead(d, H, dh, seed=seed)
    oracle = Oracle(m, d)
    res = extract_multihead(oracle, method="orthogonal", seed=seed)
    assert res.model.H == H and res.details["blocks"]["sizes"] == [dh] * H
    assert match_heads(m, res.model).worst < 1e-6
    assert res.queries <= MultiHeadAttention.query_bound(d, H)
    assert set(res.queries_by_phase) == {"values", "hessians", "heads"}
    assert sum(res.queries_by_phase.values()) == res.queries
    assert res.check.passed


def test_unknown_orthogonal_subspaces_respect_the_query_bound_when_tight():
    """H = 2, d_h = 8: the bound 4Hd² − 2H + 1 = 2045 does not fit Richardson Hessians everywhere."""
    m, _ = random_orthogonal_multihead(16, 2, 8, seed=3)
    res = extract_multihead(Oracle(m, 16), method="orthogonal", heads=2, seed=3)
    assert res.queries <= MultiHeadAttention.query_bound(16, 2) and sum(res.queries_by_phase.values()) == res.queries
    # each Hessian costs d(d+1)/2 queries, twice with Richardson: the mode of each is chosen to fit the bound
    per = 16 * 17 // 2
    assert res.queries_by_phase["hessians"] == sum(per * (2 if r else 1) for r in res.details["richardson"])
    assert match_heads(m, res.model).worst < 1e-6


def test_budget_too_small_is_refused_up_front():
    m, _ = random_orthogonal_multihead(8, 2, 4, seed=0)
    oracle = Oracle(m, 8, budget=20)
    with pytest.raises(BudgetExceededError):
        extract_multihead(oracle, method="orthogonal")
    assert oracle.queries == 0


def test_block_diagonalisation_of_exact_matrices():
    rng = np.random.default_rng(0)
    E = orthogonal_subspaces(12, 3, 4, rng)
    mats = []
    for _ in range(4):
        blocks = [rng.standard_normal((4, 4)) for _ in range(3)]
        mats.append(sum(E[h] @ (b + b.T) @ E[h].T for h, b in enumerate(blocks)))
    split = simultaneous_blocks(mats, rng)
    assert [b.shape[1] for b in split.bases] == [4, 4, 4] and split.kernel.shape[1] == 0
    for B in split.bases:
        assert min(np.linalg.norm(B - Et @ (Et.T @ B), 2) for Et in E) < 1e-10


def test_cli_target_extract_verify_multihead(tmp_path, capsys):
    import json

    from attnprobe.cli import main
    from attnprobe.models import load_model

    t = tmp_path / "mh.npz"
    assert main(["target", "multihead", "--d", "8", "--heads", "2", "--head-dim", "4", "--orthogonal",
                 "--seed", "4", "--out", str(t)]) == 0
    sub = tmp_path / "mh_subspaces.npz"
    assert sub.exists()
    out = tmp_path / "known.npz"
    assert main(["extract", "--target", str(t), "--method", "multihead", "--subspaces", str(sub), "--out", str(out),
                 "--quiet"]) == 0
    assert load_model(out).kind == "multi_head"
    out2 = tmp_path / "unknown.npz"
    assert main(["extract", "--target", str(t), "--method", "multihead", "--heads", "2",
                 "--multihead-learner", "orthogonal", "--out", str(out2), "--quiet"]) == 0
    summary = json.loads(out2.with_suffix(".json").read_text())
    assert summary["kind"] == "multi_head" and summary["check"]["passed"]
    assert summary["queries"] <= 4 * 2 * 64 - 2 * 2 + 1
    capsys.readouterr()
    js = tmp_path / "errs.json"
    assert main(["verify", "--target", str(t), "--result", str(out2), "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    assert "worst_head" in printed
    errs = json.loads(js.read_text())
    assert errs["heads_found"] == 2 and errs["worst_head"] < 1e-6


def test_cli_multihead_options_need_the_multihead_method(tmp_path, capsys):
    from attnprobe.cli import main
    from attnprobe.models import save_model

    t = save_model(random_multihead(4, 2, seed=0), tmp_path / "t.npz")
    assert main(["extract", "--target", str(t), "--heads", "2", "--out", str(tmp_path / "o.npz")]) == 2
    assert "--heads (it is for --method block / multihead" in capsys.readouterr().err


def test_dispatcher_refuses_contradictory_options():
    m, E = random_orthogonal_multihead(8, 2, 4, seed=0)
    oracle = Oracle(m, 8)
    with pytest.raises(ConfigError, match="unknown multi-head method"):
        extract_multihead(oracle, method="magic")
    with pytest.raises(ConfigError, match="not both"):
        extract_multihead(oracle, heads=2, max_heads=3)
    with pytest.raises(ConfigError, match="heads=3 but 2 subspaces"):
        extract_multihead(oracle, subspaces=E, heads=3)
    with pytest.raises(ConfigError, match="would ignore them"):
        extract_multihead(oracle, subspaces=E, method="orthogonal")
    assert oracle.queries == 0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_default_learner_recovers_heads_in_orthogonal_subspaces_without_bias(seed):
    """The default (``auto``) learner on heads in mutually orthogonal subspaces (d = 32, H = 4, no bias): the other
    heads' W_g vanish on head h's rows, so the cross stage offsets its last tokens to switch them off."""
    from attnprobe.models.multihead import match_heads

    m, _ = random_orthogonal_multihead(32, 4, seed=seed, bias=False)
    res = extract_multihead(Oracle(m, 32), bias=False, seed=seed)
    assert res.method == "multihead-generic" and res.check.passed
    assert match_heads(m, res.model).worst <= 1e-6
    assert res.queries <= m.query_bound(32, 4)


def test_auto_falls_back_to_orthogonal_subspaces_when_the_generic_learner_fails(monkeypatch):
    from attnprobe.errors import RecoveryError
    from attnprobe.learners.multihead import generic
    from attnprobe.models.multihead import match_heads

    def broken(oracle, **kw):
        oracle(np.zeros((5, 1, oracle.d)))
        raise RecoveryError("the generic learner failed on purpose")

    monkeypatch.setattr(generic, "extract_generic", broken)
    m, _ = random_orthogonal_multihead(8, 2, 4, seed=0)
    oracle = Oracle(m, 8)
    res = extract_multihead(oracle, heads=2)
    assert res.method == "multihead-orthogonal" and res.check.passed
    assert match_heads(m, res.model).worst <= 1e-6
    assert any("generic multi-head learner failed after 5 queries" in n for n in res.notes)
    assert res.queries_by_phase["generic"] == 5 and sum(res.queries_by_phase.values()) == res.queries
    assert res.queries + res.check.queries == oracle.queries
    with pytest.raises(RecoveryError, match="on purpose"):  # an explicit method never falls back
        extract_multihead(Oracle(m, 8), method="generic")


@pytest.mark.parametrize("d, cause", [(8, "precision"), (72, "width")])
def test_auto_does_not_fall_back_on_a_precision_refusal_or_a_wide_layer(monkeypatch, d, cause):
    """Coarse answers defeat the orthogonal learner too, and its Hessians cost ~d³/(2H) queries past d = 64."""
    from attnprobe.errors import RecoveryError
    from attnprobe.learners.multihead import generic

    def broken(oracle, **kw):
        oracle(np.zeros((5, 1, oracle.d)))
        raise generic.precision_error("too coarse") if cause == "precision" else RecoveryError("generic failed")

    monkeypatch.setattr(generic, "extract_generic", broken)
    m, _ = random_orthogonal_multihead(d, 2, 4, seed=0)
    oracle = Oracle(m, d)
    with pytest.raises(RecoveryError, match="too coarse|generic failed"):
        extract_multihead(oracle)
    assert oracle.queries == 1 + 5  # one length-1 query tells scalar from vector answers, then the learner's 5


def test_auto_does_not_fall_back_past_an_input_bound_refused_up_front():
    """A max_input_norm too small for the saturated probes is refused before any query, by auto too."""
    from attnprobe.errors import SaturationError

    m, _ = random_orthogonal_multihead(8, 2, 4, seed=0)
    oracle = Oracle(m, 8, max_input_norm=1e6)
    with pytest.raises(SaturationError, match="norm at most 1e\\+06"):
        extract_multihead(oracle)
    assert oracle.queries == 1  # only the length-1 query (norm 0) that tells scalar from vector answers
