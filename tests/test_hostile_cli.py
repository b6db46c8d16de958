"""Hostile use of the command line: a failed check is exit 3 and writes nothing; bad options are one line and
exit 2 before any query; every message that ends a run says how many queries were spent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnprobe.models import AttentionHead, load_model, save_model
from attnprobe.targets import random_head
from hostile import one_line, refused, run, snapshot


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder with a biased head ``t.npz`` and a head ``u.npz`` whose only bias is u; the cwd."""
    h = random_head(6, seed=3)
    save_model(h, tmp_path / "t.npz")
    save_model(AttentionHead(h.W, h.v, h.u, 0.0), tmp_path / "u.npz")
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------- a failed check is exit 3
@pytest.mark.parametrize("argv", [
    ["--target", "u.npz", "--no-bias"],                                   # the model class drops u: W 99 % wrong
    ["--target", "t.npz", "--method", "transformer", "--transformer-route", "paper"],  # a head is no transformer
    ["--target", "t.npz", "--method", "robust", "--probes", "paper", "--w-bound", "3", "--margin", "0.01"],
])
def test_failed_check_exits_3_and_writes_nothing(folder, capsys, argv):
    line = refused(capsys, folder, "extract", *argv, "--out", "o.npz", "--quiet", code=3, says="check failed")
    assert "tolerance" in line and "nothing written" in line and "queries spent (not logged)" in line
    assert not (folder / "o.npz").exists() and not (folder / "o.json").exists()
    if "--no-bias" in argv:  # the learner's hint (what its model class assumed, what to try) reaches the line
        assert "(a single head of this form without biases: learn with bias=True)" in line, line


def test_ffn_on_an_attention_head_is_refused_as_affine(folder, capsys):
    # length-1 queries of a head are affine in x: the ReLU-network learner (biases allowed) finds no kink and
    # refuses (exit 2) instead of returning a network whose check then fails
    refused(capsys, folder, "extract", "--target", "t.npz", "--method", "ffn", "--out", "o.npz", "--quiet", code=2,
            says="no kink")


def test_failed_check_nuclear_too_few_measurements(folder, capsys):
    pytest.importorskip("cvxpy")
    refused(capsys, folder, "extract", "--target", "t.npz", "--method", "nuclear", "--rank", "2", "--measurements",
            "10", "--out", "o.npz", "--quiet", code=3, says="functional check error")


def test_keep_failed_writes_the_result_marked_failed(folder, capsys):
    old = {"u.npz": (folder / "u.npz").read_bytes()}
    rc, _, err = run(capsys, "extract", "--target", "u.npz", "--no-bias", "--keep-failed", "--out", "o.npz",
                     "--quiet")
    assert rc == 3 and "written anyway" in one_line(err)
    summary = json.loads((folder / "o.json").read_text())
    assert summary["check"]["passed"] is False and summary["check"]["relative_error"] > summary["check"]["tolerance"]
    assert load_model(folder / "o.npz").d == 6 and (folder / "u.npz").read_bytes() == old["u.npz"]


def test_python_api_returns_the_failed_result(folder):
    from attnprobe import Oracle, extract_exact

    res = extract_exact(Oracle(load_model(folder / "u.npz"), 6), bias=False)
    assert res.check.passed is False and res.check.error > 0.1


# ---------------------------------------------------------------- files never destroyed
@pytest.mark.parametrize("out", ["t.npz", "./t.npz", "t", "sub/../t.npz"])
def test_out_equal_to_target_is_refused_before_any_query(folder, capsys, out):
    (folder / "sub").mkdir()
    line = refused(capsys, folder, "extract", "--target", "t.npz", "--out", out, "--quiet",
                   says="would overwrite the input")
    assert "no queries spent" in line


def test_out_json_next_to_target_is_refused(folder, capsys):
    refused(capsys, folder, "extract", "--target", "t.npz", "--out", "t.json", "--quiet", says="names the .npz file")


def test_out_through_a_symlink_to_the_target_is_refused(folder, capsys):
    (folder / "link.npz").symlink_to(folder / "t.npz")
    refused(capsys, folder, "extract", "--target", "t.npz", "--out", "link.npz", "--quiet",
            says="would overwrite the input")


def test_unwritable_out_is_refused_before_any_query(folder, capsys):
    line = refused(capsys, folder, "extract", "--target", "t.npz", "--out", "/sys/x.npz", "--quiet",
                   says="--out")
    assert "no queries spent" in line
    (folder / "o.json").mkdir()
    refused(capsys, folder, "extract", "--target", "t.npz", "--out", "o.npz", "--quiet", says="not a regular file")


