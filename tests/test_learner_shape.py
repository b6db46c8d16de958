"""The learners keep their shape: short functions, short positional parameter lists, and library
messages that name parameters, never command-line flags (only the CLI names flags)."""

import ast
import pathlib
import re

import pytest

import attnprobe.learners

LEARNERS_DIR = pathlib.Path(attnprobe.learners.__file__).parent
MODULES = sorted(LEARNERS_DIR.rglob("*.py"))


def functions(path):
    tree = ast.parse(path.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(LEARNERS_DIR).as_posix())
def test_functions_are_short_with_at_most_7_positional_parameters(path):
    for fn in functions(path):
        assert fn.end_lineno - fn.lineno + 1 <= 100, f"{path.name}:{fn.name} is longer than 100 lines"
        positional = len(fn.args.posonlyargs) + len(fn.args.args)
        assert positional <= 7, f"{path.name}:{fn.name} takes {positional} positional parameters"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(LEARNERS_DIR).as_posix())
def test_no_string_names_a_command_line_flag(path):
    flags = [m.group(0) for m in re.finditer(r"--[a-z][a-z-]*", path.read_text())]
    assert not flags, f"{path.name} names command-line flags {flags}; name the parameter instead"
