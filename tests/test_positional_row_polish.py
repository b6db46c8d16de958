"""The joint polish on every-position rows, streamed over chunks (learners/positional/row_polish.py), against the
model's own rows, the unchunked products and the last-position polish (real transformers modules)."""

from dataclasses import replace

import numpy as np
import pytest

from attnprobe.errors import ConfigError
from attnprobe.learners.positional.polish import fitted_names, last_row, polish, row_constants
from attnprobe.learners.positional.row_polish import (StreamedRows, fresh_rows, polish_rows, row_weights,
                                                      rows_as_last_positions)
from attnprobe.models.compare import function_error_over_lengths
from attnprobe.oracles.base import Oracle

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attnprobe.targets.positional_modules import positional_victim, reference_model  # noqa: E402

KW = {"llama": {"kv_heads": 1}, "bloom": {}, "t5": {}}


def _model(family, d=8, heads=2):
    return reference_model(positional_victim(family, d=d, heads=heads, seed=1, **KW[family]))


def _perturbed(truth, size, seed=0):
    rng = np.random.default_rng(seed)
    return replace(truth, **{n: np.asarray(getattr(truth, n)) * (1 + size * rng.standard_normal(
        np.shape(getattr(truth, n)))) for n in ("Wq", "Wk", "Wv", "Wo")})


def _data(model, shapes=((3, 7), (2, 4)), seed=0, shift=0.0):
    rng = np.random.default_rng(seed)
    out = []
    for B, N in shapes:
        X = rng.standard_normal((B, N, model.d))
        out.append((X, model.every_position(X) + shift))
    return out


@pytest.mark.parametrize("family", ["llama", "bloom", "t5"])
def test_the_rows_are_the_models_rows_and_its_last_position_answers(family):
    """Every row (RoPE with GQA, ALiBi, T5 buckets; causal or bidirectional) equals the model's, and each row the
    last-position polish's forward on its prefix."""
    model = _model(family)
    data = _data(model)
    problem = StreamedRows(model, fitted_names(model, True), data)
    p = problem.arrays(problem.start)
    for X, Y in data:
        rows = problem.rows_of(p, torch.as_tensor(X)).numpy()
        assert np.abs(rows - Y).max() < 1e-12 * np.abs(Y).max()
    if model.causal:
        last = rows_as_last_positions(data)
        const = row_constants(model, [X.shape[1] for X, _ in last])
        for X, y in last:
            assert np.abs(last_row(model, p, const, torch.as_tensor(X)).numpy() - y).max() < 1e-12


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_streamed_products_equal_the_unchunked_ones(family):
    """Chunks of one sequence against one chunk of everything: residual, Jᵀr, Jv, Jᵀu and JᵀJv agree to 1e-12
    (with weights per position)."""
    model = _model(family)
    data = _data(model, shift=0.01)
    names = fitted_names(model, True)
    weights = row_weights(data, 1.0)
    small = StreamedRows(model, names, data, chunk_rows=1, weights=weights)
    whole = StreamedRows(model, names, data, chunk_rows=10**6, weights=weights)
    assert len(small.chunks) == 5 and len(whole.chunks) == 2
    p = _perturbed(model, 1e-2)
    flat = torch.as_tensor(np.concatenate([np.ravel(getattr(p, n)) for n in names]))
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(whole.unknowns, dtype=torch.float64, generator=gen)
    u = torch.randn(len(whole.residual(flat)), dtype=torch.float64, generator=gen)

    def close(a, b):
        assert float((a - b).abs().max()) <= 1e-12 * float(b.abs().max())

    close(small.residual(flat), whole.residual(flat))
    close(small.jvp(flat, v), whole.jvp(flat, v))
    close(small.vjp(flat, u), whole.vjp(flat, u))
    close(small.normal(flat, v), whole.normal(flat, v))
    close(small.normal(flat, v), whole.vjp(flat, whole.jvp(flat, v)))  # JᵀJv is Jᵀ of Jv
    g, cost = small.gradient(flat)
    close(g, whole.vjp(flat, whole.residual(flat)))
    assert abs(cost - float(whole.residual(flat) @ whole.residual(flat))) <= 1e-12 * cost
    # and the unweighted residual is the rows' misfit
    plain = StreamedRows(model, names, data, chunk_rows=3)
    r = plain.residual(plain.start).numpy()
    assert np.abs(r + 0.01).max() < 1e-12


