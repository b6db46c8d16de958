"""The block learner's sublayer oracles (docs/block.md, "The learner") against the truth of a random LLaMA-shaped
pre-norm block: the linear part at 0 and ε, the FFN fed through the norm's inverse, the attention's last row with
the query driven out; the RoPE learner with every query at one rms; the CLI's refusal."""

import math

import numpy as np
import pytest

from attnprobe.errors import BudgetExceededError, ConfigError
from attnprobe.learners.positional.rope import extract_positional
from attnprobe.learners.block.sublayers import (AttentionThroughBlock, FFNThroughBlock, inverse_norm, linear_part,
                                                sqrt_eps)
from attnprobe.models.block import fold_norm_weights
from attnprobe.oracles import Oracle
from attnprobe.targets.block import random_llama_block


@pytest.fixture(scope="module")
def block():
    return random_llama_block(32, 2, 1, 64, seed=0)


@pytest.fixture(scope="module")
def read(block):
    K0 = linear_part(block.every_position, block.d)
    s, misfit = sqrt_eps(block.every_position, K0, np.random.default_rng(0), heads=2)
    return K0, s, misfit


def test_linear_part_and_eps_against_the_truth(block, read):
    K0, s, misfit = read
    assert abs(s / math.sqrt(block.eps) - 1) < 1e-11 and misfit < 1e-10
    f = fold_norm_weights(block)
    M = f.attention.every_position(np.eye(block.d)[:, None, :])[:, 0].T  # M' = M diag(w1) on single tokens
    assert np.abs(s * (K0 - np.eye(block.d)) - M).max() < 1e-9 * np.abs(M).max()


def test_the_norm_inverts_onto_its_ball(block):
    Z = np.random.default_rng(1).standard_normal((4, 3, block.d)) * 0.5
    X = inverse_norm(Z, block.eps)
    assert np.allclose(X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + block.eps), Z, rtol=1e-13, atol=0)
    with pytest.raises(ConfigError, match="rms below 1"):
        inverse_norm(Z * 3, block.eps)


def test_ffn_and_attention_oracles_answer_like_the_sublayers(block, read):
    K0, s, _ = read
    f = fold_norm_weights(block)
    ffn = FFNThroughBlock(block.every_position, s * (K0 - np.eye(block.d)), s * s)
    V = np.random.default_rng(2).standard_normal((32, 1, block.d)) * 0.4
    true = f.mlp(V[:, 0])
    assert np.abs(ffn(V) - true).max() < 1e-8 * np.abs(true).max()
    # the attention oracle on the true FFN (v ↦ F(w2 ⊙ v)): every row through the inverse norm (the query's rms
    # just below 1, so it goes in driven out)
    att = AttentionThroughBlock(block.every_position, f.ffn, s * s, block.d)
    Z = np.random.default_rng(3).standard_normal((8, 9, block.d)) * 0.3
    Z[:, -1] *= att.query_rms * math.sqrt(block.d) / np.linalg.norm(Z[:, -1], axis=1, keepdims=True)
    want = f.attention.every_position(Z)[:, -1]
    assert np.abs(att(Z) - want).max() < 1e-9 * np.abs(want).max()
    with pytest.raises(ConfigError, match="must have rms"):
        att(Z * 0.5)