def test_a_full_disk_mid_save_keeps_the_old_files(folder, capsys, monkeypatch):
    """np.savez fails half-way (ENOSPC): the old OUT.npz and OUT.json stay whole and no temporary is left."""
    assert run(capsys, "extract", "--target", "t.npz", "--out", "o.npz", "--quiet")[0] == 0
    before = snapshot(folder)
    real = np.savez

    def full_disk(f, *a, **k):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    rc, _, err = run(capsys, "extract", "--target", "t.npz", "--seed", "1", "--out", "o.npz", "--quiet")
    monkeypatch.setattr(np, "savez", real)
    line = one_line(err)
    assert rc == 2 and "No space left" in line and "queries spent" in line
    assert snapshot(folder) == before


# ---------------------------------------------------------------- one line and exit 2, never a traceback
def _write_victim(folder, body: str, name: str = "victim") -> None:
    (folder / f"{name}.py").write_text("import numpy as np\n" + body)


@pytest.mark.parametrize("argv, says", [
    (["extract", "--target", "t.npz", "--seed", "-1", "--out", "o.npz"], "--seed"),
    (["extract", "--target", "t.npz", "--noise", "avq:1e-3", "--noise-seed", "-5", "--out", "o.npz"], "--noise-seed"),
    (["target", "random", "--d", "-2", "--out", "r.npz"], "--d"),
    (["target", "random", "--d", "0", "--out", "r.npz"], "--d"),
    (["target", "random", "--d", "100000000", "--out", "r.npz"], "GiB of memory"),
    (["target", "random", "--d", "5", "--rank", "-1", "--out", "r.npz"], "--rank"),
    (["target", "random", "--d", "5", "--rank", "9", "--out", "r.npz"], "rank must be between 1 and d = 5"),
    (["target", "transformer", "--d", "5", "--m", "0", "--out", "r.npz"], "--m"),
    (["extract", "--oracle", "victim:answer", "--d", "10000000", "--out", "o.npz"], "GiB of memory"),
    (["extract", "--target", "cvec.npz", "--out", "o.npz"], "c must be a scalar (one number) for scalar answers"),
    (["extract", "--target", "wstr.npz", "--out", "o.npz"], "real numbers"),
    (["extract", "--target", "wcplx.npz", "--out", "o.npz"], "real numbers"),
    (["extract", "--target", "v2d.npz", "--out", "o.npz"], "W must be 4x4 to match v of shape (2, 4)"),
    (["verify", "--target", "tf.npz", "--result", "t.npz"], "cannot be compared"),
    (["verify", "--target", "t.npz", "--result", "relu.npz"], "cannot be compared"),
    (["verify", "--target", "t.npz", "--result", "t4.npz"], "d = 4"),
    (["extract", "--oracle", "quitter:answer", "--d", "6", "--out", "o.npz"], "called exit(0)"),
    (["extract", "--oracle", "cplx:answer", "--d", "6", "--out", "o.npz"], "complex numbers"),
])
def test_bad_input_is_one_line_and_exit_2(folder, capsys, argv, says):
    from attnprobe.targets import random_relu_net, random_transformer

    h = load_model(folder / "t.npz")
    np.savez(folder / "cvec.npz", kind="attention_head", W=h.W, v=h.v, u=h.u, c=np.ones(3))
    np.savez(folder / "wstr.npz", kind="attention_head", W=np.full((6, 6), "x"), v=h.v)
    np.savez(folder / "wcplx.npz", kind="attention_head", W=h.W + 1j, v=h.v)
    np.savez(folder / "v2d.npz", kind="attention_head", W=np.eye(8), v=np.ones((2, 4)))
    save_model(random_transformer(6, 6, seed=0), folder / "tf.npz")
    save_model(random_relu_net(6, 6, seed=0), folder / "relu.npz")
    save_model(random_head(4, seed=0), folder / "t4.npz")
    _write_victim(folder, "def answer(X):\n    return np.zeros(len(X))\n")
    _write_victim(folder, "import sys\ndef answer(X):\n    sys.exit(0)\n", "quitter")
    _write_victim(folder, "def answer(X):\n    return np.ones(len(X)) * (1 + 2j)\n", "cplx")
    refused(capsys, folder, *argv, "--quiet" if argv[0] == "extract" else None, says=says) \
        if argv[0] == "extract" else refused(capsys, folder, *argv, says=says)


def test_verify_json_into_a_missing_folder_is_written(folder, capsys):
    rc, _, err = run(capsys, "verify", "--target", "t.npz", "--result", "t.npz", "--json", "new/dir/e.json")
    assert rc == 0, err
    assert json.loads((folder / "new/dir/e.json").read_text())["W"] == 0.0
    refused(capsys, folder, "verify", "--target", "t.npz", "--result", "t.npz", "--json", "t.npz",
            says="would overwrite the input")


