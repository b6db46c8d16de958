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
