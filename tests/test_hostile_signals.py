"""SIGINT and SIGTERM end every run promptly with 130/143 and one line saying how many queries were spent,
even inside the SCS solver (which would otherwise trap Ctrl-C and fall back to another solver)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from attnprobe.models import save_model
from attnprobe.targets import random_head


def _start(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.Popen([sys.executable, "-m", "attnprobe", "extract", *args, "--out", "o.npz", "--quiet"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(marker, proc):
    """Wait until the run touches ``marker`` (or ends)."""
    for _ in range(1200):
        if marker.exists() or proc.poll() is not None:
            return
        time.sleep(0.05)


def test_sigint_ends_nuclear_inside_the_solver(tmp_path):
    sig, code, word = signal.SIGINT, 130, "interrupted"
    pytest.importorskip("cvxpy")
    save_model(random_head(48, seed=0, rank=2), tmp_path / "h.npz")
    # the oracle's module also marks the moment SCS starts (scs.solve is what cvxpy calls), so that the signal
    # arrives inside the solver, where SCS would trap SIGINT and the run would go on with another solver; the
    # solve is also told to run until stopped (no tolerance it can reach, no iteration limit in sight), so the
    # signal lands inside it however fast or slow the machine is
    (tmp_path / "victim.py").write_text(
        "import pathlib, scs\nfrom attnprobe.models import load_model\nhead = load_model('h.npz')\n"
        "real = scs.solve\n"
        "def solve(*a, **k):\n    pathlib.Path('solving').touch()\n"
        "    k.update(max_iters=10**9, eps_abs=1e-300, eps_rel=1e-300, eps_infeas=1e-300)\n"
        "    return real(*a, **k)\n"
        "scs.solve = solve\n"
        "def answer(X):\n    return head(X)\n")
    proc = _start(tmp_path, "--oracle", "victim:answer", "--d", "48", "--method", "nuclear", "--rank", "2")
    try:
        _wait_for(tmp_path / "solving", proc)
        time.sleep(0.5)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # the run ignored the signal: end it, then fail below
            proc.kill()
            out, err = proc.communicate()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == code, err
    assert len(lines) == 1 and lines[0].startswith(f"attnprobe: {word}") and "Traceback" not in err
    spent = int(lines[0].rsplit("; ", 1)[1].split()[0])
    assert spent > 576 and "not logged" in lines[0]
    assert not (tmp_path / "o.npz").exists() and not (tmp_path / "o.json").exists()
    assert "CLARABEL" not in err + out


def test_sigterm_ends_an_extraction_with_143(tmp_path):
    save_model(random_head(40, seed=0), tmp_path / "h.npz")
    (tmp_path / "victim.py").write_text(
        "import pathlib, time\nfrom attnprobe.models import load_model\nhead = load_model('h.npz')\n"
        "def answer(X):\n    if X.shape[1] == 2:\n        pathlib.Path('asked').touch()\n        time.sleep(0.5)\n"
        "    return head(X)\n")  # a slow API: the run is still asking when the signal comes
    proc = _start(tmp_path, "--oracle", "victim:answer", "--d", "40")
    _wait_for(tmp_path / "asked", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 143, err
    assert len(lines) == 1 and lines[0].startswith("attnprobe: terminated") and "queries spent" in lines[0]
    assert not (tmp_path / "o.npz").exists() and not (tmp_path / "o.json").exists()


def test_nuclear_refuses_a_solve_estimated_too_long_before_any_query(tmp_path, capsys, monkeypatch):
    pytest.importorskip("cvxpy")
    from hostile import refused

    save_model(random_head(160, seed=0, rank=2), tmp_path / "big.npz")
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, tmp_path, "extract", "--target", "big.npz", "--method", "nuclear", "--rank", "2",
                   "--out", "o.npz", "--quiet", says="would take about")
    assert "raise --solver-time-limit" in line
    assert "GiB" in line and "no queries spent" not in line and "0 queries spent" in line


# A signal while the command line imports its subcommands (numpy, scipy, the learners: a second or more on a
# loaded machine). The driver raises the signal from inside the import of a named module, so it lands there on
# any machine, however fast: it runs ``python -m attnprobe`` (runpy) after installing an import hook that prints
# a marker and raises the signal when that module is first imported.
IMPORT_SIGNAL_DRIVER = """
import importlib.abc, runpy, signal, sys
trigger, sig = sys.argv[1], getattr(signal, sys.argv[2])
class SignalOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == trigger:
            sys.meta_path.remove(self)
            print(f"marker: importing {name}", file=sys.stderr, flush=True)
            signal.raise_signal(sig)
        return None
sys.meta_path.insert(0, SignalOnImport())
sys.argv = ["attnprobe", *sys.argv[3:]]
runpy.run_module("attnprobe", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module, sig, code, word", [("numpy", "SIGINT", 130, "interrupted"),
                                                     ("scipy", "SIGINT", 130, "interrupted"),
                                                     ("numpy", "SIGTERM", 143, "terminated")])
def test_a_signal_while_the_cli_imports_ends_with_one_line(tmp_path, module, sig, code, word):
    save_model(random_head(4, seed=0), tmp_path / "t.npz")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", IMPORT_SIGNAL_DRIVER, module, sig, "extract", "--target", "t.npz",
                           "--out", "o.npz", "--quiet"], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[0] == f"marker: importing {module}", proc.stderr  # the signal came during the import
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 2 and lines[1] == f"attnprobe: {word}: stopped by {sig}" + (
        " (Ctrl-C)" if sig == "SIGINT" else "") + "; no result written"
    assert not (tmp_path / "o.npz").exists()


def test_importing_the_package_and_its_cli_loads_nothing_heavy():
    """``import attnprobe`` and ``import attnprobe.cli`` load no numpy/scipy/torch/cvxpy (so the handlers above
    are in place before those imports); the public names still resolve."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    code = ("import sys, attnprobe, attnprobe.cli\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'scipy', 'torch', 'cvxpy'})\n"
            "print(heavy)\n"
            "from attnprobe import Oracle, extract_exact, AttentionHead, load_model, save_model, Extraction\n"
            "print(Oracle.__name__, extract_exact.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "[]"
    assert out.stdout.splitlines()[1].startswith("Oracle")
