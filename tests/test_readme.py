"""The README's set-up commands are the ones CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv[^\n]*)\n```", text)


def test_readme_has_two_setup_lines_and_ci_runs_the_test_line():
    cmds = readme_commands()
    assert len(cmds) == 2
    demo, tests = cmds
    assert demo.endswith("attnprobe demo") and "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines()


def test_readme_python_examples_run(capsys):
    """Every ```python block of the README, run in order in one namespace."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    ns: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 - our own documentation
    assert ns["result"].check.passed and ns["res"].check.error < 1e-2
    assert capsys.readouterr().out.strip()
