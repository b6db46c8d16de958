"""Every script in examples/ runs and says what it recovered (fast settings: a small random BERT folder; the
audit example also on the installed MiniLM-L6 with its defaults, marked slow)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from attnprobe.models import load_model  # noqa: E402
from attnprobe.models.multihead import match_heads  # noqa: E402
from attnprobe.targets.hf import hf_layer_row  # noqa: E402
from hf_models import tiny_bert_dir  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_bert_dir(tmp_path_factory.mktemp("tiny_bert"), hidden=12, heads=2, layers=2, seed=2))


def test_every_example_is_tested():
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == ["attack_served_layer", "audit_hf_folder",
                                                              "recover_layer"]


def test_audit_hf_folder(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert example("audit_hf_folder").run(["--model-dir", tiny, "--heads", "all", "--layers", "1", "--out",
                                           "audit_out"]) == 0
    out = capsys.readouterr().out
    assert out.count("passed") == 4 and "FAILED" not in out
    results = json.loads((tmp_path / "audit_out" / "results.json").read_text())
    assert {h["defense"] for h in results["heads"]} == {"none", "float32"}
    assert all(max(h["relative_error"].values()) < (1e-9 if h["defense"] == "none" else 1e-3)
               for h in results["heads"])


@pytest.mark.slow
def test_audit_hf_folder_on_minilm_defaults(tmp_path, monkeypatch, capsys):
    """The example's defaults: two heads of the real MiniLM-L6 layer 0, exact answers and float32 answers."""
    monkeypatch.chdir(tmp_path)
    assert example("audit_hf_folder").run(["--out", "audit_out"]) == 0
    results = json.loads((tmp_path / "audit_out" / "results.json").read_text())
    assert len(results["heads"]) == 4 and all(h["passed"] for h in results["heads"])
    assert all(max(h["relative_error"].values()) < (1e-8 if h["defense"] == "none" else 1e-3)
               for h in results["heads"])


def test_recover_layer(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert example("recover_layer").run(["--model-dir", tiny, "--layer", "1", "--row", "5", "--out",
                                         "recovered_layer.npz"]) == 0
    assert "check passed" in capsys.readouterr().out
    got = load_model(tmp_path / "recovered_layer.npz")
    assert match_heads(hf_layer_row(tiny, 1, 5), got).worst < 1e-6


def test_attack_served_layer(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNPROBE_API_KEY", "restored after the test")  # the example sets its own key
    assert example("attack_served_layer").run(["--model-dir", tiny, "--layer", "0", "--row", "2", "--work",
                                               "served_attack"]) == 0
    out = capsys.readouterr().out
    assert "check passed = True" in out
    got = load_model(tmp_path / "served_attack" / "got.npz")
    assert match_heads(hf_layer_row(tiny, 0, 2), got).worst < 1e-6


def test_examples_leave_nothing_in_the_current_folder(tiny, tmp_path, monkeypatch, capsys):
    """Run from a checkout's root, an example writes into a new temporary folder it names, never beside the
    user's files."""
    import shutil

    here = tmp_path / "checkout"
    here.mkdir()
    monkeypatch.chdir(here)
    assert example("recover_layer").run(["--model-dir", tiny, "--layer", "0", "--row", "1"]) == 0
    assert example("audit_hf_folder").run(["--model-dir", tiny, "--heads", "0", "--layers", "0",
                                           "--defense", "none"]) == 0
    out = capsys.readouterr().out
    assert list(here.iterdir()) == []
    wrote = Path(next(ln for ln in out.splitlines() if ln.startswith("wrote ")).split(" ", 1)[1])
    report = Path(next(ln for ln in out.splitlines() if ln.startswith("report: ")).split(" ", 1)[1])
    assert wrote.is_file() and report.is_file()
    shutil.rmtree(wrote.parent)
    shutil.rmtree(report.parent.parent)