def test_the_rope_learner_with_fixed_query_rms_on_the_true_attention_and_the_logit_refit(block):
    """Every query of the RoPE learner at one rms (as behind a norm): the logits stage's keys carry the logit scale
    at rms 1/2 (inside the norm's ball; keys of ``ρ²/(√d·rms)``, 1/d of that, read each head's weight off a small
    share of the answer: the function 1.9e-8 off here, the logit matrices ~1e-3 off through a d = 128 block and the
    rotation fit refused, docs/block.md); the function comes out to ~5e-10 (measured 4.6e-10); the per-head logit
    refit (:mod:`attnprobe.learners.block.refine`, its queries at the same rms) keeps it there or better."""
    from attnprobe.learners.block.refine import refit_data, refit_logits

    f = fold_norm_weights(block)
    asked, keys = [], []

    def last_row(X):
        asked.append(np.sqrt(np.mean(X[:, -1] ** 2, axis=1)))
        if X.shape[1] == 65:  # the logits stage's sequences (offsets to −64): their nonzero keys
            rms = np.sqrt(np.mean(X[:, :-1] ** 2, axis=2))
            keys.append(rms[rms > 0])
        return f.attention.every_position(X)[:, -1]

    res = extract_positional(Oracle(last_row, block.d, outputs=block.d, precision="float64"), heads=2, check=False,
                             query_rms=0.75)
    rms = np.concatenate(asked)
    assert np.allclose(rms, 0.75, rtol=1e-12, atol=0)
    keys = np.concatenate(keys)
    assert 0.3 < np.median(keys) <= 0.5 + 1e-12 and keys.max() < 0.98
    Z = np.random.default_rng(4).standard_normal((8, 64, block.d)) * 0.5
    want = f.attention.every_position(Z)
    start = np.abs(res.model.every_position(Z) - want).max() / np.abs(want).max()
    assert start < 5e-9
    asked.clear()
    oracle = Oracle(last_row, block.d, outputs=block.d, precision="float64")
    data = refit_data(oracle, 0.75, res.model.Wq.shape[1], np.random.default_rng(5), 8 * block.d)
    assert oracle.queries == 8 * block.d and np.allclose(np.concatenate(asked), 0.75, rtol=1e-12, atol=0)
    refined, history = refit_logits(res.model, data)
    err = np.abs(refined.every_position(Z) - want).max() / np.abs(want).max()
    assert err < 1e-9 and err < start
    assert all(h[-1] <= h[0] for h in history)


