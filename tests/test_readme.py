"""The README's set-up commands are the ones CI runs."""

import re
from pathlib import Path

from attnprobe.oracles.chain import AnswerChain

ROOT = Path(__file__).resolve().parent.parent


def readme_commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv[^\n]*)\n```", text)


def test_readme_has_two_setup_lines_and_ci_runs_the_test_line():
    cmds = readme_commands()
    assert len(cmds) == 2
    demo, tests = cmds
    assert demo.endswith("attnprobe demo") and "pytest" in tests
    # CI runs the README's test command step by step (its steps in order, other steps such as the linter between)
    ci = (ROOT / ".ci" / "run").read_text()
    ci_steps = [step.strip() for line in ci.splitlines() for step in line.split(" && ")]
    steps = [step.strip() for step in tests.split(" && ")]
    at = 0
    for step in steps:
        assert step in ci_steps[at:], f"CI does not run the README's step {step!r} (in order)"
        at = ci_steps.index(step, at) + 1


def _rel(a, b) -> float:
    import numpy as np

    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


def test_readme_python_examples_run(capsys):
    """Every ```python block of the README, run in order in one namespace, and what each one claims checked
    against the truth it was made from (not only that its functional check passed)."""
    import numpy as np

    from attnprobe.models import match_heads

    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    ns: dict = {}
    seen = []
    for block in blocks:
        exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 - our own documentation
        # later blocks reuse names (res, head, layer): each block's claims are checked right after it runs
        if "result = extract_exact(oracle)" in block:  # a real head answering in float32, d = 384
            r, truth = ns["result"], ns["truth"]
            assert r.passed and r.unknowns == 384 * 384 + 2 * 384 + 1 and r.queries <= 1.02 * r.unknowns
            assert sum(r.queries_by_phase.values()) == r.queries
            assert _rel(r.model.W, truth.W) <= 1e-3 and _rel(r.model.v, truth.v) <= 1e-4
        elif "extract_lowrank(" in block:
            r, truth = ns["res"], ns["head"]
            assert r.passed and r.details["detected_rank"] == 32 and r.queries <= 0.2 * (384 * 384 + 2 * 384 + 1)
            assert _rel(r.model.W, truth.W) <= 1e-3
        elif "extract_robust(" in block:
            head = ns["head"]
            assert ns["res"].passed and _rel(ns["res"].model.W, head.W) <= 1e-2
            eps_w = ns["paper"].details["guarantee"]["eps_W"]
            assert np.linalg.norm(ns["paper"].model.W - head.W) <= eps_w  # what Thm 6.1 guarantees, it keeps
            m = ns["m"]  # membership answers: W exactly, v as a unit vector
            assert m.passed and _rel(m.model.W, head.W) <= 1e-6
            assert _rel(m.model.v, head.v / np.linalg.norm(head.v)) <= 1e-6
        elif "AnswerChain.parse(" in block:  # the spec and the constructor are one chain; its floor is the coarser
            chain, defended = ns["chain"], ns["defended"]
            assert chain == AnswerChain(cast="bfloat16", digits=4) and chain.spec == "bfloat16+round-digits:4"
            assert type(chain).parse(chain.spec) == chain
            assert defended.precision == "bfloat16" and defended.eps >= 2.0 * chain.answer_noise.rel_eps > 0
            # and the answers are what it says: 4 significant digits, every query counted
            y = defended(np.random.default_rng(0).standard_normal((20, 3, 16)))
            scale = 10.0 ** (np.floor(np.log10(np.abs(y))) - 3)
            assert np.allclose(np.round(y / scale) * scale, y, rtol=1e-12, atol=0) and defended.queries == 20
        elif "extract_ffn(" in block:
            ffn, net = ns["ffn"], ns["net"]
            X = np.random.default_rng(0).standard_normal((500, net.d))
            assert ffn.passed and ffn.check.error <= 1e-9 and _rel(ffn.model.forward(X), net.forward(X)) <= 1e-9
            assert sum(ffn.queries_by_phase.values()) == ffn.queries
        elif "extract_transformer(" in block:
            rec, tf = ns["rec"], ns["tf"]
            assert rec.passed and _rel(rec.model.W, tf.W) <= 1e-9 and rec.check.error <= 1e-9
        elif "minilm_layer(" in block:  # all 12 heads of a real layer, up to permutation
            assert ns["res"].passed and match_heads(ns["layer"], ns["res"].model).worst <= 1e-6
        elif 'method="orthogonal"' in block:
            assert ns["mh"].passed and match_heads(ns["layer"], ns["mh"].model).worst <= 1e-6
        else:
            continue
        seen.append(block)
    assert len(seen) == len(blocks), "a README example is run without its claims being checked"
    assert capsys.readouterr().out.strip()
