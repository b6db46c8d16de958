"""The README's set-up commands are the ones CI runs."""

import ast
import builtins
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


#: what each README example claims, checked right after it runs, in the same process (``block + check``): a
#: marker found in exactly one block, whether it is slow (a real MiniLM head or layer), and the check's code
CLAIMS = [
    ("result = extract_exact(oracle)", True, """  # a real head answering in float32, d = 384
r = result
assert r.passed and r.unknowns == 384 * 384 + 2 * 384 + 1 and r.queries <= 1.02 * r.unknowns
assert sum(r.queries_by_phase.values()) == r.queries
assert rel(r.model.W, truth.W) <= 1e-3 and rel(r.model.v, truth.v) <= 1e-4
"""),
    ("class LastTokenHead(", False, """  # the torch module's own weights: W = KᵀQ/√d_head, u = Kᵀb_Q/√d_head, v = Vᵀw_o
m = {k: p.detach().numpy() for k, p in module.named_parameters()}
assert res.passed and res.details["detected_rank"] == 4
assert rel(res.model.W, m["k.weight"].T @ m["q.weight"] / 2) <= 1e-8
assert rel(res.model.u, m["k.weight"].T @ m["q.bias"] / 2) <= 1e-8
assert rel(res.model.v, m["v.weight"].T @ m["out.weight"][0]) <= 1e-8
assert abs(res.model.c - (m["out.weight"][0] @ m["v.bias"] + m["out.bias"][0])) <= 1e-8
"""),
    ("class Endpoint(", False, """  # every query went over HTTP to the served head, which is recovered
assert res.passed and res.queries <= 1_000 and rel(res.model.W, served.W) <= 1e-8 and rel(res.model.v, served.v) <= 1e-8
"""),
    ("def my_model(", False, """
assert res.passed and rel(res.model.W, Wk.T @ Wq / 8) <= 1e-8 and rel(res.model.v, wv) <= 1e-8
assert abs(res.model.c) <= 1e-8 and res.queries <= 1.5 * res.unknowns
"""),
    ("extract_lowrank(Oracle(head", True, """
assert res.passed and res.details["detected_rank"] == 32 and res.queries <= 0.2 * (384 * 384 + 2 * 384 + 1)
assert rel(res.model.W, head.W) <= 1e-3
"""),
    ("extract_robust(", False, """
assert res.passed and rel(res.model.W, head.W) <= 1e-2
eps_w = paper.details["guarantee"]["eps_W"]
assert np.linalg.norm(paper.model.W - head.W) <= eps_w  # what Thm 6.1 guarantees, it keeps
assert m.passed and rel(m.model.W, head.W) <= 1e-6  # membership answers: W exactly, v as a unit vector
assert rel(m.model.v, head.v / np.linalg.norm(head.v)) <= 1e-6
"""),
    ("AnswerChain.parse(", False, """  # the spec and the constructor are one chain; its floor is the coarser
from attnprobe.oracles.chain import AnswerChain as Chain
assert chain == Chain(cast="bfloat16", digits=4) and chain.spec == "bfloat16+round-digits:4"
assert Chain.parse(chain.spec) == chain
assert defended.precision == "bfloat16" and defended.eps >= 2.0 * chain.answer_noise.rel_eps > 0
y = defended(np.random.default_rng(0).standard_normal((20, 3, 16)))  # 4 significant digits, every query counted
scale = 10.0 ** (np.floor(np.log10(np.abs(y))) - 3)
assert np.allclose(np.round(y / scale) * scale, y, rtol=1e-12, atol=0) and defended.queries == 20
"""),
    ("extract_ffn(", False, """
X = np.random.default_rng(0).standard_normal((500, net.d))
assert ffn.passed and ffn.check.error <= 1e-9 and rel(ffn.model.forward(X), net.forward(X)) <= 1e-9
assert sum(ffn.queries_by_phase.values()) == ffn.queries
"""),
    ("extract_transformer(", False, """
assert rec.passed and rel(rec.model.W, tf.W) <= 1e-9 and rec.check.error <= 1e-9
"""),
    ("minilm_layer(", True, """  # all 12 heads of a real layer, up to permutation
assert res.passed and match_heads(layer, res.model).worst <= 1e-6
"""),
    ('method="orthogonal"', False, """
assert mh.passed and match_heads(layer, mh.model).worst <= 1e-6
"""),
]
PRELUDE = """
import numpy as np
def rel(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))
"""


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def claims_of(block: str) -> tuple[bool, str]:
    found = [(slow, check) for marker, slow, check in CLAIMS if marker in block]
    assert len(found) == 1, f"a README example with {len(found)} sets of checked claims:\n{block[:300]}"
    return found[0]


def undefined_names(block: str) -> set[str]:
    """Names a block reads but neither imports, assigns, defines nor takes from builtins: what fails with a
    NameError when the block is pasted alone."""
    tree = ast.parse(block)
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            defined.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - defined


def test_every_readme_python_block_stands_alone():
    """Cheap, in the default run: each block compiles, defines or imports every name it reads, its imports
    resolve, and it has claims the slow test checks."""
    blocks = python_blocks()
    assert len(blocks) >= 10
    for block in blocks:
        assert undefined_names(block) == set(), f"pasted alone this block raises NameError:\n{block[:300]}"
        imports = [node for node in ast.parse(block).body if isinstance(node, (ast.Import, ast.ImportFrom))]
        exec(compile(ast.Module(body=imports, type_ignores=[]), "README.md", "exec"), {})  # noqa: S102
        claims_of(block)
    assert {m for m, _, _ in CLAIMS} <= {m for m, _, _ in CLAIMS if any(m in b for b in blocks)}, \
        "a checked claim whose example left the README"


def test_undefined_names_finds_what_a_pasted_block_lacks():
    assert undefined_names("x = Oracle(head, 16)") == {"Oracle", "head"}
    assert undefined_names("from attnprobe import Oracle\ndef f(X):\n    return Oracle(X, 4)\nf(1)") == set()


def _examples():
    for i, block in enumerate(python_blocks()):
        slow = claims_of(block)[0]
        yield pytest.param(block, id=f"block{i}", marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("block", list(_examples()))
def test_readme_python_example_runs_alone_and_its_claims_hold(block):
    """Each ```python block of the README, run alone in a fresh interpreter (as a user pastes it), then what it
    claims checked against the truth it was made from (not only that its functional check passed)."""
    program = block + "\n" + PRELUDE + claims_of(block)[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=900)
    assert run.returncode == 0, f"the example failed alone:\n{block}\n{run.stderr[-2000:]}"
    assert run.stdout.strip(), "the example prints what it recovered"