def test_method_block_without_heads_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    import sys

    from attnprobe.cli import main

    asked = tmp_path / "asked"
    (tmp_path / "block_heads_victim.py").write_text(f"import numpy as np\ndef f(X):\n    open({str(asked)!r}, 'w')\n"
                                                    "    return np.asarray(X)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "block_heads_victim", raising=False)
    assert main(["extract", "--oracle", "block_heads_victim:f", "--d", "32", "--method", "block", "--out",
                 str(tmp_path / "r.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--method block needs --heads" in err
    assert not asked.exists()  # refused before the first query


def test_the_attention_polish_data_reaches_every_checked_length_at_the_blocks_row_scale():
    """The polish's sequences (its fast twin): every length the check reads within 1.5× of one asked, keys inside
    the rows the attention oracle reaches, the query at its rms, and at least 2 numbers per unknown."""
    from attnprobe.learners.block.learner import CHECK_LENGTHS
    from attnprobe.learners.block.polish import KEY_RMS, polish_data, polish_sequences

    asked = []
    n = polish_sequences(16, 2, 8)
    oracle = Oracle(lambda X: X[:, -1] * 2, 16, outputs=16)
    data = polish_data(oracle, 0.999, np.random.default_rng(0), n)
    for Z, Y in data:
        rms = np.sqrt(np.mean(Z**2, axis=2))
        assert np.allclose(rms[:, -1], 0.999) and Y.shape == (len(Z), 16)
        assert rms[:, :-1].size == 0 or (rms[:, :-1].min() >= KEY_RMS[0] - 1e-12 and rms[:, :-1].max() <= 0.98)
        asked.append(Z.shape[1])
    assert all(min(asked, key=lambda N: abs(N - L)) <= 1.5 * L for L in CHECK_LENGTHS)
    assert sum(len(Z) for Z, _ in data) == n == oracle.queries and n * 16 >= 2 * (4 * 2 * 8 * 16 + 4)


@pytest.mark.slow
def test_the_attention_polish_brings_a_perturbed_attention_back_at_every_length():
    """The block's attention polish (values, logits and frequencies at once) on a RoPE attention answered at one
    query rms, from weights 1e-4 off: the function at rows of rms 1 (the block's), every length up to 64, comes back
    more than 100× closer; the biases stay held."""
    import dataclasses

    from attnprobe.learners.block.polish import polish_data, polish_sequences, polish_through_block
    from attnprobe.targets.positional import random_rope_attention

    truth = random_rope_attention(16, 2, 1, seed=1)
    q = 1 - 5e-9
    oracle = Oracle(lambda X: truth.every_position(X)[:, -1], 16, outputs=16, precision="float64")
    rng = np.random.default_rng(0)
    start = dataclasses.replace(truth, **{k: getattr(truth, k) * (1 + 1e-4 * rng.standard_normal(
        getattr(truth, k).shape)) for k in ("Wq", "Wk", "Wv", "Wo")})
    data = polish_data(oracle, q, rng, polish_sequences(16, 2, truth.Wq.shape[1], per=2))
    got, report = polish_through_block(start, data, rounds=2, cg_steps=20)  # a minute: dense Jacobians
    Z = rng.standard_normal((4, 64, 16))
    Z /= np.sqrt(np.mean(Z**2, axis=2, keepdims=True))
    want = truth.every_position(Z)

    def err(m):
        return np.abs(m.every_position(Z) - want).max() / np.abs(want).max()

    assert err(got) < err(start) / 100 and report.misfit_after < report.misfit_before / 100
    assert np.array_equal(got.bo, start.bo)


def test_the_ffn_oracle_takes_the_smallest_token_where_the_scale_equation_has_several_roots():
    """d = 64: some FFN inputs are reached both by a large token cancelled by its own attention (``x ≈ −M' n1(x)``,
    digits lost to rounding) and by a small one; the oracle must take the small one (the largest root κ)."""
    blk = random_llama_block(64, 4, 2, 128, seed=0)
    f = fold_norm_weights(blk)
    M = f.attention.every_position(np.eye(64)[:, None, :])[:, 0].T
    ffn = FFNThroughBlock(blk.every_position, M, blk.eps)
    V = np.random.default_rng(1).standard_normal((256, 1, 64)) * 0.4
    true = f.mlp(V[:, 0])
    assert np.abs(ffn(V) - true).max() < 1e-10 * np.abs(true).max()  # 5.8e-10 at the large tokens
    kappa = 1 / np.sqrt(np.mean(ffn.token_for(inverse_norm(V[:, 0], blk.eps)) ** 2, axis=1) + blk.eps)
    assert kappa.min() * math.sqrt(blk.eps) > 0.005  # 0.0013 at the large tokens


def test_the_ffn_oracles_token_solves_the_first_sublayer_to_rounding(monkeypatch):
    """d = 32, GQA (``M'`` of rank 16 < d): the token ``x`` sent for an FFN input reaches ``h = x + M' n1(x)`` near
    rounding — the scale equation's root alone leaves a few 1e-12 of ``h`` (the token is several times ``h``, its
    attention cancelling it), the Newton steps on the d equations take the median row below 1e-12 — and the oracle
    answers the true FFN at rms 0.5 inputs to 3e-12 (4.5e-12 without the steps; measured, 1e-11 at d = 128)."""
    import attnprobe.learners.block.sublayers as sub

    blk = random_llama_block(32, 2, 1, 64, seed=2)
    f = fold_norm_weights(blk)
    M = f.attention.every_position(np.eye(32)[:, None, :])[:, 0].T
    V = np.random.default_rng(1).standard_normal((256, 32)) * 0.5
    H = inverse_norm(V, blk.eps)
    true = f.mlp(V)
    misses = {}
    for steps in (0, sub.REFINE_STEPS):
        monkeypatch.setattr(sub, "REFINE_STEPS", steps)
        ffn = FFNThroughBlock(blk.every_position, M, blk.eps)
        assert len(ffn.lam) == 16  # M' read on its range: rank G·d_h
        X = ffn.token_for(H)
        reached = X + (X / np.sqrt(np.mean(X * X, axis=1, keepdims=True) + blk.eps)) @ M.T
        misses[steps] = np.median(np.abs(reached - H).max(axis=1) / np.abs(H).max(axis=1))
    assert misses[sub.REFINE_STEPS] < 1e-12 and misses[0] > 2 * misses[sub.REFINE_STEPS]
    assert np.abs(ffn(V[:, None, :]) - true).max() < 3e-12 * np.abs(true).max()


def test_a_served_length_limit_below_the_eps_stage_is_refused_before_any_query(block):
    """A server publishing max_length 1000 cannot take the ε stage's 1,001-row sequences: refused before the first
    query, naming --max-length and the length needed (a limit that suffices is not refused)."""
    from attnprobe.learners.block.learner import extract_block

    class Capped:
        max_length = 1000  # one row short

        def __call__(self, X):
            return block(X)

    oracle = Oracle(Capped(), block.d)
    with pytest.raises(ConfigError, match=r"max_length of 1001 or more") as exc:
        extract_block(oracle, heads=2, hidden=64)
    assert exc.value.param == "max_length" and oracle.queries == 0
    Capped.max_length = 1001  # enough: the run goes on to its plan (here refused by the budget, before a query)
    with pytest.raises(BudgetExceededError):
        extract_block(Oracle(Capped(), block.d, budget=10), heads=2, hidden=64)


def test_a_given_ffn_of_another_shape_or_kind_is_refused_before_any_query(block):
    from attnprobe.learners.block.learner import extract_block

    f = fold_norm_weights(block)
    other = random_llama_block(16, 2, 1, 32, seed=0).ffn
    for bad, name in ((other, "GatedFFN"), (f.attention, "PositionalAttention")):
        oracle = Oracle(block, block.d)
        with pytest.raises(ConfigError, match=f"gated FFN from d = 32.*{name}") as exc:
            extract_block(oracle, heads=2, hidden=64, ffn=bad)
        assert exc.value.param == "ffn" and oracle.queries == 0


def test_a_given_attention_of_another_width_or_kind_is_refused_before_any_query(block):
    from attnprobe.learners.block.learner import extract_block

    f = fold_norm_weights(block)
    other = fold_norm_weights(random_llama_block(16, 2, 1, 32, seed=0)).attention
    for bad, name in ((other, "PositionalAttention"), (f.ffn, "GatedFFN")):
        oracle = Oracle(block, block.d)
        with pytest.raises(ConfigError, match=f"RoPE attention on d = 32.*{name}") as exc:
            extract_block(oracle, heads=2, hidden=64, attention=bad)
        assert exc.value.param == "attention" and oracle.queries == 0


@pytest.mark.slow
def test_a_given_ffn_skips_the_ffn_stage():
    """``extract_block(..., ffn=F)`` with the block's own FFN (as read before, in a run split in two): the FFN stage's
    queries are not asked (the plan's gated-learner share) and the block comes out and passes its check."""
    from attnprobe.learners.block.learner import extract_block

    block = random_llama_block(32, 2, 1, 64, seed=0)
    truth = fold_norm_weights(block).ffn
    res = extract_block(Oracle(block.every_position, 32, outputs=32, precision="float64"), heads=2, hidden=64,
                        ffn=truth)
    assert res.passed and res.check.error < 1e-6
    assert res.details["ffn"]["queries"] == 0 and res.queries < 10_000  # the FFN stage alone asks ~65,000
    X = np.random.default_rng(2).standard_normal((2, 9, 32))
    assert np.array_equal(res.model.mlp(X[:, 0]), truth.forward(X[:, 0]))


def test_a_post_norm_block_is_refused_naming_the_cause_and_a_biased_pre_norm_one_as_biased():
    """A BERT-shaped post-norm block (LayerNorm after each residual, biases) is told apart after 3 single tokens as
    post-norm — its answers stay on the output LayerNorm's surface — and refused at the post-norm route's first
    stage (its ε = 1e-6 puts the rows off the sphere the output norm stage fits: 4(d + 3) more single tokens),
    while the same block laid out pre-norm with LayerNorm biases grows with its input and is refused for its
    biases after 3."""
    import dataclasses

    from attnprobe.errors import UnidentifiableError
    from attnprobe.learners.block.learner import extract_block

    blk = random_llama_block(16, 2, 1, 32, seed=0)
    b = np.random.default_rng(2).standard_normal((2, 16)) * 0.1
    for layout, cause, asked in (("post", "a post-norm block .*: stage output norm", 3 + 4 * 19),
                                 ("pre", "it has biases", 3)):
        victim = dataclasses.replace(blk, layout=layout, norm="layer", norm1_b=b[0], norm2_b=b[1])

        def answers(X, victim=victim):
            return victim.every_position(X)
        answers.positions = "positional"  # declared, as a served block does (no queries spent reading it)
        oracle = Oracle(answers, 16, outputs=16, precision="float64")
        with pytest.raises(UnidentifiableError, match=cause) as exc:
            extract_block(oracle, heads=2, hidden=32)
        assert "\n" not in str(exc.value)
        assert oracle.queries == asked


def test_the_logit_refit_comes_back_from_a_far_start():
    """d = 16, 2/1 heads, the true attention's answers, each head's W_Q and W_K 10 % off entry by entry (log-ratio
    residual ~4): the refit's damped steps bring the function back to rounding (plain Gauss–Newton steps that stop
    when one fails to halve the residual left 2.6e-5, measured)."""
    from attnprobe.learners.block.refine import refit_data, refit_logits
    from attnprobe.models.positional import PositionalAttention

    A = fold_norm_weights(random_llama_block(16, 2, 1, 32, seed=0)).attention
    oracle = Oracle(lambda X: A.every_position(X)[:, -1], 16, outputs=16, precision="float64")
    data = refit_data(oracle, 1.0, A.Wq.shape[1], np.random.default_rng(1), 128)
    rng = np.random.default_rng(5)

    def off(W):
        return W * (1 + 0.1 * rng.standard_normal(W.shape))
    per_head = [A.group(h) for h in range(A.H)]
    start = PositionalAttention(off(A.scale * A.Wq), off(A.Wk[per_head]), A.Wv[per_head], A.Wo, bo=A.bo,
                                position="rope", inv_freq=A.inv_freq, layout="half", scale=1.0, causal=True)
    Z = np.random.default_rng(3).standard_normal((8, 64, 16)) * 0.5
    want = A.every_position(Z)
    assert np.abs(start.every_position(Z) - want).max() > 1e-2 * np.abs(want).max()
    model, history = refit_logits(start, data)
    assert np.abs(model.every_position(Z) - want).max() < 1e-10 * np.abs(want).max()
    assert all(h[-1] < 1e-8 * h[0] for h in history)


def test_the_attention_oracle_takes_the_learned_ffns_error_off_at_each_query(block, read):
    """The attention oracle solves its fixed point on a learned FFN; that FFN's error at the query comes into every
    answer (d = 64: 2e-9, the RoPE learner's rotation fit refused). Given ``M'`` the oracle measures it on the single
    token ``[x_N]`` (whose attention is the value map) and takes it off, leaving the error's change over the answer's
    ``a/T``: here ~1e-9 → well below 1e-10 (measured ~1/T of it). One single-token query per distinct query row, kept
    across calls; a length-1 sequence is its own single token (no extra query)."""
    import dataclasses

    K0, s, _ = read
    f = fold_norm_weights(block)
    rng = np.random.default_rng(7)
    learned = dataclasses.replace(f.ffn, W2=f.ffn.W2 * (1 + 1e-9 * rng.standard_normal(f.ffn.W2.shape)))
    asked = []

    def rows(X):
        asked.append(X.shape)
        return block.every_position(X)

    d = block.d
    plain = AttentionThroughBlock(rows, learned, s * s, d)
    fixed = AttentionThroughBlock(rows, learned, s * s, d, value_map=s * (K0 - np.eye(d)))
    Z = rng.standard_normal((6, 17, d)) * 0.3
    Z[:, 5:-1] = 0  # zero keys, as the sketches ask
    Z[:, -1] *= fixed.query_rms * math.sqrt(d) / np.linalg.norm(Z[:, -1], axis=1, keepdims=True)
    Z = np.concatenate([Z, Z[:2]])  # two query rows asked twice in the batch
    want = f.attention.every_position(Z)[:, -1]
    scale = np.abs(want).max()
    before = np.abs(plain(Z) - want).max() / scale
    asked.clear()
    after = np.abs(fixed(Z) - want).max() / scale
    assert before > 1e-10 and after < before / 5
    assert asked == [Z.shape, (6, 1, d)]  # the 6 distinct query rows, once each
    asked.clear()
    fixed(Z[:3])
    assert asked == [(3, 17, d)]  # kept across calls
    single = Z[:4, -1:]
    asked.clear()
    got = fixed(single)
    assert asked == [(4, 1, d)]
    assert np.abs(got - f.attention.every_position(single)[:, -1]).max() < 1e-11 * scale


@pytest.mark.slow
def test_the_attention_through_a_d64_block_with_an_inexact_ffn_is_read_and_refitted():
    """d = 64 (4/2 heads): the attention stage through the block on an FFN 1e-10 off (as the gated learner reads it
    there) — the RoPE learner's rotation fit was refused without the per-query correction (eigenvalue moduli
    0.999 … 1; measured) — now reads the attention and the logit refit takes it below 1e-7 (measured 2.8e-8 with the
    learned FFN)."""
    import dataclasses

    from attnprobe.learners.block.refine import refit_data, refit_logits

    blk = random_llama_block(64, 4, 2, 128, seed=0)
    f = fold_norm_weights(blk)
    rng = np.random.default_rng(7)
    learned = dataclasses.replace(f.ffn, W2=f.ffn.W2 * (1 + 2e-10 * rng.standard_normal(f.ffn.W2.shape)))
    M = f.attention.every_position(np.eye(64)[:, None, :])[:, 0].T
    att = AttentionThroughBlock(blk.every_position, learned, blk.eps, 64, value_map=M)
    oracle = Oracle(att, 64, outputs=64, precision="float64")
    res = extract_positional(oracle, heads=4, check=False, query_rms=att.query_rms)
    data = refit_data(oracle, att.query_rms, res.model.Wq.shape[1], np.random.default_rng(1), 8 * 64)
    model, _ = refit_logits(res.model, data)
    Z = np.random.default_rng(3).standard_normal((8, 64, 64)) * 0.5
    want = f.attention.every_position(Z)
    assert np.abs(model.every_position(Z) - want).max() < 1e-7 * np.abs(want).max()


@pytest.mark.slow
def test_the_attention_through_a_d128_block_passes_the_rotation_fit():
    """The issue's d = 128 LLaMA layer (8/2 heads), the attention oracle through the block with the true FFN: the RoPE
    learner's rotation fit refused it while the logits stage's keys were of rms ~1/d ("eigenvalue moduli 0.996 … 1";
    logit matrices 6e-4 … 1e-2 off, measured); with keys of rms 1/2 the attention comes out (measured 3.7e-7;
    234 s under load)."""
    blk = random_llama_block(128, 8, 2, 256, seed=0)
    f = fold_norm_weights(blk)
    att = AttentionThroughBlock(blk.every_position, f.ffn, blk.eps, 128)
    res = extract_positional(Oracle(att, 128, outputs=128, precision="float64"), heads=8, check=False,
                             query_rms=att.query_rms)
    Z = np.random.default_rng(3).standard_normal((4, 64, 128)) * 0.5
    want = f.attention.every_position(Z)
    assert np.abs(res.model.every_position(Z) - want).max() < 1e-5 * np.abs(want).max()


class _OffAt:
    """The true block (canonical form) answering ``y + δ`` at one position of one length: an error the check must
    find wherever it hides."""

    def __init__(self, block, length: int, size: float, position: int = 0):
        self.truth, self.length, self.size, self.position = fold_norm_weights(block), length, size, position

    def every_position(self, X):
        y = self.truth.every_position(X)
        if X.shape[1] == self.length:
            y = y.copy()
            y[0, self.position, 0] += self.size * np.abs(y - X).max()
        return y


def test_the_block_check_reads_the_worst_length_and_holds_a_pass_to_its_claim(block):
    """A model right everywhere but 3× the claim off at one entry of one length (N = 21, the worst measured at
    d = 128) fails the check, which names that length; 0.3× the claim off passes. Fails when the check is loosened:
    a few lengths only, an RMS over positions or lengths, a tolerance above the claim."""
    from attnprobe.learners.block.learner import CHECK_LENGTHS, CHECK_PER_LENGTH, CLAIM, every_position_check

    assert set(range(1, 65)) <= set(CHECK_LENGTHS) and CLAIM <= 1e-6  # the Done line: 1e-6 at every length ≤ 64
    oracle = Oracle(block.every_position, block.d, outputs=block.d, precision="float64")
    for size, passes in ((3 * CLAIM, False), (0.3 * CLAIM, True), (0.0, True)):
        check = every_position_check(oracle, _OffAt(block, 21, size, position=7), np.random.default_rng(0),
                                     CHECK_LENGTHS, CHECK_PER_LENGTH)
        assert check.passed is passes and check.tolerance <= CLAIM and check.extra["norm"] == "worst"
        assert check.error == max(check.per_length.values()) and check.error >= size * 0.999
        if not passes:
            assert check.extra["worst_length"] == 21 and check.verdict == "failed"
        else:
            assert check.error <= CLAIM


def test_the_block_check_fails_a_model_answering_nan(block):
    from attnprobe.learners.block.learner import CHECK_PER_LENGTH, every_position_check

    oracle = Oracle(block.every_position, block.d, outputs=block.d, precision="float64")
    check = every_position_check(oracle, _OffAt(block, 2, np.nan), np.random.default_rng(0), (1, 2, 3),
                                 CHECK_PER_LENGTH)
    assert not check.passed
