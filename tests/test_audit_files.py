"""What an audit does to its --out folder: it never removes a file it did not write, a narrower rerun keeps what a
wider one finished, its journal is only appended to, and a full disk or a file-size limit ends it with exit 2 and
one line, the finished tasks kept and no empty folder left."""

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hostile import SRC, full_disk, run, snapshot


@pytest.fixture
def ckpt(tmp_path):
    """A 2-layer checkpoint of 2 heads (d = 8) with biases, in ``tmp_path/m.safetensors``."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    t = {}
    for layer in range(2):
        p = f"encoder.layer.{layer}.attention."
        for name in ("self.query", "self.key", "self.value", "output.dense"):
            t[p + name + ".weight"] = (rng.standard_normal((8, 8)) / np.sqrt(8)).astype(np.float32)
            t[p + name + ".bias"] = (0.1 * rng.standard_normal(8)).astype(np.float32)
    save_file(t, str(tmp_path / "m.safetensors"))
    return tmp_path


def _audit(folder, *extra, out="out"):
    return ["audit", "--safetensors", str(folder / "m.safetensors"), "--heads-per-layer", "2", "--out",
            str(folder / out), "--quiet", "--method", "exact", *extra]


def _journal_lines(out: Path) -> list[str]:
    return (out / "finished.jsonl").read_text().splitlines()


def test_a_narrower_rerun_keeps_what_a_wider_one_finished(ckpt, capsys):
    out = ckpt / "out"
    rc, _, err = run(capsys, *_audit(ckpt, "--defense", "none,float32", "--heads", "0"))
    assert rc == 0, err
    wide = snapshot(out / "heads")
    assert len(wide) == 4 and len(_journal_lines(out)) == 5
    for narrower in (["--layers", "0", "--defense", "none"], ["--defense", "float32"]):
        rc, stdout, err = run(capsys, *_audit(ckpt, *narrower, "--heads", "0"))
        assert rc == 0 and not err, err
        assert "resumed" in stdout
        assert snapshot(out / "heads") == wide  # nothing deleted, nothing rewritten
        assert len(_journal_lines(out)) == 5  # the journal keeps every finished task
    rc, stdout, _ = run(capsys, *_audit(ckpt, "--defense", "none,float32", "--heads", "0"))
    assert rc == 0 and "resumed 4 finished tasks" in stdout  # the wide audit is still whole


def test_a_new_defence_never_overwrites_another_tasks_head_file(ckpt, capsys):
    """``none,float32`` names the undefended heads L0H0.npz; a later ``--defense float16`` alone would name its heads
    L0H0.npz too: it takes a longer name instead, and the journal's record for L0H0.npz stays true."""
    out = ckpt / "out"
    assert run(capsys, *_audit(ckpt, "--layers", "0", "--defense", "none,float32"))[0] == 0
    before = snapshot(out / "heads")
    rc, _, err = run(capsys, *_audit(ckpt, "--layers", "0", "--defense", "float16"))
    assert rc == 0, err
    after = snapshot(out / "heads")
    assert {k: after[k] for k in before} == before
    res = json.loads((out / "results.json").read_text())
    assert {h["file"] for h in res["heads"]} == {"heads/L0H0_float16_exact.npz", "heads/L0H1_float16_exact.npz"}
    rc, stdout, _ = run(capsys, *_audit(ckpt, "--layers", "0", "--defense", "none,float32,float16"))
    assert rc == 0 and "resumed 6 finished tasks" in stdout


def test_files_the_audit_did_not_write_are_never_removed(ckpt, capsys):
    out = ckpt / "out"
    (out / "heads").mkdir(parents=True)
    (out / "heads" / "precious.npz").write_bytes(b"mine")
    (out / "heads" / "L0H0.npz").write_bytes(b"also mine: no journal says an audit wrote it")
    for extra in ([], ["--fresh"]):
        rc, _, err = run(capsys, *_audit(ckpt, "--layers", "0", *extra))
        assert rc == 0, err
        assert (out / "heads" / "precious.npz").read_bytes() == b"mine"
        assert (out / "heads" / "L0H0.npz").read_bytes() == b"also mine: no journal says an audit wrote it"
    files = {h["file"] for h in json.loads((out / "results.json").read_text())["heads"]}
    assert files == {"heads/L0H0_none_exact.npz", "heads/L0H1.npz"}


def test_the_journal_is_appended_to_and_a_cut_line_stays_cut(ckpt, capsys):
    out = ckpt / "out"
    assert run(capsys, *_audit(ckpt, "--layers", "0"))[0] == 0
    first = (out / "finished.jsonl").read_bytes()
    cut = first[:-40]  # the last record cut short, as by a kill while writing it
    (out / "finished.jsonl").write_bytes(cut)
    rc, stdout, err = run(capsys, *_audit(ckpt, "--layers", "0-1"))
    assert rc == 0, err
    text = (out / "finished.jsonl").read_bytes()
    assert text.startswith(cut + b"\n")  # appended after the cut line, never rewritten
    assert "resumed 1 finished tasks" in stdout  # the cut record's task was run again
    assert all(json.loads(line) for line in text.decode().splitlines()[1:] if line.endswith("}}"))


def _cli(args, **kw):
    return subprocess.run([sys.executable, "-m", "attnprobe", *args], env=dict(os.environ, PYTHONPATH=SRC),
                          capture_output=True, text=True, timeout=300, **kw)


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnprobe: error: "), err
    return lines[0]


