"""bfloat16 answers and RoPE: the zero-key sweep reads each head's value map where the pair probe cannot
(``learners/positional/sweep.py``), and the bfloat16 route's result is held to its claim
(``learners/positional/bfloat16.py``; docs/positional.md, "bfloat16 answers")."""

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from attnprobe.errors import RecoveryError, UnidentifiableError
from attnprobe.learners.core.estimate import estimate_queries
from attnprobe.learners.positional import extract_positional
from attnprobe.learners.positional.bfloat16 import CLAIM, POLISH_PER, SWEEP_QUERIES, sweep_spaces
from attnprobe.learners.positional.route import claim_verdict
from attnprobe.learners.positional.sweep import (fit_sweep, output_spaces, sweep_answers, sweep_queries,
                                                 sweep_value_maps)
from attnprobe.models.positional import PositionalAttention
from attnprobe.oracles.base import Oracle
from attnprobe.oracles.chain import AnswerChain
from attnprobe.targets import random_rope_attention


def _value_maps(model):
    dh = model.head_dim
    g = model.H // model.G
    return np.stack([model.Wo[:, h * dh:(h + 1) * dh] @ model.Wv[h // g] for h in range(model.H)])


def _matched_errors(U, truth_rows):
    C = np.array([[np.linalg.norm(u - t) / np.linalg.norm(t) for t in truth_rows] for u in U])
    rows, cols = linear_sum_assignment(C)
    return C[rows, cols]


@pytest.mark.parametrize("precision, bound", [("float64", 1e-7), ("bfloat16", 3e-2)])
def test_one_query_sweep_gives_each_heads_direction(precision, bound):
    """``y(n, m) − c = Σ_h S_hm/(n + S_hm) V_h z``: the fit reads every head's ``V_h z`` (exact answers: to the
    fit's tolerance; inputs and answers rounded to bfloat16: within a few %, a head with little weight the worst)."""
    H = 2 if precision == "float64" else 4
    model = random_rope_attention(16, H, 1, seed=3)
    oracle = Oracle(model, 16, chain=AnswerChain(cast=precision)) if precision != "float64" else Oracle(model, 16)
    rng = np.random.default_rng(0)
    z = rng.standard_normal(16) * 2
    U, logS, misfit = fit_sweep(sweep_answers(oracle, z[None])[0], H, rng, starts=3)
    errs = _matched_errors(U, _value_maps(model) @ z)
    assert errs.max() < bound, errs
    assert misfit < (1e-8 if precision == "float64" else 1e-2)
    # the centres at m = 1 are the heads' self-logits zᵀ B_h(0) z; from rounded answers only where the query
    # weighs at least e⁻⁵ of a zero key (below, every centre gives the shape e^b/n: measured 1.0 off at −7.9)
    b = np.sort([z @ (model.scale * model.Wq[h].T @ model.Wk[0]) @ z for h in range(H)])
    seen = b > (-np.inf if precision == "float64" else -5.0)
    assert seen.sum() >= H // 2
    assert np.allclose(np.sort(logS[:, 0])[seen], b[seen], atol=1e-5 if precision == "float64" else 0.3)


def test_a_wrong_shape_does_not_fit():
    """The fit fails loudly on answers that are not a sum of H sweep shapes: with one head fewer than the layer has,
    the misfit stays far above the rounding."""
    model = random_rope_attention(16, 4, 1, seed=3)
    oracle = Oracle(model, 16)
    rng = np.random.default_rng(0)
    z = rng.standard_normal(16) * 2
    _, _, misfit = fit_sweep(sweep_answers(oracle, z[None])[0], 3, rng, starts=3)
    assert misfit > 1e-4


@pytest.mark.slow
def test_sweep_value_maps_at_the_rounding_of_bfloat16():
    """d = 16, 2 heads sharing keys and values: each ``V_h`` from 6d random queries within 1e-2 of the module's
    (bfloat16's rounding of its weights alone is ~3e-3 of them)."""
    model = random_rope_attention(16, 2, 1, seed=3)
    oracle = Oracle(model, 16, chain=AnswerChain(cast="bfloat16"))  # inputs and answers rounded
    V, misfit = sweep_value_maps(oracle, np.zeros(16), 2, np.random.default_rng(0), per=6)
    errs = _matched_errors(V.reshape(2, -1), _value_maps(model).reshape(2, -1))
    assert errs.max() < 1e-2, errs


def test_the_verdict_refuses_a_result_above_its_claim_naming_precision_and_claim():
    """The hook's verdict (``route.claim_verdict``) for any route that claims an error: kept within the claim,
    refused above it (or NaN) in one line naming the precision and the claim; a check in another norm does not
    bound the claim; a route without a claim is not held to one."""
    class Check:
        def __init__(self, error, norm):
            self.error, self.extra = error, {"norm": norm}

    class Result:
        def __init__(self, error, claim, norm="worst"):
            self.check = Check(error, norm)
            self.details = {"route": "bfloat16"} | ({} if claim is None else {"claim": claim})

    class Answers:
        precision = "bfloat16"

    claim = {"error": CLAIM, "norm": "worst"}
    claim_verdict(Answers(), Result(CLAIM / 2, claim))  # within the claim: kept
    claim_verdict(Answers(), Result(0.5, None))  # no claim: the functional check's own verdict stands
    for error in (2 * CLAIM, float("nan")):
        with pytest.raises(UnidentifiableError) as exc:
            claim_verdict(Answers(), Result(error, claim))
        assert "bfloat16" in str(exc.value) and f"{CLAIM:.0e}" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(RecoveryError, match="does not bound"):
        claim_verdict(Answers(), Result(CLAIM / 2, claim, norm="rms"))


def test_noisy_or_coarser_answers_are_refused_before_any_query():
    model = random_rope_attention(32, 2, 1, seed=5)
    noisy = Oracle(model, 32, chain=AnswerChain(noise="gaussian:0.001", seed=1))
    with pytest.raises(UnidentifiableError, match="bfloat16") as exc:
        extract_positional(noisy, heads=2)
    assert "\n" not in str(exc.value)


def test_estimate_prices_the_bfloat16_route():
    """The bfloat16 route's plan: at least the sweep's queries and its polish's fresh sequences; coarser answers
    than bfloat16 (none: float16 is finer) and noisy ones have no plan."""
    bf16 = estimate_queries("positional", 32, precision="bfloat16", heads=2)
    unknowns = PositionalAttention.unknowns(32, 2, 2, 16, 32)
    assert bf16.queries >= sweep_queries(32, 2, 32, per=SWEEP_QUERIES, spaces=sweep_spaces(2))
    assert bf16.high >= bf16.queries + POLISH_PER * -(-unknowns // 32)
    assert f"{POLISH_PER}·⌈unknowns/K⌉" in bf16.basis  # the plan says the route's own factor, not the hook's


@pytest.mark.parametrize("d, H, G, causes", [(128, 8, 2, ("8 heads", "d_h·d = 2048")), (16, 4, 1, ("4 heads",)),
                                             (64, 2, 1, ("d_h·d = 2048",))])
def test_layers_the_route_cannot_start_are_refused_in_one_line_before_any_query(d, H, G, causes):
    """More than two heads (the sweep's value maps ~3 % off) or heads with d_h·d above DENSE_ALS (the logit maps'
    sequences) are refused before any query, in one line naming bfloat16 and each cause that applies — LLaMA
    d = 128, 8/2 both — and the estimate has no plan for them; d = 32, 2/1 runs."""
    from attnprobe.errors import ConfigError
    from attnprobe.learners.positional.bfloat16 import bfloat16_refusal, extract_bfloat16_positional

    assert bfloat16_refusal(32, 2) is None
    oracle = Oracle(random_rope_attention(d, H, G, seed=1), d, chain=AnswerChain(cast="bfloat16"))
    with pytest.raises(UnidentifiableError) as exc:
        extract_bfloat16_positional(oracle, heads=H)
    msg = str(exc.value)
    assert msg.startswith("bfloat16 answers") and all(c in msg for c in causes) and "\n" not in msg
    assert ("polish's reach" in msg) == (H > 2) and ("10⁵" in msg) == ("d_h·d = 2048" in causes)
    assert oracle.queries == 0
    with pytest.raises(ConfigError, match="not recovered at bfloat16"):
        estimate_queries("positional", d, precision="bfloat16", heads=H)


@pytest.mark.slow
def test_the_route_on_a_bfloat16_llama_keeps_only_what_it_claims():
    """A ``transformers`` LLaMA served in bfloat16 (d = 16, 2/1 heads) through the positional method: either a model
    whose check is within the claim — and then within 3e-2 of the float64 module at every length up to 256 — or a
    one-line refusal naming bfloat16. Never a kept model farther than it claims."""
    from attnprobe.learners.positional.route import extract_any_positional
    from attnprobe.models.compare import function_error_over_lengths
    from attnprobe.oracles.torch_adapter import oracle_from_torch
    from attnprobe.targets.positional_modules import positional_victim, reference_model

    kw = dict(d=16, heads=2, kv_heads=1, seed=0)
    truth = reference_model(positional_victim("llama", dtype="float64", **kw))
    oracle = oracle_from_torch(positional_victim("llama", dtype="bfloat16", **kw), 16, precision="bfloat16")
    try:
        res = extract_any_positional(oracle, heads=2, seed=0)
    except UnidentifiableError as exc:
        assert "bfloat16" in str(exc) and "\n" not in str(exc)
        return
    assert res.details["route"] == "bfloat16" and res.check.error <= CLAIM
    assert res.details["claim"] == {"error": CLAIM, "norm": "worst", "cause": res.details["claim"]["cause"]}
    err = function_error_over_lengths(res.model, truth, np.random.default_rng(5), (1, 2, 8, 64, 256))
    assert err < 3e-2


def _random_spaces(rng, H, K, dh):
    return np.stack([np.linalg.qr(rng.standard_normal((K, dh)))[0] for _ in range(H)])


def _space_errors(C, truth):
    """Largest sine of a principal angle between each recovered space and the truth's, heads matched."""
    E = np.array([[np.linalg.norm(t - c @ (c.T @ t), 2) for t in truth] for c in C])
    rows, cols = linear_sum_assignment(E)
    return E[rows, cols]


def test_output_spaces_from_shuffled_noisy_directions():
    """Each head's output space from one direction per head and query, labels shuffled, rough spaces 0.3 off and
    one query in eight a direction from nowhere: relabelled by the spaces and the outliers dropped, the spaces come
    to the directions' noise (1e-3), far inside the rough ones."""
    rng = np.random.default_rng(4)
    H, K, dh, N = 4, 16, 4, 48
    truth = _random_spaces(rng, H, K, dh)
    S = np.einsum("hkj,nhj->nhk", truth, rng.standard_normal((N, H, dh)))
    S += 1e-3 * np.linalg.norm(S, axis=2, keepdims=True) * rng.standard_normal(S.shape) / np.sqrt(K)
    S[::8, 0] = rng.standard_normal((N // 8 + (N % 8 > 0), K)) * np.linalg.norm(S[::8, 0], axis=1, keepdims=True)
    S = np.stack([s[rng.permutation(H)] for s in S])
    rough = np.stack([np.linalg.qr(t + 0.3 * rng.standard_normal(t.shape) / np.sqrt(dh))[0] for t in truth])
    assert _space_errors(rough, truth).min() > 0.1
    errs = _space_errors(output_spaces(S, rough), truth)
    assert errs.max() < 1e-2, errs


def test_output_spaces_refuse_directions_that_fill_no_space():
    rng = np.random.default_rng(5)
    rough = _random_spaces(rng, 4, 16, 4)
    with pytest.raises(RecoveryError, match="output space"):
        output_spaces(rng.standard_normal((3, 4, 16)), rough)  # three directions a head: fewer than d_h = 4


@pytest.mark.slow
def test_sweep_output_spaces_separate_four_heads_sharing_keys_at_bfloat16():
    """d = 16, 4 heads sharing keys and values (they differ only in their queries and outputs), answers rounded
    to bfloat16: the twelve-block sweep at 3·d_h random queries and the output spaces give each ``V_h`` within a
    few % of the module's, for the queries its count says."""
    model = random_rope_attention(16, 4, 1, seed=3)
    oracle = Oracle(model, 16, chain=AnswerChain(cast="bfloat16"))  # inputs and answers rounded
    truth = _value_maps(model)
    V, misfit = sweep_value_maps(oracle, np.zeros(16), 4, np.random.default_rng(0), per=6, M=truth.sum(0), spaces=3)
    errs = _matched_errors(V.reshape(4, -1), truth.reshape(4, -1))
    assert errs.max() < 5e-2, errs
    assert oracle.queries == sweep_queries(16, 4, 16, per=6, spaces=3)


class _RoundedRows:
    """Every row of a causal model, inputs and answers rounded to ``dtype`` (as a bfloat16 layer rounds them)."""

    positions = "causal"

    def __init__(self, model, dtype):
        import ml_dtypes

        self.model, self.cast, self.dtype = model, getattr(ml_dtypes, dtype, np.float64), dtype

    def __call__(self, X):
        X = np.asarray(X, dtype=np.float64).astype(self.cast).astype(np.float64)
        return np.asarray(self.model.every_position(X)).astype(self.cast).astype(np.float64)


@pytest.mark.parametrize("seed", [1, 5])
@pytest.mark.parametrize("precision, bound", [("float64", 1e-5), ("bfloat16", 3e-2)])
def test_row_value_maps_split_the_span_by_groups_and_the_sweep(precision, bound, seed):
    """span_sweep.py: from every-position rows, the span of the V_h cut into its key/value groups' sub-spans (each
    true head inside exactly one) and each group's mixing from the sweep in span coordinates give every V_h — to
    the span's ε truncation from float64 rows, within a few % from rows rounded to bfloat16 (torch's bfloat16
    LLaMA, d = 128, 8/2: 5.3e-3 … 8.0e-3)."""
    from attnprobe.learners.positional import coarse
    from attnprobe.learners.positional.span_sweep import row_value_maps, row_value_queries

    d, H, G = 16, 4, 2
    model = random_rope_attention(d, H, G, seed=seed)
    oracle = Oracle(_RoundedRows(model, precision), d, precision=precision)
    rng = np.random.default_rng(0)
    M, c = coarse.coarse_values(oracle, rng, 4.0, repeats=16 if precision == "bfloat16" else 1)
    before = oracle.queries
    V, info = row_value_maps(oracle, H, rng, M=M, c=c, queries=1, starts=4, rounds=8)
    assert oracle.queries - before == row_value_queries(d, H, G, queries=1)  # what the plan says
    assert info["groups"] == G
    assert _matched_errors(V, _value_maps(model)).max() < bound