# ---------------------------------------------------------------- no option silently wrong or ignored
@pytest.mark.parametrize("argv, says", [
    (["--target", "t.npz", "--method", "exact", "--rank", "2"], "does not use --rank"),
    (["--target", "t.npz", "--measurements", "30"], "does not use --measurements"),
    (["--target", "t.npz", "--w-bound", "3"], "does not use --w-bound"),
    (["--target", "t.npz", "--tolerance", "0.1"], "does not use --tolerance"),
    (["--target", "t.npz", "--method", "lowrank", "--samples", "5"], "does not use --samples"),
    (["--target", "t.npz", "--sign-time-limit", "3"], "does not use --sign-time-limit"),
    (["--target", "t.npz", "--method", "ffn", "--sign-time-limit", "-1"], "--sign-time-limit"),
    (["--target", "t.npz", "--method", "ffn", "--sign-time-limit", "nan"], "--sign-time-limit"),
    (["--target", "t.npz", "--d", "5"], "contradicts"),
    (["--target", "t.npz", "--round-digits", "0"], "--round-digits"),
    (["--target", "t.npz", "--round-digits", "400"], "--round-digits: float64 answers carry at most 17 significant"),
    (["--target", "t.npz", "--round", "400"], "--round: expected -308 <= K <= 308"),
    (["--target", "t.npz", "--method", "lowrank", "--rank", "7"], "--rank must be an integer in [1, 6]"),
    (["--target", "t.npz", "--membership"], "use --method membership"),
    (["--target", "t.npz", "--method", "membership", "--probes", "paper", "--samples", "0"], "--samples"),
])
def test_ignored_or_silently_wrong_options_are_refused(folder, capsys, argv, says):
    line = refused(capsys, folder, "extract", *argv, "--out", "o.npz", "--quiet", says=says)
    assert "Traceback" not in line


def test_round_zero_decimals_is_applied(folder, capsys):
    rc, _, err = run(capsys, "extract", "--target", "t.npz", "--method", "robust", "--round", "0", "--out",
                     "o.npz", "--quiet")
    assert rc in (2, 3), err  # integer answers carry almost nothing about W: refused or failed, never "passed"
    rc, _, err = run(capsys, "extract", "--target", "t.npz", "--round", "12", "--out", "o.npz", "--quiet")
    assert rc == 0, err
    # answers rounded to 12 decimals leave the model ~1e-12 off (float64 answers leave ~1e-15): the rounding was
    # applied, and it costs the model no more than it explains
    check = json.loads((folder / "o.json").read_text())["check"]
    assert check["passed"] and 1e-14 < check["relative_error"] < 1e-9
    truth, got = load_model(folder / "t.npz"), load_model(folder / "o.npz")
    assert 1e-14 < np.linalg.norm(got.W - truth.W) / np.linalg.norm(truth.W) < 1e-9


def test_library_refuses_what_it_used_to_truncate_or_drop():
    from attnprobe import Oracle
    from attnprobe.errors import AttnprobeError
    from attnprobe.oracles.wrappers import Rounded

    h = random_head(4, seed=0)
    for bad in (dict(d=8.7), dict(d=float("nan")), dict(d=True), dict(d=4, budget=float("nan")),
                dict(d=4, budget=-1), dict(d=4, budget=2.5)):
        with pytest.raises(AttnprobeError):
            Oracle(h, **bad)
    assert Oracle(h, d=4.0, budget=10.0).budget == 10
    for kw in (dict(digits=400), dict(digits=0), dict(decimals=400)):
        with pytest.raises(AttnprobeError):
            Rounded(h, **kw)
    assert np.all(np.isfinite(Rounded(lambda X: np.full(len(X), 3e300), decimals=300)(np.zeros((2, 1, 4)))))
    with pytest.raises(AttnprobeError, match="imaginary|real numbers"):
        AttentionHead(h.W + 0.5j, h.v)
    with pytest.raises(AttnprobeError, match=r"W must be 4x4 to match v of shape \(2, 4\)"):
        AttentionHead(np.eye(8), np.ones((2, 4)))  # a (K, d) v is a whole output row; W must still be d x d
    with pytest.raises(AttnprobeError, match=r"v must have shape \(d,\) or \(K, d\)"):
        AttentionHead(np.eye(4), np.ones((2, 2, 4)))


# ---------------------------------------------------------------- messages say what is wrong
def test_membership_on_v_zero_does_not_blame_only_c(folder, capsys):
    h = load_model(folder / "t.npz")
    save_model(AttentionHead(h.W, np.zeros(6)), folder / "z.npz")
    line = refused(capsys, folder, "extract", "--target", "z.npz", "--method", "membership", "--out", "o.npz",
                   "--quiet", says="v = 0")
    assert "queries spent" in line


