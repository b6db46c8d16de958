"""The answer chain: one value built from Python, a spec or the shared flags; it wraps, names itself and states
its noise; the Oracle is built with it and derives its precision and rounding floor from it."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from attnprobe.errors import ConfigError
from attnprobe.models.precision import machine_epsilon, unit_roundoff
from attnprobe.oracles import Oracle
from attnprobe.oracles.chain import AnswerChain, parse_noise
from attnprobe.oracles.wrappers import (AdversarialNoise, BoundedNoise, ClipInputs, FreshNoise, Membership,
                                        Precision, Rounded)
from attnprobe.targets import random_head

from hostile import refused, run

HEAD = random_head(6, seed=3)


def batch(seed, B=32, N=3, d=6, scale=1.0):
    return scale * np.random.default_rng(seed).standard_normal((B, N, d))


def test_python_spec_and_flags_build_the_same_chain():
    from attnprobe.cli import main  # noqa: F401  (the parser below is the real one)
    from attnprobe.cli import answer_chain
    import argparse

    py = AnswerChain(cast="float16", clip=3.0, noise="avq:1e-3", seed=2, decimals=4)
    spec = AnswerChain.parse("round:4+avq:0.001+clip:3+noise-seed:2+float16")
    p = argparse.ArgumentParser()
    answer_chain.add_arguments(p)
    flags = answer_chain.chain_from_args(p.parse_args(["--cast", "float16", "--clip", "3", "--noise", "avq:1e-3",
                                                       "--noise-seed", "2", "--round", "4"]))
    assert py == spec == flags
    assert py.spec == "clip:3+float16+avq:0.001+noise-seed:2+round:4"
    assert AnswerChain.parse(py.spec) == py  # the spec reads back as the same chain
    assert AnswerChain.parse("none").empty and AnswerChain().spec == "none"
    assert AnswerChain.parse("digits:3") == AnswerChain(digits=3)  # the older spelling of round-digits:3
    assert AnswerChain.parse("noise:avq:1e-3") == AnswerChain(noise="avq:1e-3")
    assert AnswerChain.parse("cast:bfloat16").spec == "bfloat16"
    assert AnswerChain(cast="float16", decimals=4).slug == "float16_round4"


@settings(max_examples=40, deadline=None)
@given(cast=st.sampled_from([None, "float32", "float16", "bfloat16"]),
       clip=st.one_of(st.none(), st.floats(1e-3, 1e3)),
       noise=st.one_of(st.none(), st.tuples(st.sampled_from(["avq", "adversarial", "gaussian", "uniform"]),
                                             st.floats(0, 10))),
       seed=st.one_of(st.none(), st.integers(0, 2**31)),
       rounding=st.one_of(st.none(), st.tuples(st.just("decimals"), st.integers(-308, 308)),
                          st.tuples(st.just("digits"), st.integers(1, 17))),
       membership=st.booleans())
def test_every_chain_reads_back_from_its_spec(cast, clip, noise, seed, rounding, membership):
    kw = dict(cast=cast, clip=clip, noise=noise, seed=seed, membership=membership)
    if rounding:
        kw[rounding[0]] = rounding[1]
    chain = AnswerChain(**kw)
    again = AnswerChain.parse(chain.spec)
    # the seed is spelled only where it matters (with noise, when not 0)
    assert again.spec == chain.spec and again.identity_options() == chain.identity_options()
    assert again.answer_noise == chain.answer_noise


def test_the_chain_wraps_innermost_first_and_states_its_noise():
    chain = AnswerChain(cast="float32", noise="avq:1e-3", seed=5, digits=4, membership=True, clip=2.0)
    fn = chain.apply(HEAD)
    assert isinstance(fn, ClipInputs) and isinstance(fn.inner, Membership) and isinstance(fn.inner.inner, Rounded)
    assert isinstance(fn.inner.inner.inner, BoundedNoise) and fn.inner.inner.inner.seed == 5
    assert isinstance(fn.inner.inner.inner.inner, Precision) and fn.inner.inner.inner.inner.inner is HEAD
    n = chain.answer_noise
    assert n.membership and n.tolerance == 1e-3
    assert n.rel_eps == pytest.approx(unit_roundoff("float32") + 0.5e-3)
    assert AnswerChain(noise="gaussian:0.1").answer_noise.fresh
    assert AnswerChain(noise="adversarial:0.1").apply(HEAD).__class__ is AdversarialNoise
    assert AnswerChain(noise="uniform:0.1").apply(HEAD).kind == "uniform"
    assert AnswerChain().apply(HEAD) is HEAD
    # the noise seed reaches the noise: same seed, same answers; another seed, other answers
    X = batch(7)
    for kind in ("avq", "gaussian", "uniform"):
        a, b, other = (AnswerChain(noise=f"{kind}:0.1", seed=s).apply(HEAD)(X) for s in (4, 4, 5))
        assert np.array_equal(a, b) and not np.array_equal(a, other)


def test_clip_scales_long_rows_down_and_leaves_short_ones():
    X = batch(0, scale=3.0)
    X[0, 0] = 0.0
    clipped = ClipInputs(lambda Z: np.linalg.norm(Z, axis=-1).max(axis=1), 2.0)
    norms = np.linalg.norm(X, axis=-1)
    assert np.allclose(clipped(X), np.minimum(norms, 2.0).max(axis=1))
    short = batch(1, scale=0.1)
    assert np.array_equal(ClipInputs(HEAD, 2.0)(short), HEAD(short))
    long = batch(2, scale=10.0)
    unit = long / np.linalg.norm(long, axis=-1, keepdims=True)
    assert np.allclose(ClipInputs(HEAD, 2.0)(long), HEAD(2.0 * unit))


def test_the_oracle_is_built_with_its_chain_and_reads_precision_and_floor_from_it():
    o = Oracle(HEAD, 6, chain=AnswerChain(cast="float16", noise="gaussian:0.01"))
    assert o.precision == "float16" and o.eps == machine_epsilon("float16") and o.noise.fresh
    assert o.chain.spec == "float16+gaussian:0.01"
    X = batch(3)
    assert o(X).shape == (32,) and o.queries == 32
    # the model under the chain is untouched: no wrapper mutates anything it was given
    plain = Oracle(HEAD, 6)
    assert plain.fn is HEAD and plain.precision == "float64" and plain.eps == 2.0**-52
    # significant-digit rounding raises the floor to its relative spacing (twice its unit roundoff)
    assert Oracle(HEAD, 6, chain=AnswerChain(digits=5)).eps == pytest.approx(1e-4)
    # a model computed in float32 declares it; a declaration coarser still wins; "auto" detects
    h32 = HEAD.with_dtype("float32")
    assert Oracle(h32, 6).precision == "float32"
    assert Oracle(h32, 6, precision="float16").precision == "float16"
    assert Oracle(h32, 6, precision="auto").detector is not None
    # a float16 model cast to float32 answers in float16
    assert Oracle(HEAD.with_dtype("float16"), 6, chain=AnswerChain(cast="float32")).precision == "float16"


def test_machine_epsilon_and_unit_roundoff_mean_one_thing_each():
    for name, bits in (("float64", 52), ("float32", 23), ("float16", 10), ("bfloat16", 7)):
        assert machine_epsilon(name) == 2.0**-bits and unit_roundoff(name) == 2.0**-(bits + 1)
        y = Precision(HEAD, name, inputs=False)(batch(4)) if name != "float64" else HEAD(batch(4))
        ref = HEAD(batch(4))
        assert np.all(np.abs(y - ref) <= unit_roundoff(name) * np.abs(ref) * (1 + 1e-12) + 1e-300)
        assert Precision(HEAD, name).noise.rel_eps == unit_roundoff(name)


@pytest.mark.parametrize("spec, says", [
    ("noise:x", "noise level"), ("float8", "unknown defence"), ("round:x", "whole number"),
    ("round:4+round-digits:3", "twice"), ("float16+float32", "twice"), ("clip:0", "> 0"), ("clip:-1", ">= 0"),
    ("avq:nan", "finite"), ("round-digits:18", "at most 17"), ("round:400", "-308 <= K <= 308"), ("", "empty"),
    ("cast:float64", "casts to"), ("noise-seed:1.5", "whole number"), ("none+float16", "stands alone"),
    ("float16+", "unknown defence ''"),
])
def test_bad_specs_are_refused_with_what_to_do(spec, says):
    with pytest.raises(ConfigError, match=says.replace("+", r"\+")):
        AnswerChain.parse(spec)


def test_bad_python_values_are_refused():
    for kw in (dict(cast="float64"), dict(decimals=2.5), dict(decimals=True), dict(clip=True), dict(digits=0),
               dict(noise="laplace:1"),
               dict(noise=("avq", -1.0)), dict(seed=-1), dict(membership="yes"), dict(decimals=1, digits=1)):
        with pytest.raises(ConfigError):
            AnswerChain(**kw)
    for spec in ("avq", "nope:1", "avq:x", "avq:-1"):
        with pytest.raises(ConfigError):
            parse_noise(spec)
    with pytest.raises(ConfigError):
        FreshNoise(HEAD, 0.1, kind="laplace")


def test_flags_and_spec_combine_and_refuse_a_stage_given_twice(tmp_path, capsys):
    from attnprobe.models import save_model

    save_model(random_head(4, seed=0), tmp_path / "t.npz")
    base = ["extract", "--target", tmp_path / "t.npz", "--out", tmp_path / "o.npz", "--quiet"]
    refused(capsys, tmp_path, *base, "--defense", "float16", "--cast", "float32", says="twice")
    refused(capsys, tmp_path, *base, "--noise-seed", "3", says="--noise-seed seeds --noise")
    refused(capsys, tmp_path, *base, "--defense", "membership", says="--method membership")
    refused(capsys, tmp_path, *base, "--clip", "0", says="--clip")
    rc, out, err = run(capsys, *base, "--defense", "float32+round-digits:9")
    assert rc == 0, err
    import json

    js = json.loads((tmp_path / "o.json").read_text())
    assert js["details"]["oracle"]["precision"] == "float32" and js["check"]["passed"]
    assert js["details"]["oracle"]["defense"] == "float32+round-digits:9"


def test_defended_cli_run_matches_the_python_chain(tmp_path, capsys):
    """extract --cast/--round-digits gives the very arrays of the same chain built in Python."""
    from attnprobe.learners.head.exact import extract_exact
    from attnprobe.models import load_model, save_model

    truth = random_head(5, seed=4)
    save_model(truth, tmp_path / "t.npz")
    rc, _, err = run(capsys, "extract", "--target", tmp_path / "t.npz", "--cast", "float32", "--round-digits", "6",
                     "--out", tmp_path / "o.npz", "--quiet")
    assert rc == 0, err
    cli = load_model(tmp_path / "o.npz")
    py = extract_exact(AnswerChain(cast="float32", digits=6).oracle(truth, 5, precision="auto"), seed=0).model
    assert np.array_equal(cli.W, py.W) and np.array_equal(cli.v, py.v)


def test_serve_and_audit_take_the_same_flags(tmp_path):
    import argparse

    from attnprobe.cli import audit, serve
    from attnprobe.cli.audit import chosen_defenses
    from attnprobe.models import save_model

    save_model(random_head(4, seed=0), tmp_path / "t.npz")
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    serve.add_parser(sub)
    audit.add_parser(sub)
    args = p.parse_args(["serve", "--target", str(tmp_path / "t.npz"), "--cast", "float16", "--round", "3",
                         "--api-key", "k"])
    fn, d, *_ = serve.served_callable(args)
    X = batch(5, d=4)
    assert np.array_equal(fn(X), AnswerChain(cast="float16", decimals=3).apply(random_head(4, seed=0))(X))
    with pytest.raises(SystemExit):  # argparse's own refusal: a proper type, not a string passed along
        p.parse_args(["serve", "--target", "t.npz", "--round-digits", "x"])
    a = p.parse_args(["audit", "--model", "minilm", "--cast", "float16", "--round", "3", "--out", "x"])
    assert [c.spec for c in chosen_defenses(a)] == ["float16+round:3"]
    a = p.parse_args(["audit", "--model", "minilm", "--defense", "none,float16+round:3", "--out", "x"])
    assert [c.spec for c in chosen_defenses(a)] == ["none", "float16+round:3"]
    a = p.parse_args(["audit", "--model", "minilm", "--defense", "none", "--cast", "float16", "--out", "x"])
    with pytest.raises(ConfigError, match="not both"):
        chosen_defenses(a)


def test_an_audit_task_seeds_the_noise_unless_the_spec_names_its_seed():
    from attnprobe.audit import HeadSpec, Task

    task = Task(HeadSpec("minilm", 0, 0), "exact", AnswerChain.parse("gaussian:1e-4"), seed=3)
    assert task.defense.seeded(task.seed).seed == 3 and task.defense.name == "gaussian:0.0001"
    assert AnswerChain.parse("gaussian:1e-4+noise-seed:5").seeded(3).seed == 5
    assert Task(HeadSpec("minilm", 0, 0), "exact").defense.name == "none"


def test_readme_spellings_digits_and_noise_are_aliases_of_the_canonical_stages():
    from attnprobe.audit import parse_defenses

    assert AnswerChain.parse("digits:4") == AnswerChain.parse("round-digits:4")
    assert AnswerChain.parse("noise:1e-6") == AnswerChain.parse("gaussian:1e-6")
    assert AnswerChain.parse("float16+noise:1e-6").spec == "float16+gaussian:1e-06"
    assert [d.name for d in parse_defenses("none,digits:4,noise:1e-6")] == ["none", "round-digits:4",
                                                                           "gaussian:1e-06"]
    with pytest.raises(ConfigError, match="twice"):  # an alias and its canonical spelling are one defence
        parse_defenses("noise:1e-6,gaussian:1e-6")
