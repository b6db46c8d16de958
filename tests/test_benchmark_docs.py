"""The results docs (docs/benchmarks/: an index and one file per capability) keep their shape, and the benchmarks'
section writer (benchmarks/sections.py, not part of the installed package) writes into them as documented."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "benchmarks"
INDEX = RESULTS / "README.md"
#: a line that names what produced the numbers: a benchmark script, an attnprobe or pytest command
COMMAND = re.compile(r"Command|benchmarks/\w+\.py|`(?:OPENBLAS\S* |PYTHONPATH\S* )*(?:python|attnprobe) |python -m")


def sections_module():
    spec = importlib.util.spec_from_file_location("benchmark_sections", ROOT / "benchmarks" / "sections.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def results_files():
    return sorted(p for p in RESULTS.glob("*.md") if p != INDEX)


def tables(lines):
    """Line numbers where a markdown table starts."""
    return [i for i, line in enumerate(lines) if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))]


def test_the_index_lists_every_results_file_and_stays_short():
    index = INDEX.read_text()
    assert len(index.splitlines()) <= 150
    listed = set(re.findall(r"\]\(([a-z0-9-]+\.md)\)", index))
    files = {p.name for p in results_files()}
    assert files - listed == set(), "add one line per new results file to docs/benchmarks/README.md"
    assert listed - files == set(), "the index lists files that do not exist"


@pytest.mark.parametrize("path", results_files(), ids=lambda p: p.name)
def test_a_results_file_is_short_has_each_heading_once_and_every_table_under_its_command(path):
    lines = path.read_text().splitlines()
    assert len(lines) <= 600, f"{path.name}: {len(lines)} lines; split it into two capability files"
    headings = [line for line in lines if line.startswith("#")]
    titles = [h.lstrip("#").strip() for h in headings]
    assert len(titles) == len(set(titles)), f"{path.name}: a heading appears twice"
    assert headings[0].startswith("# ") and sum(h.startswith("# ") for h in headings) == 1
    for start in tables(lines):
        top = max(i for i in range(start + 1) if i == 0 or lines[i].startswith("## "))
        assert any(COMMAND.search(line) for line in lines[top:start]), \
            f"{path.name}:{start + 1}: a table with no command above it in its section"
    prose = [i + 1 for i, line in enumerate(lines)
             if len(line) > 200 and not line.startswith(("|", "Command"))]
    assert not prose, f"{path.name}: prose lines over 200 characters at {prose}"


def test_no_heading_is_in_two_results_files():
    """A section title names one place (each file's "Design notes" excepted): a link or a benchmark's title finds
    one section."""
    seen: dict[str, str] = {}
    for path in results_files():
        for line in path.read_text().splitlines():
            title = line.lstrip("#").strip()
            if line.startswith("#") and title != "Design notes":
                assert title not in seen, f"{title!r} in {seen.get(title)} and {path.name}"
                seen[title] = path.name


def test_no_results_doc_is_left_in_the_old_single_file():
    old = ROOT / "docs" / "benchmarks.md"
    assert not old.exists() or len(old.read_text().splitlines()) <= 20


def test_the_library_writes_no_repository_files():
    import attnprobe.reports as reports

    assert not hasattr(reports, "write_section")
    assert not (ROOT / "src" / "attnprobe" / "reports" / "sections.py").exists()
    for py in (ROOT / "src").rglob("*.py"):
        assert "parents[3]" not in py.read_text(), f"{py}: a path into the checkout"


def test_write_section_replaces_its_own_section_and_adds_new_ones_above_the_design_notes(tmp_path):
    sections = sections_module()
    doc = tmp_path / "cap.md"
    doc.write_text("# Cap\n\n## A\n\nold A\n\n## B\n\nkept B\n\n## Design notes\n\nhand-written\n")
    sections.write_section("A", "| x |\n|---|\n| 1 |", "python benchmarks/a.py", doc=doc, stamp=False)
    sections.write_section("C", "new C", "python benchmarks/c.py", doc=doc, stamp=False)
    sections.write_section("D", "new D", "python benchmarks/d.py", doc=doc, parent="P", stamp=False)
    text = doc.read_text()
    assert "old A" not in text and "Command: `python benchmarks/a.py`\n\n| x |" in text
    assert text.index("kept B") < text.index("## C") < text.index("## P") < text.index("### D") \
        < text.index("## Design notes") < text.index("hand-written")
    assert text.count("## A\n") == 1
    sections.write_section("A", "again " * 60, "python benchmarks/a.py", doc=doc, stamp=False)
    assert max(len(line) for line in doc.read_text().splitlines()) <= 200


def test_write_section_names_a_capability_file_or_refuses():
    sections = sections_module()
    assert sections.results_file("lowrank") == sections.results_file("lowrank.md") == RESULTS / "lowrank.md"
    with pytest.raises(ValueError, match="doc="):
        sections.results_file("Low Rank")


def test_every_benchmark_that_writes_names_its_results_file():
    """A benchmark that writes its tables says into which capability file, and that file exists."""
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        text = script.read_text()
        for doc in re.findall(r"\bDOC = \"([a-z0-9-]+)\"", text):
            assert (RESULTS / f"{doc}.md").exists(), f"{script.name}: DOC = {doc!r} has no file"
        if "write_section(" in text and script.name != "sections.py":
            assert re.search(r"\bDOC = \"[a-z0-9-]+\"", text), f"{script.name}: no DOC = \"<capability>\""
        moved = re.findall(r"from attnprobe\.reports import [^\n]*\b(write_section|command_line|measured|machine)\b",
                           text)
        assert not moved, f"{script.name}: {moved} moved to benchmarks/sections.py (from sections import ...)"
