"""The learner registry: declared options and their constraints, capabilities, and "write it, register it, done":
the example learner of ``example_learner.py`` gets its CLI flag, its refusals, audit support and the contract
tests from its one ``register`` call."""

import json

import numpy as np
import pytest
from conftest import rel

from attnprobe.audit import HeadSpec, Task, parse_defenses, run_audit
from attnprobe.cli import main
from attnprobe.errors import ConfigError
from attnprobe.learners import extract_exact, extract_lowrank, registry
from attnprobe.learners.head.robust import extract_robust
from attnprobe.learners.core.registry import Capabilities, Option
from attnprobe.models import load_model, save_model
from attnprobe.oracles import Oracle
from attnprobe.targets import random_head


@pytest.fixture
def rotated():
    """The example learner, registered for the test (and removed after it)."""
    import example_learner

    entry = example_learner.register_rotated()
    yield entry
    registry.unregister("rotated")


def test_every_cli_learner_flag_comes_from_the_registry():
    from attnprobe.cli import build_parser

    text = build_parser().parse_known_args(["extract", "--out", "x.npz"])[0]
    for name in registry.options():
        assert hasattr(text, name)  # one flag per declared option: "--" + name with dashes
    assert {e.name for e in registry.learners()} >= {"exact", "lowrank", "nuclear", "robust", "membership",
                                                     "transformer", "ffn", "multihead"}


def test_options_are_validated_once_by_their_constraints():
    lowrank = registry.learner("lowrank")
    with pytest.raises(ConfigError, match="'rank' parameter must be an integer >= 1") as info:
        lowrank.resolve({"rank": 0})
    assert info.value.param == "rank"
    with pytest.raises(ConfigError, match="does not use the 'hidden' option"):
        lowrank.resolve({"hidden": 3})
    with pytest.raises(ConfigError, match="'probes' parameter must be one of 'orthogonal', 'paper'"):
        registry.learner("robust").resolve({"probes": "gaussian"})
    assert registry.learner("nuclear").resolve({})["solver_time_limit"] == 300.0
    with pytest.raises(ConfigError, match="unknown learner 'magic'"):
        registry.learner("magic")
    assert Option("x", float, "", low=0, open_low=True).describe() == "a finite number > 0"
    with pytest.raises(ValueError, match="expected an integer ≥ 1; got '0'"):
        Option("x", int, "", low=1).parse("0")


def test_a_shared_option_must_keep_its_type():
    with pytest.raises(ConfigError, match="differs in type"):
        registry.register("clash", lambda oracle, **kw: None, recovers="head", options=[Option("rank", float, "")])
    assert "clash" not in {e.name for e in registry.learners()}


def test_capabilities_decide_which_learners_fit_the_answers():
    fits = {e.name for e in registry.learners("head") if e.fits(membership=True)}
    assert fits == {"membership"}
    assert not registry.learner("ffn").fits(coarse=True) and registry.learner("ffn").fits(vector=True)
    assert registry.learner("exact").fits() and not registry.learner("exact").fits(vector=True)
    assert Capabilities().value_answers and not Capabilities().membership_answers
    nuclear = registry.learner("nuclear")
    assert not nuclear.ready({}) and nuclear.ready({"rank": 2}) and nuclear.ready({"measurements": 30})
    assert registry.learner("exact").ready({})


def test_the_example_learner_recovers_a_head(rotated):
    truth = random_head(6, seed=1)
    res = rotated(Oracle(truth, 6), seed=0, scale=0.5)
    assert res.passed and rel(res.model.W, truth.W) < 1e-9 and rel(res.model.u, truth.u) < 1e-9
    assert res.queries == 6 * 6 + 2 * 6 + 1