def test_rows_give_the_last_position_polish_result_on_a_tiny_layer():
    """The same answers as every-position rows of 3 sequences or as last-position answers of 48 prefixes (384
    numbers for 216 unknowns): the polish (dense steps) lands on the same model, and on the module."""
    truth = _model("llama")
    start = _perturbed(truth, 1e-3)
    data = _data(truth, shapes=((3, 16),), seed=3)
    rows_model, rows_report = polish_rows(start, data, rounds=3, chunk_rows=16)
    last_model, last_report = polish(start, rows_as_last_positions(data), rounds=3)
    assert rows_report.sequences == 3 and last_report.sequences == 48
    assert rows_report.numbers == last_report.numbers == 48 * truth.outputs
    assert rows_report.unknowns == last_report.unknowns
    lengths = (1, 2, 5, 12, 40)
    assert function_error_over_lengths(start, truth, np.random.default_rng(7), lengths) > 1e-4
    assert function_error_over_lengths(rows_model, truth, np.random.default_rng(7), lengths) < 1e-9
    for n in ("Wq", "Wk", "Wv", "Wo"):
        assert np.abs(getattr(rows_model, n) - getattr(last_model, n)).max() < 1e-8


def test_the_streamed_conjugate_gradient_route_moves_towards_the_module_and_reports_progress():
    truth = _model("llama")
    start = _perturbed(truth, 1e-3)
    data = _data(truth, shapes=((4, 12),), seed=4)
    seen, lines = [], []
    model, report = polish_rows(start, data, rounds=2, cg_steps=60, chunk_rows=48, dense=False,
                                progress=lambda done, total: seen.append((done, total)), log=lines.append)
    assert report.misfit_after < report.misfit_before / 30
    lengths = (1, 2, 12)
    assert (function_error_over_lengths(model, truth, np.random.default_rng(7), lengths)
            < function_error_over_lengths(start, truth, np.random.default_rng(7), lengths) / 10)
    assert seen and all(total == 120 for _, total in seen)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert len(lines) == report.rounds and "misfit" in lines[0]