def test_a_file_size_limit_leaves_a_finished_audit_whole(ckpt, capsys):
    """``ulimit -f``: the rerun of a finished audit cannot write results.json: exit 2, one line, the journal and
    every head file as they were; the next run (no limit) resumes every task."""
    args = _audit(ckpt, "--defense", "none,float32", "--layers", "0")
    assert run(capsys, *args)[0] == 0
    before = snapshot(ckpt / "out")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    p = _cli(args, preexec_fn=limit)  # every task resumed: no worker is started
    assert p.returncode == 2, p.stderr
    line = _one_line(p.stderr)
    assert "cannot write the audit's results" in line and "File too large" in line and "4 finished tasks" in line
    after = snapshot(ckpt / "out")
    assert after["finished.jsonl"] == before["finished.jsonl"]
    assert {k: v for k, v in after.items() if k.startswith("heads/")} == \
        {k: v for k, v in before.items() if k.startswith("heads/")}
    rc, stdout, _ = run(capsys, *args)
    assert rc == 0 and "resumed 4 finished tasks" in stdout


@pytest.mark.parametrize("size", [pytest.param("4k", marks=pytest.mark.slow), "12k",
                                  pytest.param("40k", marks=pytest.mark.slow)])
def test_a_full_disk_is_exit_2_with_one_line_and_no_empty_folder(ckpt, size):
    """The disk fills at the lock file (4k), after some head files (12k) or at results.json (40k): exit 2, one line
    naming the cause, no empty folder left; every head file left is one the journal records."""
    p = full_disk(ckpt / "mnt", size, _audit(ckpt, "--defense", "none,float32", out="mnt/au"))
    if p is None:
        pytest.skip("no private tmpfs mount on this machine (unshare -Urm)")
    assert "rc=2" in p.stdout, p.stdout + p.stderr
    line = _one_line(p.stderr)
    assert "No space left on device" in line
    found = p.stdout.split("rc=2")[1].split()
    if "./au/finished.jsonl" not in found:
        assert found == ["."], found  # nothing written: not even an empty folder
    else:
        assert "rerun the same command" in line
        heads = sorted(f for f in found if f.startswith("./au/heads/"))
        assert heads, found


def test_the_same_weights_under_another_path_are_the_same_audit(ckpt, capsys, monkeypatch):
    """A byte-identical copy (another name, an absolute spelling) resumes the journal; a journal refusal names
    other weights only when their fingerprints differ."""
    from hostile import refused

    out = ckpt / "out"
    assert run(capsys, *_audit(ckpt, "--layers", "0"))[0] == 0
    before = snapshot(out / "heads")
    shutil.copy(ckpt / "m.safetensors", ckpt / "copy.safetensors")
    monkeypatch.chdir(ckpt)
    for source in ("copy.safetensors", "./m.safetensors"):
        args = _audit(ckpt, "--layers", "0")
        args[2] = source
        rc, stdout, err = run(capsys, *args)
        assert rc == 0 and "resumed 2 finished tasks" in stdout, err
        assert snapshot(out / "heads") == before
    other = ckpt / "other.safetensors"
    data = bytearray((ckpt / "m.safetensors").read_bytes())
    data[-1] ^= 1  # one bit of one weight
    other.write_bytes(bytes(data))
    args = _audit(ckpt, "--layers", "0")
    args[2] = str(other)
    line = refused(capsys, ckpt, *args, says="of other weights")
    shas = [w for w in line.replace(",", " ").replace(")", " ").split() if w.startswith("sha256:")]
    assert len(shas) == 2 and shas[0] != shas[1], line


@pytest.mark.parametrize("odd", ["fifo journal", "journal links out", "heads is a file", "heads links out",
                                 "results is a folder"])
def test_the_audits_own_names_taken_by_odd_files_are_refused_before_any_task(ckpt, capsys, odd):
    """A journal that is a symlink would have been appended to wherever it points (any file the user may write);
    a FIFO, a file named heads or a folder named results.json ended as a misleading "make room" or an internal
    error after the work was done."""
    from hostile import refused

    out = ckpt / "out"
    out.mkdir()
    decoy = ckpt / "decoy.txt"
    decoy.write_text("a file of the user's\n")
    make = {"fifo journal": lambda: os.mkfifo(out / "finished.jsonl"),
            "journal links out": lambda: (out / "finished.jsonl").symlink_to(decoy),
            "heads is a file": lambda: (out / "heads").write_text("x"),
            "heads links out": lambda: (out / "heads").symlink_to(ckpt, target_is_directory=True),
            "results is a folder": lambda: (out / "results.json").mkdir()}
    make[odd]()
    line = refused(capsys, ckpt, *_audit(ckpt, "--layers", "0"), says="move it away or give another --out folder")
    assert ("symlink" in line) == ("links out" in odd)
    assert decoy.read_text() == "a file of the user's\n"


def test_layer_ranges_and_heads_per_layer_are_refused_in_their_own_words(ckpt, capsys):
    from hostile import refused

    refused(capsys, ckpt, *_audit(ckpt, "--layers", "1-0"), says="--layers '1-0': the range 1-0 runs backwards")
    args = _audit(ckpt)
    args[args.index("--heads-per-layer") + 1] = "0"
    refused(capsys, ckpt, *args, says="--heads-per-layer must be at least 1; got 0")


def test_fresh_redoes_this_runs_tasks_and_keeps_the_rest(ckpt, capsys):
    out = ckpt / "out"
    assert run(capsys, *_audit(ckpt, "--layers", "0-1"))[0] == 0
    wide = snapshot(out / "heads")
    rc, stdout, err = run(capsys, *_audit(ckpt, "--layers", "0", "--fresh"))
    assert rc == 0 and "resumed" not in stdout, err
    assert snapshot(out / "heads") == wide  # layer 1 kept; layer 0 redone into its own files (same numbers)
    rc, stdout, _ = run(capsys, *_audit(ckpt, "--layers", "0-1"))
    assert rc == 0 and "resumed 4 finished tasks" in stdout