def test_the_example_learner_gets_its_cli_flag_and_refusals(rotated, tmp_path, capsys):
    truth = random_head(5, seed=2)
    target = save_model(truth, tmp_path / "t.npz")
    out = tmp_path / "r.npz"
    assert main(["extract", "--target", str(target), "--method", "rotated", "--scale", "0.5", "--quiet",
                 "--out", str(out)]) == 0
    assert rel(load_model(out).W, truth.W) < 1e-9
    assert json.loads(out.with_suffix(".json").read_text())["method"] == "rotated"
    for argv, says in [(["--method", "exact", "--scale", "0.5"], "does not use --scale (it is for --method rotated)"),
                       (["--method", "rotated", "--rank", "2"], "does not use --rank"),
                       (["--method", "rotated", "--probes", "basis"], "single probe design"),
                       (["--method", "rotated", "--scale", "-1"], "--scale: expected a finite number > 0")]:
        capsys.readouterr()
        assert main(["extract", "--target", str(target), "--quiet", "--out", str(tmp_path / "x.npz"), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "x.npz").exists()


def test_the_example_learner_runs_in_an_audit_on_the_process_pool(rotated, tmp_path):
    """The worker process imports the module that registers the learner (the task carries its name)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    t = {}
    for name in ("self.query", "self.key", "self.value", "output.dense"):
        t[f"bert.encoder.layer.0.attention.{name}.weight"] = (rng.standard_normal((8, 8)) / 3).astype(np.float32)
        t[f"bert.encoder.layer.0.attention.{name}.bias"] = (0.1 * rng.standard_normal(8)).astype(np.float32)
    path = tmp_path / "one.safetensors"
    save_file(t, str(path))
    tasks = [Task(HeadSpec(str(path), 0, 0, 0, 2), m, d, seed=0)
             for d in parse_defenses("none") for m in ("rotated", "exact")]
    assert tasks[0].module == "example_learner"
    run = run_audit(tasks, tmp_path / "a", progress=False)
    got = {r["method"]: r for r in run.records}
    assert got["rotated"]["error"] is None and got["rotated"]["passed"]
    assert got["rotated"]["relative_error"]["W"] < 1e-9
    assert got["rotated"]["file"] == "heads/L0H0_rotated.npz" and (tmp_path / "a/heads/L0H0_rotated.npz").exists()


def test_the_example_learner_and_its_estimate_fit_in_30_lines(rotated):
    import inspect

    import example_learner

    code = [inspect.getsource(f) for f in (example_learner.extract_rotated, example_learner.estimate_rotated,
                                           example_learner.register_rotated)]
    assert sum(len(c.strip().splitlines()) for c in code) <= 30


def test_the_architecture_doc_shows_the_example_learners_code():
    """docs/architecture.md, "Adding a learner", shows the example's code line for line (the file wraps the
    ``register`` call in a function; the doc makes it at the top level)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "architecture.md").read_text()
    block = re.search(r"### Adding a learner.*?```python\n(.*?)```", doc, re.S).group(1)
    lines = [line.strip() for line in (root / "tests" / "example_learner.py").open()]
    source = set(lines) | {line.removeprefix("return ") for line in lines}
    shown = [line.strip() for line in block.splitlines() if line.strip()]
    assert len(shown) >= 20 and not [line for line in shown if line not in source]
    assert any(line.startswith("register(") for line in shown)


def test_the_example_learner_gets_its_estimate(rotated, tmp_path, capsys):
    """``--estimate`` asks the learner's entry; the estimate is the count the run then asks (it is not adaptive)."""
    from attnprobe.learners.core.estimate import estimate_queries

    target = save_model(random_head(5, seed=2), tmp_path / "t.npz")
    est = estimate_queries("rotated", 5, price_per_1k=2.0)
    run = rotated(Oracle(load_model(target), 5), seed=0)
    assert est.queries == est.low == est.high == run.queries + run.check.queries == 5 * 5 + 2 * 5 + 1 + 40
    assert main(["extract", "--target", str(target), "--method", "rotated", "--estimate", "--quiet",
                 "--out", str(tmp_path / "x.npz")]) == 0
    assert f"rotated at d=5: about {est.queries} queries" in capsys.readouterr().out
    registry.unregister("rotated")
    with pytest.raises(ConfigError, match="unknown learner 'rotated'"):
        estimate_queries("rotated", 5)
    with pytest.raises(ConfigError, match="no query estimate for method 'nuclear'") as info:
        estimate_queries("nuclear", 5, rank=2)
    assert info.value.param == "method"


def test_the_example_learner_keeps_the_contract(rotated):
    from test_learner_contract import check_contract

    check_contract(("rotated", None, {"scale": 0.7}))


DIRECT = {  # learner -> (registry options, the same call made directly)
    "exact": ({"probes": "paper"}, lambda o: extract_exact(o, probes="basis", seed=2)),
    "lowrank": ({"rank": 6}, lambda o: extract_lowrank(o, rank=6, seed=2)),
    "robust": ({"no_bias": True, "no_retries": True}, lambda o: extract_robust(o, bias=False, retries=0, seed=2)),
}


@pytest.mark.parametrize("name", DIRECT)
def test_a_registry_call_is_the_learners_own_call(name):
    """The registry adds no behaviour: the same learner call, bit for bit (arrays, queries per phase, check)."""
    options, direct = DIRECT[name]
    truth = random_head(6, seed=5, bias=name != "robust")
    a = registry.learner(name)(Oracle(truth, 6), seed=2, **options)
    b = direct(Oracle(truth, 6))
    for key, arr in a.model.arrays().items():
        np.testing.assert_array_equal(arr, b.model.arrays()[key])
    assert a.queries_by_phase == b.queries_by_phase and a.check.error == b.check.error