def test_float32_chunks_agree_with_float64_ones_to_float32_rounding():
    model = _model("llama")
    data = _data(model, shift=0.01)
    names = fitted_names(model)
    f64 = StreamedRows(model, names, data)
    f32 = StreamedRows(model, names, data, compute="float32")
    v = torch.randn(f64.unknowns, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    a, b = f64.normal(f64.start, v), f32.normal(f32.start, v)
    assert b.dtype == torch.float64
    assert float((a - b).abs().max()) < 1e-5 * float(a.abs().max())
    assert abs(f32.cost(f32.start) - f64.cost(f64.start)) < 1e-5 * f64.cost(f64.start)


def test_fresh_rows_ask_one_query_per_sequence():
    victim = positional_victim("llama", d=8, heads=2, kv_heads=1, seed=1)

    class Rows:
        positions = "causal"

        def __call__(self, X):
            return victim.every_position(X).numpy()

    oracle = Oracle(Rows(), 8)
    [(X, Y)] = fresh_rows(oracle, 5, np.random.default_rng(0), length=6, batch=2)
    assert X.shape == (5, 6, 8) and Y.shape == (5, 6, 8) and oracle.queries == 5
    assert np.abs(Y - reference_model(victim).every_position(X)).max() < 1e-12


@pytest.mark.parametrize("kw, param", [({"chunk_rows": 0}, "chunk_rows"), ({"compute": "float16"}, "compute")])
def test_bad_options_are_refused_naming_the_parameter(kw, param):
    model = _model("llama")
    with pytest.raises(ConfigError) as exc:
        StreamedRows(model, fitted_names(model), _data(model), **kw)
    assert exc.value.param == param


def test_last_position_data_and_no_sequences_are_refused():
    model = _model("llama")
    X = np.zeros((2, 3, model.d))
    with pytest.raises(ConfigError) as exc:
        StreamedRows(model, fitted_names(model), [(X, model(X))])
    assert exc.value.param == "data"
    with pytest.raises(ConfigError) as exc:
        fresh_rows(Oracle(model, model.d), 0, np.random.default_rng(0))
    assert exc.value.param == "sequences"


def test_the_row_polish_plan_at_llama3_8b_shape_by_construction():
    """d = 4096, 32 heads, 8 key/value groups: W_Q 32·128·4096, W_K and W_V 8·128·4096 each, W_O 4096², biases;
    twice ⌈unknowns/K⌉ rows in sequences of 256; a Jacobian product's time linear in the rows' multiply–adds."""
    from attnprobe.learners.positional.row_polish import (BASE_BYTES, STEP_SECONDS_PER_MAC, chunk_precision,
                                                          row_polish_plan)

    plan = row_polish_plan(4096, 32, 8, rounds=2, cg_steps=9, compute="float32")
    unknowns = 32 * 128 * 4096 + 2 * 8 * 128 * 4096 + 4096 * 4096 + 32 * 128 + 2 * 8 * 128 + 4096
    assert plan.unknowns == unknowns == 41_953_280
    assert plan.sequences == -(-2 * -(-unknowns // 4096) // 256) == 81 and plan.rows == 81 * 256
    assert plan.steps == 2 * 10
    mac = 4096 * 48 * 128 + 4096 * 4096 + 2 * 4096 * 256
    assert abs(plan.seconds - 20 * plan.rows * mac * STEP_SECONDS_PER_MAC["float32"]) < 1e-6 * plan.seconds
    f64 = row_polish_plan(4096, 32, 8, rounds=2, cg_steps=9)
    assert f64.seconds == 2 * plan.seconds and f64.peak_bytes > plan.peak_bytes
    assert 8 * unknowns < plan.peak_bytes - BASE_BYTES < 20 * 2**30  # parameter vectors, data, a chunk
    assert row_polish_plan(4096, 32, 8, rows=1000).sequences == 4
    assert "81 sequences × 256 tokens" in plan.describe() and "GiB" in plan.describe()
    with pytest.raises(ConfigError) as exc:
        row_polish_plan(4096, 30, 8)
    assert exc.value.param == "heads"
    assert [chunk_precision(p) for p in ("float64", "float32", "bfloat16", "auto", None)] == [
        "float64", "float32", "float32", "float64", "float64"]


def test_the_estimate_shows_the_row_polish_time_and_memory_before_any_query(tmp_path, monkeypatch, capsys):
    import sys
    import textwrap

    from attnprobe.cli import main
    from attnprobe.learners.core.estimate import estimate_queries
    from attnprobe.learners.positional.coarse import POLISH_PER, POLISH_ROUNDS
    from attnprobe.learners.positional.polish import HOOK_CG_STEPS
    from attnprobe.learners.positional.polish_hook import polish_sequences
    from attnprobe.learners.positional.row_polish import row_polish_plan
    from attnprobe.models.positional import PositionalAttention

    last = estimate_queries("positional", 4096, precision="float32", heads=32, polish="always")
    rows = estimate_queries("positional", 4096, precision="float32", heads=32, polish="always",
                            positions="causal")
    n = polish_sequences(PositionalAttention.unknowns(4096, 32, 32, 128, 4096), 4096, POLISH_PER)
    plan = row_polish_plan(4096, 32, 32, rounds=POLISH_ROUNDS, cg_steps=HOOK_CG_STEPS, rows=n, compute="float32")
    assert last.seconds is None and last.peak_bytes is None
    assert rows.seconds == plan.seconds and rows.peak_bytes == plan.peak_bytes
    # the same start; the polish asks n rows in sequences of 256 instead of n sequences
    assert plan.sequences == -(-n // 256) and last.queries - rows.queries == n - plan.sequences
    (tmp_path / "victim.py").write_text(textwrap.dedent("""
        import numpy as np
        def answer(X):
            raise AssertionError("an estimate asks nothing")
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["extract", "--oracle", "victim:answer", "--d", "4096", "--method", "positional", "--heads", "32",
                 "--answer-precision", "float32", "--positions", "causal", "--polish", "always", "--estimate"]) == 0
    line = capsys.readouterr().out
    assert f"about {rows.queries} queries" in line and "0 asked" in line
    assert "expected computing time about" in line and "peak memory about" in line and "the row polish" in line


def _hook_case():
    from attnprobe.learners.core.check import functional_check
    from attnprobe.learners.core.result import Extraction
    from attnprobe.targets import random_rope_attention

    truth = random_rope_attention(16, 2, 1, seed=3)
    start = _perturbed(truth, 1e-4)

    class Rows:
        def __call__(self, X):
            return truth.every_position(X)

    oracle = Oracle(Rows(), 16, positions="causal")
    res = Extraction("positional", start, 100, truth.unknowns(16, 2, 1, 8, 16), 0.0,
                     check=functional_check(oracle, start, np.random.default_rng(0), (1, 2, 8), 4),
                     queries_by_phase={"values": 100})
    return truth, oracle, res


@pytest.mark.parametrize("rounds", [0, pytest.param(3, marks=pytest.mark.slow)])
def test_the_hook_polishes_on_every_row_when_the_oracle_answers_causal_rows(rounds):
    """Declared causal rows: the hook asks ⌈n/256⌉ sequences of 256 tokens for its n rows (not n sequences),
    fits every row, and counts what it asked (no rounds: the fast twin of the slow run, which reaches the
    module)."""
    from attnprobe.learners.positional.polish_hook import causal_rows, polish_extraction, polish_sequences

    truth, oracle, res = _hook_case()
    assert causal_rows(oracle, res.model) and not causal_rows(Oracle(truth, 16), res.model)
    asked = oracle.queries
    polish_extraction(oracle, res, mode="always", rounds=rounds)
    n = -(-polish_sequences(res.unknowns, 16) // 256)
    info = res.details["polish"]
    assert info["ran"] and info["sequences"] == n and info["numbers"] == n * 256 * 16 and info["rounds"] == rounds
    assert oracle.queries - asked == n + 3 * 4 and res.queries_by_phase["polish"] == n
    if rounds:
        assert info["kept"] and info["misfit_after"] < 1e-9
        assert function_error_over_lengths(res.model, truth, np.random.default_rng(1), (1, 4, 64)) < 1e-9


def _with_biases(model, size=0.05, seed=5):
    rng = np.random.default_rng(seed)
    return replace(model, **{n: size * rng.standard_normal(np.shape(getattr(model, n)))
                             for n in ("bq", "bk", "bv", "bo")})


ALL_BIASES = ("bq", "bk", "bv", "bo")


@pytest.mark.parametrize("rows", [True, False])
def test_biases_the_layer_lacks_stay_zero_and_the_polish_still_reaches_it(rows):
    """A bias-free layer polished from a start that carries biases: held at zero they are exactly zero after, and
    the weights alone reach the module (rows or last positions); fitted, the polish keeps nonzero biases."""
    truth = _model("llama")
    start = _with_biases(_perturbed(truth, 1e-3))
    data = _data(truth, shapes=((3, 16),), seed=3)
    fit = ((lambda m, **kw: polish_rows(m, data, rounds=3, chunk_rows=16, **kw)) if rows
           else (lambda m, **kw: polish(m, rows_as_last_positions(data), rounds=3, **kw)))
    held, report = fit(start, held=ALL_BIASES)
    free, _ = fit(start)
    assert all(not np.any(getattr(held, n)) for n in ALL_BIASES)
    assert report.unknowns == sum(np.size(getattr(truth, n)) for n in ("Wq", "Wk", "Wv", "Wo"))
    assert function_error_over_lengths(held, truth, np.random.default_rng(7), (1, 2, 5, 12, 40)) < 1e-9
    assert max(np.abs(getattr(free, n)).max() for n in ALL_BIASES) > 1e-6


def test_only_biases_can_be_held_and_a_layers_declared_biases_say_which():
    from attnprobe.learners.positional.polish import absent_biases, held_at_zero

    truth = _model("llama")
    with pytest.raises(ConfigError) as err:
        fitted_names(truth, held=("Wq",))
    assert err.value.param == "held" and "Wq" in str(err.value)
    with pytest.raises(ConfigError):
        held_at_zero(truth, ("bias",))

    def layer(X):
        return truth(X)

    assert absent_biases(Oracle(layer, truth.d)) == ()  # nothing declared: every bias fitted
    for letters, absent in (("", ALL_BIASES), ("qkv", ("bo",)), ("qkvo", ())):
        layer.biases = letters
        assert absent_biases(Oracle(layer, truth.d)) == absent


def test_a_round_of_little_gain_ends_the_polish_unless_every_round_is_asked(monkeypatch):
    """Steps cut to 1e-4 of the conjugate-gradient solution each lower the cost a little: by default the first such
    round ends the polish; ``min_gain=0`` (the every-row route: its fit gains in bursts) runs every round."""
    from attnprobe.learners.positional import row_polish

    real = row_polish.conjugate_gradients
    monkeypatch.setattr(row_polish, "conjugate_gradients", lambda *a, **kw: 1e-4 * real(*a, **kw))
    truth = _model("llama")
    start = _perturbed(truth, 1e-2)
    data = _data(truth, shapes=((2, 12),), seed=4)
    _, default = polish_rows(start, data, rounds=5, cg_steps=20, dense=False)
    _, every = polish_rows(start, data, rounds=5, cg_steps=20, dense=False, min_gain=0.0)
    assert default.rounds == 1 and every.rounds == 5
    assert every.misfit_after < default.misfit_after < default.misfit_before
