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


PACKAGE_DIR = LEARNERS_DIR.parent


@pytest.mark.parametrize("path", sorted(PACKAGE_DIR.rglob("*.py")), ids=lambda p: p.relative_to(PACKAGE_DIR).as_posix())
def test_every_config_error_names_its_parameter(path):
    """The CLI names the flag of ``ConfigError.param``; a refusal without it could only be read, not acted on
    (an error no parameter of the run can fix is another class: ``MissingDependencyError``, ``OracleError``, ...).
    Every module of the package, not only the learners."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and "ConfigError" in (getattr(node.func, "id", None),
                                                           getattr(node.func, "attr", None)):
            assert any(k.arg == "param" for k in node.keywords), f"{path.name}:{node.lineno} names no parameter"


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnprobe"):
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from ((a.name, []) for a in node.names if a.name.startswith("attnprobe"))


FAMILIES = sorted(p.name for p in LEARNERS_DIR.iterdir() if p.is_dir() and (p / "__init__.py").exists()
                  and p.name != "core")


def test_the_core_knows_no_family():
    """``learners/core`` (the skeleton, results, check, registry, estimate) imports no family package: a family
    registers itself with the core, never the other way round."""
    assert {"head", "ffn", "multihead", "transformer"} <= set(FAMILIES)
    for path in sorted((LEARNERS_DIR / "core").glob("*.py")):
        for module, _ in _imports(path):
            assert not any(module.startswith(f"attnprobe.learners.{f}") for f in FAMILIES), (path.name, module)
            assert module != "attnprobe.learners", (path.name, module)


REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("folder", ["src/attnprobe", "tests", "benchmarks"])
def test_no_module_imports_another_modules_private_name(folder):
    """Neither the package nor its tests and benchmarks import a private (``_name``) name of an attnprobe module:
    a test goes through the public API, and a name worth testing on its own is public."""
    root = LEARNERS_DIR.parent if folder == "src/attnprobe" else REPO / folder
    paths = sorted(root.rglob("*.py"))
    assert paths, root
    for path in paths:
        for module, names in _imports(path):
            private = [n for n in names if n.startswith("_")]
            assert not private, f"{folder}/{path.relative_to(root)} imports {private} from {module}"