def test_text_file_is_not_called_pickled(folder, capsys):
    (folder / "notes.npz").write_text("hello\n")
    line = refused(capsys, folder, "extract", "--target", "notes.npz", "--out", "o.npz", "--quiet",
                   says="not a zip archive")
    assert "pickle" not in line


def test_budget_message_says_it_is_a_lower_bound(folder, capsys):
    line = refused(capsys, folder, "extract", "--target", "t.npz", "--budget", "10", "--out", "o.npz", "--quiet",
                   says="lower bound")
    assert "0 queries spent" in line


def test_bare_torch_module_is_adapted(folder, capsys):
    pytest.importorskip("torch")
    _write_victim(folder, "import torch\nclass Head(torch.nn.Module):\n    def forward(self, X):\n"
                  "        return torch.relu(X[:, 0, :]).sum(dim=1)\nhead = Head()\n", "tvictim")
    rc, out, err = run(capsys, "extract", "--oracle", "tvictim:head", "--d", "3", "--method", "ffn", "--out",
                       "o.npz", "--quiet")
    assert rc == 0, err  # a ReLU network of one neuron per input: recovered through the torch adapter
    assert "queries" in out


# ---------------------------------------------------------------- the oracle's folder shadows nothing
def test_oracle_module_does_not_shadow_installed_modules(folder, capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    _write_victim(folder, "from attnprobe.models import load_model\nhead = load_model('t.npz')\n"
                  "def answer(X):\n    return head(X)\n")
    (folder / "tqdm.py").write_text("raise SystemExit('the tqdm.py of the current directory was executed')\n")
    (folder / "scipy.py").write_text("raise SystemExit('the scipy.py of the current directory was executed')\n")
    monkeypatch.delitem(sys.modules, "tqdm", raising=False)
    monkeypatch.delitem(sys.modules, "victim", raising=False)  # another test's victim.py, imported in this worker
    rc, out, err = run(capsys, "extract", "--oracle", "victim:answer", "--d", "6", "--out", "o.npz")
    assert rc == 0, err
    assert sys.path[0] != str(folder) and "executed" not in err
    import importlib

    tqdm = importlib.import_module("tqdm")  # imported later, as the progress bar does: the installed one
    assert not str(tqdm.__file__).startswith(str(folder))


# ---------------------------------------------------------------- every ending says the queries spent
def test_oracle_failing_late_reports_all_queries_spent(folder, capsys):
    _write_victim(folder, "from attnprobe.models import load_model\nhead = load_model('t.npz')\ncalls = [0]\n"
                  "def answer(X):\n    calls[0] += len(X)\n    if calls[0] > 40:\n"
                  "        raise RuntimeError('backend down')\n    return head(X)\n", "flaky")
    line = refused(capsys, folder, "extract", "--oracle", "flaky:answer", "--d", "6", "--out", "o.npz", "--quiet",
                   says="backend down")
    spent = int(line.split("; ")[-1].split()[0])
    assert spent > 40 and "not logged" in line


# ---------------------------------------------------------------- bfloat16 works or is refused in one line
@pytest.mark.parametrize("flags", [["--dtype", "bfloat16"], ["--cast", "bfloat16"],
                                   ["--answer-precision", "bfloat16"]])
@pytest.mark.parametrize("method", ["exact", "robust", "lowrank"])
def test_bfloat16_answers_never_crash(folder, capsys, flags, method):
    rc, out, err = run(capsys, "extract", "--target", "t.npz", "--method", method, *flags, "--out", "o.npz",
                       "--quiet")
    if rc == 0:
        summary = json.loads((folder / "o.json").read_text())
        assert summary["check"]["passed"] and not err
    else:
        assert rc in (2, 3) and "internal error" not in one_line(err)


@pytest.mark.parametrize("method, target", [("ffn", "relu.npz"), ("transformer", "tf.npz")])
def test_bfloat16_is_refused_by_the_kink_learners(folder, capsys, method, target):
    from attnprobe.targets import random_relu_net, random_transformer

    save_model(random_transformer(6, 6, seed=0), folder / "tf.npz")
    save_model(random_relu_net(6, 6, seed=0), folder / "relu.npz")
    refused(capsys, folder, "extract", "--target", target, "--method", method, "--dtype", "bfloat16", "--out",
            "o.npz", "--quiet", says="float32 or better")


def test_bfloat16_precision_helpers():
    from attnprobe.learners.head.scaling import max_probe_scale
    from attnprobe import Oracle

    o = Oracle(random_head(3, seed=0), 3, precision="bfloat16")
    assert o.eps == 2.0**-7  # bfloat16's largest finite value is 3.39e38, as for float32
    assert max_probe_scale(o) == pytest.approx(min(1e8, 0.01 * np.sqrt(3.3895313892515355e38)))
